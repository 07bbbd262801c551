// Package lease keeps the VMs vmgate creates (vm_create): each under a
// lease in the store with the quotas the policy named, deleted when the
// lease ends by the reaper of any replica, and whose each created VM is, so
// that another grant never sees it (owners.go). It imports neither the
// gate nor a transport; the gate asks it whether a VM is hidden, the VM
// tools create, find and delete through it.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
)

// The life of a VM vmgate creates (vm_create, vm_delete, the lease reaper).
//
// Before a VM is made, its lease is acquired in the store with the quotas
// the policy named: the store counts the leases that hold each quota and
// refuses a lease that would not fit, exactly, across replicas (store.Leases).
// The lease is "creating", held by the call until createHold has passed;
// once the driver's CreateVM returns (the guest agent answers) the lease is
// "live" and expires TTL later. vm_delete and the reaper take a lease by
// moving it to "deleting" (a compare-and-swap: one taker at a time), ask
// the driver to delete the VM that carries the lease's id as its mark, and
// release the lease, which gives its quota units back. A creation that
// failed deletes what the driver may have left and releases the lease.
//
// Nothing here lives only in memory: a server killed at any point leaves a
// lease in the store whose holding time or expiry passes, and the reaper of
// any replica, this one after a restart included, deletes the VM then.
//
// A Keeper is safe for concurrent use; every method's context bounds its
// driver and store calls.
type Keeper struct {
	store   store.Leases
	creator func(backend string) (hypervisor.Creator, bool)
	now     func() time.Time
	log     *slog.Logger
	// holder names this replica in the leases it takes ("reaper@<id>").
	holder string
	// createHold is how long a creating lease stays with its call; past it
	// the reaper deletes whatever the call made. It outlasts the call's
	// deadline. deleteHold is the same for a deleting lease.
	createHold, deleteHold time.Duration
	// every is how often the reaper runs; onEnd is Options.OnEnd.
	every time.Duration
	onEnd func(store.Lease)
	// onEnding is Options.OnEnding; warned holds, by lease id, the expiry
	// each lease was last warned of (guarded by mu, as a pass is).
	onEnding func(l store.Lease, left time.Duration)
	warned   map[string]time.Time

	// owners says whose each created VM is (owners.go); templates are
	// the config's, by name.
	owners    ownerIndex
	templates map[string]*config.Template

	// stop ends the reaper; done is closed when it has.
	stop context.CancelFunc
	done chan struct{}
	// mu serialises reaper passes (a pass and a test's explicit reap).
	mu sync.Mutex
}

// Lease timing defaults.
const (
	// CreateDeadline bounds vm_create: a TCG guest on a loaded machine
	// may take minutes to boot.
	CreateDeadline = 5 * time.Minute
	// DeleteDeadline bounds one deletion.
	DeleteDeadline = 2 * time.Minute
	// DefaultLeaseReapEvery is how often the lease reaper looks for leases
	// that ran out.
	DefaultLeaseReapEvery = 5 * time.Second
)

// ErrBusy: another call or replica is deleting the VM right now.
var ErrBusy = errors.New("the VM is being deleted already")

// CreateRequest is a VM to make under a new lease.
type CreateRequest struct {
	Backend, Name string // backend and backend-local name asked for
	Grant         string
	Template      string
	CallID        string
	Source        json.RawMessage
	MemoryMB      int64
	CPUs          int64
	TTL           time.Duration
	Quotas        []policy.Quota
}

// newLeaseID mints a lease id: random, unguessable, a valid mark.
func newLeaseID() string { return "L" + rand.Text() }

// Create acquires the lease, makes the VM and makes the lease live. A
// *store.QuotaError means a quota was full and nothing was made.
func (v *Keeper) Create(ctx context.Context, req CreateRequest) (store.Lease, error) {
	c, ok := v.creator(req.Backend)
	if !ok {
		return store.Lease{}, fmt.Errorf("server: create: %w: backend %s cannot make VMs", hypervisor.ErrNotSupported, req.Backend)
	}
	now := v.now()
	l := store.Lease{
		ID: newLeaseID(), Name: req.Backend + "/" + req.Name, Grant: req.Grant, Template: req.Template, CallID: req.CallID,
		MemoryMB: req.MemoryMB, CPUs: req.CPUs, TTL: req.TTL, Quotas: req.Quotas,
		Created: now, Until: now.Add(v.createHold), Holder: req.CallID,
	}
	l, err := store.ValidateLease(l) // as the store keeps it (revision 1)
	if err != nil {
		return store.Lease{}, fmt.Errorf("server: create: %w", err)
	}
	if err := v.store.AcquireLease(ctx, l); err != nil {
		return store.Lease{}, err
	}
	v.owners.put(l)
	made, err := c.CreateVM(ctx, hypervisor.CreateRequest{Name: req.Name, Source: req.Source, MemoryMB: req.MemoryMB, CPUs: req.CPUs, Mark: l.ID})
	if err != nil {
		return store.Lease{}, v.abandon(l.ID, req, err)
	}
	live := l
	live.State, live.VM, live.Holder = store.LeaseLive, req.Backend+"/"+made.Name, ""
	live.Until, live.Expires = time.Time{}, v.now().Add(req.TTL)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if live, err = v.store.UpdateLease(sctx, live); err != nil {
		// The VM runs without a live lease: delete it now rather than let
		// it run unaccounted until its holding time passes.
		return store.Lease{}, v.abandon(l.ID, req, fmt.Errorf("server: create: the VM was made but its lease could not be recorded: %w", err))
	}
	v.owners.put(live)
	return live, nil
}

// abandon undoes a creation that failed with cause: it deletes whatever
// the driver left under the lease's mark and releases the lease. When the
// deletion itself fails the lease stays, deleting, for the reaper.
func (v *Keeper) abandon(id string, req CreateRequest, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), DeleteDeadline)
	defer cancel()
	l, err := v.store.GetLease(ctx, id)
	if err != nil {
		v.log.Warn("server: create failed and its lease cannot be read; the reaper deletes the VM when the lease's hold ends", "lease", id, "err", err)
		return cause
	}
	if err := v.deleteLease(ctx, l, "abandon@"+req.CallID); err != nil {
		v.log.Warn("server: create failed and its VM could not be deleted yet; the reaper retries", "lease", id, "vm", l.Name, "err", err)
	}
	return cause
}

// Find returns the lease of the VM id vm (its VM, or its name while the
// backend has not named it). A VM the index of created VMs knows is read
// by its lease's id (one store read, whatever the number of leases); only
// one it does not know, or whose lease is not the one the index has,
// lists the leases.
func (v *Keeper) Find(ctx context.Context, vm string) (store.Lease, bool, error) {
	if o, known, _ := v.owners.get(vm); known {
		l, err := v.store.GetLease(ctx, o.lease)
		switch {
		case err == nil && names(l, vm):
			return l, true, nil
		case err != nil && !errors.Is(err, store.ErrUnknownLease):
			return store.Lease{}, false, err
		}
	}
	list, err := v.store.ListLeases(ctx)
	if err != nil {
		return store.Lease{}, false, err
	}
	for _, l := range list {
		if names(l, vm) {
			return l, true, nil
		}
	}
	return store.Lease{}, false, nil
}

// names reports whether lease l is the lease of the VM id vm.
func names(l store.Lease, vm string) bool {
	return l.VM == vm || (l.VM == "" && l.Name == vm)
}

// deleteLease takes lease l for deletion (by names the taker), deletes its
// VM and releases it. ErrBusy when another taker holds it. When the
// backend does not delete the VM, the lease stays deleting, held by by
// until deleteHold passes; then the reaper tries again (the reaper's and an
// abandoned creation's way: a retry every pass would hammer a backend that
// keeps refusing).
func (v *Keeper) deleteLease(ctx context.Context, l store.Lease, by string) error {
	return v.takeAndDelete(ctx, l, by, false)
}

// DeleteNow is vm_delete's deleteLease: when the backend does not delete
// the VM (Proxmox: "can't remove VM 100 - protection mode enabled"), the
// lease goes back to the state it was taken in (live, with its expiry),
// so that the next vm_delete, once the cause is fixed, tries again at
// once, and the reaper when the lease ends.
func (v *Keeper) DeleteNow(ctx context.Context, l store.Lease, by string) error {
	return v.takeAndDelete(ctx, l, by, true)
}

func (v *Keeper) takeAndDelete(ctx context.Context, l store.Lease, by string, giveBack bool) error {
	now := v.now()
	if l.State == store.LeaseDeleting && now.Before(l.Until) && l.Holder != by {
		return ErrBusy
	}
	take := l
	take.State, take.Until, take.Holder = store.LeaseDeleting, now.Add(v.deleteHold), by
	taken, err := v.store.UpdateLease(ctx, take)
	switch {
	case errors.Is(err, store.ErrStaleLease):
		return ErrBusy // changed under us: someone else took it
	case errors.Is(err, store.ErrUnknownLease):
		return nil // released meanwhile
	case err != nil:
		return fmt.Errorf("server: delete %s: take the lease: %w", l.Name, err)
	}
	v.owners.put(taken)
	c, ok := v.creator(backendOf(taken))
	if !ok {
		return fmt.Errorf("server: delete %s: %w: its backend cannot delete VMs any more (was the config changed?)", taken.Name, hypervisor.ErrNotSupported)
	}
	err = c.DeleteVM(ctx, hypervisor.DeleteRequest{Name: localName(taken), Mark: taken.ID})
	switch {
	case err == nil, errors.Is(err, hypervisor.ErrUnknownVM):
	case errors.Is(err, hypervisor.ErrNotCreated):
		// A VM by that name exists without this lease's mark: not ours,
		// never deleted. Ours is gone.
		v.log.Warn("server: the VM a lease names is not the one it created; releasing the lease only", "lease", taken.ID, "vm", taken.Name)
	default:
		if giveBack {
			v.giveBack(ctx, l, taken)
		}
		return fmt.Errorf("server: delete %s: %w", taken.Name, err)
	}
	if err := v.store.ReleaseLease(ctx, taken.ID); err != nil && !errors.Is(err, store.ErrUnknownLease) {
		return fmt.Errorf("server: delete %s: the VM is gone but its lease could not be released: %w", taken.Name, err)
	}
	v.owners.drop(taken)
	return nil
}

// giveBack returns the lease taken (from was its state before) to that
// state after a deletion that did not happen. Failing that (the store does
// not answer, another replica took it), the lease stays deleting until its
// hold passes, and is logged.
func (v *Keeper) giveBack(ctx context.Context, from, taken store.Lease) {
	back := from
	back.Rev = taken.Rev
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	back, err := v.store.UpdateLease(sctx, back)
	if err != nil {
		v.log.Warn("server: a VM was not deleted and its lease could not be given back; it can be deleted again once its hold ends",
			"lease", taken.ID, "vm", taken.Name, "until", taken.Until, "err", err)
		return
	}
	v.owners.put(back)
}

// backendOf is the backend of lease l's VM.
func backendOf(l store.Lease) string {
	b, _, _ := strings.Cut(l.Name, "/")
	return b
}

// localName is the backend-local name of l's VM: the one the backend gave,
// else the one asked for.
func localName(l store.Lease) string {
	id := l.VM
	if id == "" {
		id = l.Name
	}
	_, name, _ := strings.Cut(id, "/")
	return name
}

// Report says what one reaper pass did.
type Report struct {
	Deleted []string // VM names whose lease ran out and were deleted
	Errors  []error
}

// reapPerBackend bounds the deletions one reaper pass runs at once on one
// backend: a thousand leases that end together are deleted in a fraction
// of the time one by one would take (each may take up to DeleteDeadline),
// without a thousand concurrent deletions on one hypervisor.
const reapPerBackend = 8

// Reap deletes the VM of every lease that is due: live past its expiry,
// or creating or deleting past its holder's time; up to reapPerBackend at
// once on each backend, each taken (a compare-and-swap on the lease)
// before its VM is deleted, so another replica's reaper never deletes the
// same VM.
func (v *Keeper) Reap(ctx context.Context) Report {
	v.mu.Lock()
	defer v.mu.Unlock()
	var rep Report
	since := v.owners.mark()
	list, err := v.store.ListLeases(ctx)
	if err != nil && ctx.Err() != nil {
		return rep // stopped
	}
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("server: lease reaper: %w", err))
		v.log.Warn("server: lease reaper: list leases", "err", err)
		return rep
	}
	v.owners.reset(list, since)
	now := v.now()
	v.warnEnding(list, now)
	due := map[string][]store.Lease{}
	for _, l := range list {
		if l.Due(now) {
			due[backendOf(l)] = append(due[backendOf(l)], l)
		}
	}
	var mu sync.Mutex // guards rep
	var wg sync.WaitGroup
	for _, leases := range due {
		next := make(chan store.Lease, len(leases))
		for _, l := range leases {
			next <- l
		}
		close(next)
		for range min(reapPerBackend, len(leases)) {
			wg.Go(func() {
				for l := range next {
					v.reapOne(ctx, l, &rep, &mu)
				}
			})
		}
	}
	wg.Wait()
	slices.Sort(rep.Deleted)
	return rep
}

// warnEnding tells onEnding of each live lease in list whose expiry is
// within EndingWarning of now and that it has not told of for that expiry;
// it forgets the leases no longer listed. v.mu is held.
func (v *Keeper) warnEnding(list []store.Lease, now time.Time) {
	if v.onEnding == nil {
		return
	}
	listed := make(map[string]bool, len(list))
	for _, l := range list {
		listed[l.ID] = true
		left := l.Expires.Sub(now)
		if l.State != store.LeaseLive || l.Expires.IsZero() || left <= 0 || left > max(EndingWarning(l), v.every) {
			continue
		}
		if at, ok := v.warned[l.ID]; ok && at.Equal(l.Expires) {
			continue
		}
		v.warned[l.ID] = l.Expires
		v.onEnding(l, left)
	}
	for id := range v.warned {
		if !listed[id] {
			delete(v.warned, id)
		}
	}
}

// reapOne deletes due lease l's VM and notes what happened in rep (mu
// held for it).
func (v *Keeper) reapOne(ctx context.Context, l store.Lease, rep *Report, mu *sync.Mutex) {
	dctx, cancel := context.WithTimeout(ctx, DeleteDeadline)
	err := v.deleteLease(dctx, l, v.holder)
	cancel()
	mu.Lock()
	defer mu.Unlock()
	switch {
	case err == nil:
		rep.Deleted = append(rep.Deleted, l.Name)
		v.log.Info("server: deleted a VM whose lease ended", "vm", l.Name, "lease", l.ID, "grant", l.Grant, "state", l.State)
		if v.onEnd != nil {
			v.onEnd(l)
		}
	case errors.Is(err, ErrBusy):
	default:
		rep.Errors = append(rep.Errors, err)
		v.log.Warn("server: lease reaper", "vm", l.Name, "lease", l.ID, "err", err)
	}
}

// start runs the reaper until close: a pass at once (leases that ran out
// while no server ran) and then every v.every.
func (v *Keeper) start() {
	ctx, cancel := context.WithCancel(context.Background())
	v.stop, v.done = cancel, make(chan struct{})
	go func() {
		defer close(v.done)
		t := time.NewTicker(v.every)
		defer t.Stop()
		for {
			v.Reap(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Close stops the reaper and waits for its pass in flight.
func (v *Keeper) Close() {
	if v.stop != nil {
		v.stop()
		<-v.done
	}
}

// Options configure New.
type Options struct {
	// Store keeps the leases; required.
	Store store.Leases
	// Creator returns backend's driver as a hypervisor.Creator.
	Creator func(backend string) (hypervisor.Creator, bool)
	// Templates are the config's templates by name (owners.go: which
	// backends make VMs, and which VMs are shared).
	Templates map[string]*config.Template
	Now       func() time.Time
	Log       *slog.Logger
	// Every is how often the reaper runs (default DefaultLeaseReapEvery).
	Every time.Duration
	// OnEnd, when set, is told of every lease the reaper ended, after its
	// VM was deleted (the server tells the lease's grant). It runs on the
	// reaper's goroutine and must not block.
	OnEnd func(store.Lease)
	// OnEnding, when set, is told once of every live lease whose expiry is
	// within EndingWarning of now (or one reaper pass, when that is
	// longer, so that a short lease is not passed over), with the time left (again if the
	// expiry moves); a server restarted tells its sessions again. It runs
	// on the reaper's goroutine and must not block.
	OnEnding func(l store.Lease, left time.Duration)
}

// EndingWarning is how long before a live lease's expiry OnEnding hears
// of it: a fifth of its length, at most five minutes.
func EndingWarning(l store.Lease) time.Duration {
	if l.TTL <= 0 {
		return 5 * time.Minute
	}
	return min(5*time.Minute, l.TTL/5)
}

// New makes a Keeper, reads whose the created VMs are and starts the
// reaper; Close stops it.
func New(o Options) *Keeper {
	if o.Every <= 0 {
		o.Every = DefaultLeaseReapEvery
	}
	v := &Keeper{
		store: o.Store, creator: o.Creator, templates: o.Templates,
		now: o.Now, log: o.Log,
		holder:     "reaper@" + rand.Text()[:10],
		createHold: CreateDeadline + time.Minute,
		deleteHold: DeleteDeadline + time.Minute,
		every:      o.Every,
		onEnd:      o.OnEnd,
		onEnding:   o.OnEnding,
		warned:     map[string]time.Time{},
	}
	// Whose the created VMs are is known before the first call: without
	// it, every VM of a backend that makes VMs is refused (owners.go)
	// until a reaper pass reads the leases.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if list, err := o.Store.ListLeases(ctx); err != nil {
		v.log.Warn("server: the lease store does not answer: VMs of backends that make VMs are refused until it does", "err", err)
	} else {
		v.owners.reset(list, v.owners.mark())
	}
	v.start()
	return v
}
