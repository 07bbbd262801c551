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

// vmOwner is whose a created VM is.
type vmOwner struct {
	grant, template string
	gen             uint64 // when put, in ownerIndex.gen
}

// ownerIndex is the created VMs by id. The zero value knows nothing and
// says so (loaded false). mu guards everything.
type ownerIndex struct {
	mu     sync.Mutex
	byID   map[string]vmOwner
	gen    uint64 // counts puts
	loaded bool   // reset has run: an id not in byID is no created VM
}

// ids are the ids a lease's VM may be called by.
func leaseIDs(l store.Lease) []string {
	if l.VM != "" && l.VM != l.Name {
		return []string{l.Name, l.VM}
	}
	return []string{l.Name}
}

// put records lease l.
func (x *ownerIndex) put(l store.Lease) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byID == nil {
		x.byID = map[string]vmOwner{}
	}
	x.gen++
	for _, id := range leaseIDs(l) {
		x.byID[id] = vmOwner{grant: l.Grant, template: l.Template, gen: x.gen}
	}
}

// drop forgets lease l (released: its VM is gone).
func (x *ownerIndex) drop(l store.Lease) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, id := range leaseIDs(l) {
		delete(x.byID, id)
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
	next := make(map[string]vmOwner, len(list))
	for id, o := range x.byID {
		if o.gen > since {
			next[id] = o
		}
	}
	for _, l := range list {
		for _, id := range leaseIDs(l) {
			if _, newer := next[id]; !newer {
				next[id] = vmOwner{grant: l.Grant, template: l.Template}
			}
		}
	}
	x.byID, x.loaded = next, true
}

// get returns whose the VM id is: known says it is a created VM; loaded
// false means the index cannot tell (the store has not answered yet).
func (x *ownerIndex) get(id string) (o vmOwner, known, loaded bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	o, known = x.byID[id]
	return o, known, x.loaded
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

// ByVM maps the ids of the VMs vmgate created to their lease; nil for a
// nil Keeper. An error is the store's.
func (v *Keeper) ByVM(ctx context.Context) (map[string]Info, error) {
	if v == nil {
		return nil, nil
	}
	list, err := v.store.ListLeases(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Info, len(list))
	for _, l := range list {
		id := l.VM
		if id == "" {
			id = l.Name
		}
		li := Info{CreatedBy: l.Grant, Template: l.Template, Lease: string(l.State)}
		if !l.Expires.IsZero() {
			li.LeaseEnds = l.Expires.UTC().Format(time.RFC3339)
		}
		out[id] = li
	}
	return out, nil
}

// Listed says whether list_vms shows grant (whose vms globs cover the VM)
// the VM id of backend, and its lease when vm_create made it: unless
// another grant created it. leases is ByVM's answer; when it gave none
// (leaseErr), the index of created VMs decides, and a VM it cannot tell
// about is left out.
func (v *Keeper) Listed(grant, backend, id string, leases map[string]Info, leaseErr error) (*Info, bool) {
	if leaseErr != nil {
		o, known, loaded := v.owners.get(id)
		switch {
		case known:
			return nil, v.sees(grant, o.grant, o.template)
		case !loaded:
			return nil, !v.makesVMs(backend, "")
		}
		return nil, !v.makesVMs(backend, id[len(backend)+1:])
	}
	li, ok := leases[id]
	if !ok {
		return nil, true
	}
	return &li, v.sees(grant, li.CreatedBy, li.Template)
}
