// Package vmpage pages list_vms over a fleet: it gathers the VM lists of
// several backends (Gather: concurrently, without copying a list the
// driver keeps) and answers one page of their merged list (Paginate):
// sorted by VM id, filtered by name glob, power state and backend, with
// the number of VMs that match and an opaque cursor for the next page.
//
// The drivers list everything (no backend pages: QMP, libvirt, VBoxManage
// and Proxmox's /cluster/resources all answer with every VM), so paging
// happens above them, over the lists the plugin host's state cache keeps
// for a second. Paginate is a single pass over the lists that keeps the
// page's VMs in a bounded heap: its time is linear in the fleet, its
// allocations are a handful whatever the fleet's size (the ids of every
// VM are built in one buffer), and it never copies a list.
//
// A cursor is the id of the last VM of the previous page: the next page
// starts after it in id order, so it stays right while VMs come and go
// between calls (a VM created before the cursor's position is not shown on
// later pages, one deleted is simply absent; no VM is shown twice). It is
// opaque to clients; ParseCursor refuses one that vmpage did not make.
//
// Everything here is safe for concurrent use; lists are only read.
package vmpage

import (
	"context"
	"encoding/base64"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/vmgate/vmgate/hypervisor"
)

// Bounds of a Query.
const (
	// MaxLimit is the largest page.
	MaxLimit = 1000
	// maxGlob bounds a name glob, in bytes.
	maxGlob = 256
	// maxID bounds the id a cursor may carry: a backend name (32) and
	// a VM name (the server's maximum is 255 bytes), with some room.
	maxID = 512
)

// cursorPrefix starts every cursor: its version.
const cursorPrefix = "c1."

// ErrInvalid marks a Query refused before any work: a bad limit, cursor,
// glob, state or backend. It wraps hypervisor.ErrInvalidArgument, so the
// server answers [INVALID ARGUMENT].
var ErrInvalid = fmt.Errorf("%w: list query", hypervisor.ErrInvalidArgument)

// Query is one list_vms page request.
type Query struct {
	// Limit is the page size, 1 to MaxLimit; 0 means no limit: every
	// match in one page (list_vms as it was before paging).
	Limit int
	// Cursor is the previous page's Next; empty for the first page.
	Cursor string
	// Name, when set, is a glob (path.Match syntax, as the policy's glob:
	// `*` and `?` match within one /-separated name; "**" is refused)
	// matched against the VM's id ("lab/web-*") when it holds a '/', else
	// against the VM's name within its backend ("web-*").
	Name string
	// State, when set, keeps only VMs in that power state (running,
	// paused, stopped or unknown).
	State hypervisor.State
	// Backend, when set, keeps only that backend's VMs; it must be one
	// of the listed backends.
	Backend string
	// Keep, when set, is asked about each VM that passed the filters
	// above, with its id: the server's visibility rules (a grant's vms
	// globs, created VMs of other grants). A VM it refuses is not counted.
	Keep func(id string, backend string, vm hypervisor.VM) bool
}

// Listing is one backend's answer to ListVMs; VMs are only read.
type Listing struct {
	Backend string
	VMs     []hypervisor.VM
	// Err is why the backend gave no list; its VMs are then left out.
	Err error
}

// Entry is one VM of a page.
type Entry struct {
	ID      string // "<backend>/<name>"
	Backend string
	VM      hypervisor.VM
}

// Page is one page of the merged list.
type Page struct {
	// Entries are the page's VMs, sorted by ID.
	Entries []Entry
	// Total is how many VMs match the query's filters, on every page.
	Total int
	// Next is the cursor of the next page; empty on the last one.
	Next string
}

// validStates are the states a Query may filter on.
var validStates = []hypervisor.State{hypervisor.StateRunning, hypervisor.StatePaused, hypervisor.StateStopped, hypervisor.StateUnknown}

// Check validates q against the backends lists names and returns the id
// its cursor carries ("" for none). Errors wrap ErrInvalid and say what to
// send instead.
func (q *Query) Check(lists []Listing) (after string, err error) {
	if q.Limit < 0 || q.Limit > MaxLimit {
		return "", fmt.Errorf("%w: limit %d: want 1 to %d (or leave it out)", ErrInvalid, q.Limit, MaxLimit)
	}
	if err := CheckGlob(q.Name); err != nil {
		return "", err
	}
	if q.State != "" && !slices.Contains(validStates, q.State) {
		return "", fmt.Errorf("%w: state %q: want running, paused, stopped or unknown", ErrInvalid, q.State)
	}
	if q.Backend != "" && !slices.ContainsFunc(lists, func(l Listing) bool { return l.Backend == q.Backend }) {
		names := make([]string, len(lists))
		for i, l := range lists {
			names[i] = l.Backend
		}
		return "", fmt.Errorf("%w: backend %q: there is no such backend (there are: %s)", ErrInvalid, q.Backend, strings.Join(names, ", "))
	}
	return ParseCursor(q.Cursor)
}

// CheckGlob refuses a name glob that is too long, malformed or uses "**".
func CheckGlob(glob string) error {
	switch {
	case len(glob) > maxGlob:
		return fmt.Errorf("%w: name glob of %d bytes: at most %d", ErrInvalid, len(glob), maxGlob)
	case strings.Contains(glob, "**"):
		return fmt.Errorf("%w: name glob %q: \"**\" is not supported (\"*\" matches within one /-separated name)", ErrInvalid, glob)
	}
	// path.Match checks the whole pattern, even the parts a given name
	// does not reach.
	if _, err := path.Match(glob, ""); err != nil {
		return fmt.Errorf("%w: name glob %q: %w", ErrInvalid, glob, err)
	}
	return nil
}

// Cursor is the opaque cursor of the page that starts after the VM id.
func Cursor(id string) string {
	return cursorPrefix + base64.RawURLEncoding.EncodeToString([]byte(id))
}

// ParseCursor returns the VM id a cursor made by Cursor carries; "" for
// an empty cursor.
func ParseCursor(c string) (string, error) {
	if c == "" {
		return "", nil
	}
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("%w: cursor %q: %s; pass the next_cursor of the previous page as it was, or none for the first page",
			ErrInvalid, truncate(c, 64), why)
	}
	enc, ok := strings.CutPrefix(c, cursorPrefix)
	if !ok {
		return bad("not a cursor of this server")
	}
	if base64.RawURLEncoding.DecodedLen(len(enc)) > maxID {
		return bad("too long")
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return bad("damaged")
	}
	id := string(b)
	if i := strings.IndexByte(id, '/'); i <= 0 || i == len(id)-1 {
		return bad("it does not name a VM")
	}
	return id, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Paginate answers q over lists: the first q.Limit VMs, by id, after the
// cursor among those that match, the number that match and the next
// cursor. Lists with an Err are left out. It fails (wrapping ErrInvalid)
// only when q does not pass Check.
func Paginate(lists []Listing, q Query) (Page, error) {
	after, err := q.Check(lists)
	if err != nil {
		return Page{}, err
	}
	h := &pageHeap{ids: joinIDs(lists), limit: q.Limit}
	if q.Limit > 0 {
		h.c = make([]candidate, 0, q.Limit)
	}
	var total, beyond, off int // matches; matches after the cursor; offset in h.ids
	for li, l := range lists {
		if l.Err != nil {
			continue
		}
		for vi := range l.VMs {
			vm := &l.VMs[vi]
			c := candidate{off: int32(off), n: int32(len(l.Backend) + 1 + len(vm.Name)), list: int32(li), vm: int32(vi)}
			off += int(c.n)
			id := h.id(c)
			if !q.match(l.Backend, id, vm) {
				continue
			}
			total++
			if id <= after {
				continue
			}
			beyond++
			h.offer(c)
		}
	}
	page := Page{Total: total, Entries: make([]Entry, 0, len(h.c))}
	h.sort()
	for _, c := range h.c {
		l := &lists[c.list]
		page.Entries = append(page.Entries, Entry{ID: h.id(c), Backend: l.Backend, VM: l.VMs[c.vm]})
	}
	if beyond > len(page.Entries) && len(page.Entries) > 0 {
		page.Next = Cursor(page.Entries[len(page.Entries)-1].ID)
	}
	return page, nil
}

// match applies q's filters and Keep to the VM id of backend.
func (q *Query) match(backend, id string, vm *hypervisor.VM) bool {
	if q.Backend != "" && backend != q.Backend || q.State != "" && vm.State != q.State {
		return false
	}
	if q.Name != "" {
		subject := vm.Name
		if strings.IndexByte(q.Name, '/') >= 0 {
			subject = id
		}
		if ok, _ := path.Match(q.Name, subject); !ok {
			return false
		}
	}
	return q.Keep == nil || q.Keep(id, backend, *vm)
}

// joinIDs returns every listed VM's id ("backend/name"), in list order,
// concatenated into one string (one allocation): Paginate slices it.
func joinIDs(lists []Listing) string {
	n := 0
	for _, l := range lists {
		if l.Err != nil {
			continue
		}
		for i := range l.VMs {
			n += len(l.Backend) + 1 + len(l.VMs[i].Name)
		}
	}
	var b strings.Builder
	b.Grow(n)
	for _, l := range lists {
		if l.Err != nil {
			continue
		}
		for i := range l.VMs {
			b.WriteString(l.Backend)
			b.WriteByte('/')
			b.WriteString(l.VMs[i].Name)
		}
	}
	return b.String()
}

// candidate is a VM that may be on the page: where its id is in the
// ids' buffer and where the VM is in the lists. It holds no pointer, so
// the heap's moves cost no write barrier and the collector skips it.
type candidate struct {
	off, n   int32
	list, vm int32
}

// pageHeap keeps the limit smallest candidates offered, by id, as a
// max-heap (the largest kept at c[0], first to go); limit 0 keeps all.
type pageHeap struct {
	ids   string // every listed VM's id, concatenated (joinIDs)
	limit int
	c     []candidate
}

func (h *pageHeap) id(c candidate) string { return h.ids[c.off : c.off+c.n] }

// offer keeps x if it is among the limit smallest so far.
func (h *pageHeap) offer(x candidate) {
	if h.limit == 0 {
		h.c = append(h.c, x)
		return
	}
	if len(h.c) < h.limit {
		h.c = append(h.c, x)
		h.up(len(h.c) - 1)
		return
	}
	if h.id(x) >= h.id(h.c[0]) {
		return
	}
	h.c[0] = x
	h.down(0)
}

func (h *pageHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h.id(h.c[p]) >= h.id(h.c[i]) {
			return
		}
		h.c[p], h.c[i] = h.c[i], h.c[p]
		i = p
	}
}

func (h *pageHeap) down(i int) {
	n := len(h.c)
	for {
		l, big := 2*i+1, i
		if l < n && h.id(h.c[l]) > h.id(h.c[big]) {
			big = l
		}
		if r := l + 1; r < n && h.id(h.c[r]) > h.id(h.c[big]) {
			big = r
		}
		if big == i {
			return
		}
		h.c[i], h.c[big] = h.c[big], h.c[i]
		i = big
	}
}

// sort orders the kept candidates by id, ascending.
func (h *pageHeap) sort() {
	slices.SortFunc(h.c, func(a, b candidate) int { return strings.Compare(h.id(a), h.id(b)) })
}

// Backend is a backend to list.
type Backend struct {
	Name   string
	Driver hypervisor.Driver
}

// SharedLister is an optional capability of a driver that keeps its
// ListVMs answer (the plugin host's Supervisor and its state cache):
// ListVMsShared returns the kept list itself, not a copy. The caller must
// not change the slice or its elements.
type SharedLister interface {
	ListVMsShared(ctx context.Context) ([]hypervisor.VM, error)
}

// List lists d's VMs: without a copy when d is a SharedLister (the result
// is then read-only), else through ListVMs.
func List(ctx context.Context, d hypervisor.Driver) ([]hypervisor.VM, error) {
	if s, ok := d.(SharedLister); ok {
		return s.ListVMsShared(ctx)
	}
	return d.ListVMs(ctx)
}

// Gather lists every backend, concurrently when there are several (a
// backend that must ask its plugin does not wait for another's), and
// returns their listings in the order of backends. The VMs of a listing
// are read-only (see List).
func Gather(ctx context.Context, backends []Backend) []Listing {
	out := make([]Listing, len(backends))
	if len(backends) == 1 {
		vms, err := List(ctx, backends[0].Driver)
		out[0] = Listing{Backend: backends[0].Name, VMs: vms, Err: err}
		return out
	}
	var wg sync.WaitGroup
	for i, b := range backends {
		wg.Go(func() {
			vms, err := List(ctx, b.Driver)
			out[i] = Listing{Backend: b.Name, VMs: vms, Err: err}
		})
	}
	wg.Wait()
	return out
}
