package lease

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/policy/store"
)

// Who sees a created VM. A VM vm_create made exists only for the grant
// that made it (and for operators, who make no tool calls): to every other
// grant it is "unknown VM" on every tool and absent from list_vms, as a VM
// outside its vms globs is, unless its template says shared: true (then
// every grant whose globs cover it sees it; only its creator may delete it
// either way).
//
// The gate asks on every call that names a VM, so the answer must not cost
// a store read (a bbolt read of the leases costs tens of µs): an index in
// memory maps each created VM's id (and, until the backend has named the
// VM, the name it was asked for) to its lease's grant and template. This
// server keeps it exact for the leases it changes itself (create, delete,
// the reaper: every lease when the store is its own, bolt or memory), and
// rebuilds it from the store at start and at every reaper pass
// (DefaultLeaseReapEvery), which brings in what other replicas did. A VM
// named like a template's VMs that the index does not know is looked up in
// the store at once, so a VM another replica has just made under such a
// name is never shown to the wrong grant; only a VM another replica made
// under a name the backend chose itself (Proxmox numbers them) can be seen
// by another grant of this replica until the next reaper pass.

// vmOwner is whose a created VM is, and its lease as this server last
// saw it (list_vms shows the lease's state and end; vm_delete and Hidden
// read the lease itself by its id).
type vmOwner struct {
	grant, template string
	lease           string // the lease's id
	state           store.LeaseState
	expires         time.Time
	gen             uint64 // when put, in ownerIndex.gen
}

// ownerOf is lease l's entry.
func ownerOf(l store.Lease, gen uint64) vmOwner {
	return vmOwner{grant: l.Grant, template: l.Template, lease: l.ID, state: l.State, expires: l.Expires, gen: gen}
}

// info is what list_vms shows of o.
func (o vmOwner) info() Info {
	li := Info{CreatedBy: o.grant, Template: o.template, Lease: string(o.state)}
	if !o.expires.IsZero() {
		li.LeaseEnds = o.expires.UTC().Format(time.RFC3339)
	}
	return li
}

// ownerIndex is the created VMs by id. The zero value knows nothing and
// says so (loaded false). mu guards everything; readers (every gated call
// on a VM, list_vms for each VM it lists) share it.
type ownerIndex struct {
	mu   sync.RWMutex
	byID map[string]vmOwner
	// perBackend counts byID's ids by backend, so that list_vms asks
	// about no VM of a backend without created VMs.
	perBackend map[string]int
	gen        uint64 // counts puts
	loaded     bool   // reset has run: an id not in byID is no created VM
}

// ids are the ids a lease's VM may be called by.
func leaseIDs(l store.Lease) []string {
	if l.VM != "" && l.VM != l.Name {
		return []string{l.Name, l.VM}
	}
	return []string{l.Name}
}

// idBackend is the backend part of a VM id.
func idBackend(id string) string {
	b, _, _ := strings.Cut(id, "/")
	return b
}

// set and del change byID and perBackend together; mu is held.
func (x *ownerIndex) set(id string, o vmOwner) {
	if x.byID == nil {
		x.byID, x.perBackend = map[string]vmOwner{}, map[string]int{}
	}
	if _, ok := x.byID[id]; !ok {
		x.perBackend[idBackend(id)]++
	}
	x.byID[id] = o
}

func (x *ownerIndex) del(id string) {
	if _, ok := x.byID[id]; !ok {
		return
	}
	delete(x.byID, id)
	b := idBackend(id)
	if x.perBackend[b]--; x.perBackend[b] <= 0 {
		delete(x.perBackend, b)
	}
}

// put records lease l (made, or changed by this server).
func (x *ownerIndex) put(l store.Lease) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.gen++
	for _, id := range leaseIDs(l) {
		x.set(id, ownerOf(l, x.gen))
	}
}

// drop forgets lease l (released: its VM is gone).
func (x *ownerIndex) drop(l store.Lease) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, id := range leaseIDs(l) {
		if o, ok := x.byID[id]; ok && o.lease == l.ID {
			x.del(id)
		}
	}
}

// mark is the point a listing of the leases starts from, for reset.
func (x *ownerIndex) mark() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.gen
}

// reset replaces the index with list, the store's leases as listed after
// since (mark): what was put after since stays, as the listing may have
// missed it.
func (x *ownerIndex) reset(list []store.Lease, since uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.byID
	x.byID, x.perBackend = make(map[string]vmOwner, len(list)), make(map[string]int)
	for id, o := range old {
		if o.gen > since {
			x.set(id, o)
		}
	}
	for _, l := range list {
		for _, id := range leaseIDs(l) {
			if _, newer := x.byID[id]; !newer {
				x.set(id, ownerOf(l, 0))
			}
		}
	}
	x.loaded = true
}

// get returns whose the VM id is: known says it is a created VM; loaded
// false means the index cannot tell (the store has not answered yet).
func (x *ownerIndex) get(id string) (o vmOwner, known, loaded bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	o, known = x.byID[id]
	return o, known, x.loaded
}

// backendsWithVMs returns the backends of which the index knows a created
// VM, and whether it is loaded.
func (x *ownerIndex) backendsWithVMs() (map[string]bool, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make(map[string]bool, len(x.perBackend))
	for b := range x.perBackend {
		out[b] = true
	}
	return out, x.loaded
}

// errOwnerUnknown: the lease store has not answered, so whether a VM is
// another grant's cannot be told.
var errOwnerUnknown = errors.New("the lease store does not answer, so vmgate cannot tell whether this VM is another grant's; retry")

// sees reports whether grant sees a VM created from template by owner.
func (v *Keeper) sees(grant, owner, template string) bool {
	if owner == grant {
		return true
	}
	t, ok := v.templates[template]
	return ok && t.Shared
}

// Hidden reports whether the VM id on backend is a created VM that grant
// must not see. It reads the store only for an id the index does not know
// that is named like the VMs of one of the backend's templates. A nil
// Keeper (no lease store) hides nothing.
func (v *Keeper) Hidden(ctx context.Context, grant, id, backend string) (bool, error) {
	if v == nil {
		return false, nil
	}
	o, known, loaded := v.owners.get(id)
	switch {
	case known:
		return !v.sees(grant, o.grant, o.template), nil
	case !loaded && v.makesVMs(backend, ""):
		return true, errOwnerUnknown
	case !v.makesVMs(backend, id[len(backend)+1:]):
		return false, nil
	}
	l, ok, err := v.Find(ctx, id)
	if err != nil {
		return true, errOwnerUnknown
	}
	return ok && !v.sees(grant, l.Grant, l.Template), nil
}

// makesVMs reports whether one of backend's templates makes VMs, named
// like name when name is not "".
func (v *Keeper) makesVMs(backend, name string) bool {
	for _, t := range v.templates {
		if t.Backend == backend && (name == "" || strings.HasPrefix(name, t.Prefix())) {
			return true
		}
	}
	return false
}

// Info is what list_vms shows of a created VM.
type Info struct {
	CreatedBy string `json:"created_by"`
	Template  string `json:"template"`
	LeaseEnds string `json:"lease_ends,omitempty"`
	Lease     string `json:"lease_state"`
}

// View is one list_vms's view of the created VMs, for one grant: whether
// it shows each VM (Shows, asked for every VM of the fleet that passes the
// page's filters) and the lease of those on the page (Info). It reads the
// index of created VMs, never the store, once the index is loaded: a VM
// this server made or deleted is shown as it is, one another replica
// changed as the last reaper pass found it (DefaultLeaseReapEvery), except
// that a VM named like a template's VMs that the index does not know is
// looked up in the store (once per View, for all of them), as Hidden does.
// Until the index is loaded, the store's leases are read once. A View is
// used by one goroutine.
type View struct {
	v     *Keeper
	grant string
	ctx   context.Context
	// busy are the backends with created VMs or templates: a VM of
	// another backend is shown without a lookup.
	busy map[string]bool
	// leases are the store's, by VM id, when the index was not loaded
	// or an unknown VM named like a template's made View read them.
	leases map[string]store.Lease
	// Err is the store's when it was needed and did not answer; VMs of
	// backends that make VMs whose owner cannot be told are left out.
	Err error
}

// View returns grant's view of the created VMs for one listing; a nil
// Keeper's shows everything and marks nothing.
func (v *Keeper) View(ctx context.Context, grant string) *View {
	if v == nil {
		return nil
	}
	w := &View{v: v, grant: grant, ctx: ctx}
	busy, loaded := v.owners.backendsWithVMs()
	for _, t := range v.templates {
		busy[t.Backend] = true
	}
	w.busy = busy
	if !loaded {
		w.readStore()
	}
	return w
}

// readStore reads the store's leases into w.leases, or w.Err.
func (w *View) readStore() {
	list, err := w.v.store.ListLeases(w.ctx)
	if err != nil {
		w.Err, w.leases = err, nil
		return
	}
	w.leases = make(map[string]store.Lease, len(list))
	for _, l := range list {
		for _, id := range leaseIDs(l) {
			if _, ok := w.leases[id]; !ok {
				w.leases[id] = l
			}
		}
	}
}

// Shows says whether list_vms shows the grant (whose vms globs cover it)
// the VM id of backend: unless another grant created it and its template
// is not shared.
func (w *View) Shows(backend, id string) bool {
	if w == nil || !w.busy[backend] {
		return true
	}
	v := w.v
	if w.leases != nil {
		l, ok := w.leases[id]
		return !ok || v.sees(w.grant, l.Grant, l.Template)
	}
	if w.Err != nil {
		// The store did not answer: the index decides, and a VM it
		// cannot tell about is left out.
		if o, known, _ := v.owners.get(id); known {
			return v.sees(w.grant, o.grant, o.template)
		}
		return !v.makesVMs(backend, "")
	}
	o, known, _ := v.owners.get(id)
	switch {
	case known:
		return v.sees(w.grant, o.grant, o.template)
	case !v.makesVMs(backend, id[len(backend)+1:]):
		return true
	}
	// Named like a template's VMs and unknown here: another replica may
	// have just made it.
	if w.readStore(); w.Err != nil {
		return false
	}
	return w.Shows(backend, id)
}

// Info is the lease of the VM id when vmgate created it, else nil.
func (w *View) Info(id string) *Info {
	if w == nil {
		return nil
	}
	if w.leases != nil {
		l, ok := w.leases[id]
		if !ok {
			return nil
		}
		li := ownerOf(l, 0).info()
		return &li
	}
	if o, known, _ := w.v.owners.get(id); known {
		li := o.info()
		return &li
	}
	return nil
}
