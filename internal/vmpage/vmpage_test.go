package vmpage

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest/fleet"
)

func vm(name string, st hypervisor.State) hypervisor.VM {
	return hypervisor.VM{Name: name, State: st, Info: "test"}
}

// fixture: "lab-x/a" sorts before "lab/…" ('-' < '/'), a backend that
// failed is left out.
func fixture() []Listing {
	const run, stop, pause = hypervisor.StateRunning, hypervisor.StateStopped, hypervisor.StatePaused
	return []Listing{
		{Backend: "lab", VMs: []hypervisor.VM{vm("web-2", pause), vm("vm1", run), vm("web-1", run), vm("vm2", stop)}},
		{Backend: "pve", VMs: []hypervisor.VM{vm("102", stop), vm("101", run)}},
		{Backend: "dead", Err: errors.New("no answer")},
		{Backend: "lab-x", VMs: []hypervisor.VM{vm("a", run)}},
	}
}

func ids(p Page) []string {
	out := []string{}
	for _, e := range p.Entries {
		out = append(out, e.ID)
	}
	return out
}

func TestPaginate(t *testing.T) {
	all := []string{"lab-x/a", "lab/vm1", "lab/vm2", "lab/web-1", "lab/web-2", "pve/101", "pve/102"}
	for _, tt := range []struct {
		name  string
		q     Query
		want  []string
		total int
		next  string // the id the next cursor carries; "" for none
	}{
		{"everything", Query{}, all, 7, ""},
		{"first page", Query{Limit: 3}, all[:3], 7, "lab/vm2"},
		{"second page", Query{Limit: 3, Cursor: Cursor("lab/vm2")}, all[3:6], 7, "pve/101"},
		{"last page", Query{Limit: 3, Cursor: Cursor("pve/101")}, all[6:], 7, ""},
		{"last page exactly full", Query{Limit: 1, Cursor: Cursor("pve/101")}, all[6:], 7, ""},
		{"page as large as the rest", Query{Limit: 7}, all, 7, ""},
		{"cursor of a VM gone since", Query{Limit: 2, Cursor: Cursor("lab/vm15")}, []string{"lab/vm2", "lab/web-1"}, 7, "lab/web-1"},
		{"cursor past the end", Query{Limit: 2, Cursor: Cursor("zzz/1")}, []string{}, 7, ""},
		{"name glob on names", Query{Name: "web-*"}, []string{"lab/web-1", "lab/web-2"}, 2, ""},
		{"name glob on ids", Query{Name: "lab/*"}, all[1:5], 4, ""},
		{"name glob on ids, any backend", Query{Name: "*/10?"}, []string{"pve/101", "pve/102"}, 2, ""},
		{"star stays within a name", Query{Name: "*"}, all, 7, ""},
		{"star does not cross a slash", Query{Name: "lab*"}, []string{}, 0, ""},
		{"class", Query{Name: "vm[2-9]"}, []string{"lab/vm2"}, 1, ""},
		{"state", Query{State: hypervisor.StateStopped}, []string{"lab/vm2", "pve/102"}, 2, ""},
		{"backend and state", Query{Backend: "pve", State: hypervisor.StateRunning}, []string{"pve/101"}, 1, ""},
		{"backend that failed", Query{Backend: "dead"}, []string{}, 0, ""},
		{"filters and pages", Query{State: hypervisor.StateRunning, Limit: 2}, []string{"lab-x/a", "lab/vm1"}, 4, "lab/vm1"},
		{"filters and pages, second", Query{State: hypervisor.StateRunning, Limit: 2, Cursor: Cursor("lab/vm1")}, []string{"lab/web-1", "pve/101"}, 4, ""},
		{"keep", Query{Keep: func(id, backend string, vm hypervisor.VM) bool {
			return id != "lab/vm1" && backend+"/"+vm.Name == id
		}}, slices.Delete(slices.Clone(all), 1, 2), 6, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Paginate(fixture(), tt.q)
			if err != nil {
				t.Fatalf("Paginate(%+v) = %v", tt.q, err)
			}
			next := ""
			if p.Next != "" {
				if next, err = ParseCursor(p.Next); err != nil {
					t.Fatalf("ParseCursor(%q) = %v", p.Next, err)
				}
			}
			if got := ids(p); !slices.Equal(got, tt.want) || p.Total != tt.total || next != tt.next {
				t.Errorf("Paginate(%+v) = %v, total %d, next %q; want %v, total %d, next %q", tt.q, got, p.Total, next, tt.want, tt.total, tt.next)
			}
		})
	}
	p, _ := Paginate(fixture(), Query{Name: "101"})
	if len(p.Entries) != 1 || p.Entries[0].Backend != "pve" || p.Entries[0].VM != vm("101", hypervisor.StateRunning) {
		t.Errorf("Paginate(name 101) = %+v; want pve's VM 101 as listed", p.Entries)
	}
}

func TestPaginateRefuses(t *testing.T) {
	b64 := func(s string) string { return cursorPrefix + base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, tt := range []struct {
		name string
		q    Query
		says string
	}{
		{"negative limit", Query{Limit: -1}, "limit -1"},
		{"limit too large", Query{Limit: MaxLimit + 1}, "limit 1001"},
		{"double star", Query{Name: "lab/**"}, `"**" is not supported`},
		{"bad glob", Query{Name: "vm[1"}, "syntax error in pattern"},
		{"bad glob beyond what a name reaches", Query{Name: "a[", Backend: "lab"}, "syntax error in pattern"},
		{"long glob", Query{Name: strings.Repeat("a", maxGlob+1)}, "at most 256"},
		{"state", Query{State: "on"}, `state "on"`},
		{"backend", Query{Backend: "nope"}, `backend "nope": there is no such backend (there are: lab, pve, dead, lab-x)`},
		{"cursor of someone else", Query{Cursor: "lab/vm1"}, "not a cursor of this server"},
		{"damaged cursor", Query{Cursor: cursorPrefix + "!!"}, "damaged"},
		{"cursor without a VM", Query{Cursor: b64("vm1")}, "does not name a VM"},
		{"cursor without a backend", Query{Cursor: b64("/vm1")}, "does not name a VM"},
		{"cursor without a name", Query{Cursor: b64("lab/")}, "does not name a VM"},
		{"long cursor", Query{Cursor: b64("lab/" + strings.Repeat("v", maxID))}, "too long"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			tt.q.Keep = func(string, string, hypervisor.VM) bool { called = true; return true }
			p, err := Paginate(fixture(), tt.q)
			if !errors.Is(err, ErrInvalid) || !errors.Is(err, hypervisor.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("Paginate(%+v) = %+v, %v; want an ErrInvalid saying %q", tt.q, p, err, tt.says)
			}
			if called {
				t.Errorf("Paginate(%+v) asked Keep before refusing the query", tt.q)
			}
		})
	}
}

// naive is Paginate's meaning, the slow way: every match, sorted, then
// the page after the cursor.
func naive(lists []Listing, q Query) (page []string, total int) {
	after, _ := ParseCursor(q.Cursor)
	var m []string
	for _, l := range lists {
		for _, v := range l.VMs {
			id := l.Backend + "/" + v.Name
			subject := v.Name
			if strings.Contains(q.Name, "/") {
				subject = id
			}
			ok, _ := path.Match(q.Name, subject)
			if l.Err == nil && (q.Backend == "" || q.Backend == l.Backend) && (q.State == "" || q.State == v.State) && (q.Name == "" || ok) {
				m = append(m, id)
			}
		}
	}
	slices.Sort(m)
	total = len(m)
	i, _ := slices.BinarySearch(m, after)
	for i < len(m) && m[i] <= after {
		i++
	}
	m = m[i:]
	if q.Limit > 0 && len(m) > q.Limit {
		m = m[:q.Limit]
	}
	return m, total
}

// TestPaginateAgreesWithSorting: on random fleets and queries, every page
// is the slow way's, and walking the cursors visits every match once.
func TestPaginateAgreesWithSorting(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	states := []hypervisor.State{hypervisor.StateRunning, hypervisor.StateStopped, hypervisor.StatePaused}
	globs := []string{"", "*", "vm1*", "*/vm2?", "b-1/*", "[a-m]*", "vm?"}
	for round := range 200 {
		var lists []Listing
		for b := range 1 + r.IntN(4) {
			l := Listing{Backend: fmt.Sprintf("b-%d", b)}
			if b == 0 {
				l.Backend = "b" // sorts after "b-…"'s VMs ('-' < '/')
			}
			for i := range r.IntN(40) {
				l.VMs = append(l.VMs, vm(fmt.Sprintf("vm%d", r.IntN(1000)+i*1000), states[r.IntN(len(states))]))
			}
			lists = append(lists, l)
		}
		q := Query{Limit: r.IntN(7), Name: globs[r.IntN(len(globs))]}
		if r.IntN(3) == 0 {
			q.State = states[r.IntN(len(states))]
		}
		if r.IntN(3) == 0 {
			q.Backend = lists[r.IntN(len(lists))].Backend
		}
		var walked []string
		for pages := 0; ; pages++ {
			want, wantTotal := naive(lists, q)
			p, err := Paginate(lists, q)
			if err != nil || !slices.Equal(ids(p), want) || p.Total != wantTotal {
				t.Fatalf("round %d: Paginate(%+v) = %v, total %d, %v; want %v, total %d", round, q, ids(p), p.Total, err, want, wantTotal)
			}
			walked = append(walked, ids(p)...)
			if p.Next == "" {
				break
			}
			if pages > 1000 {
				t.Fatalf("round %d: no last page after 1000 pages", round)
			}
			q.Cursor = p.Next
		}
		q.Cursor, q.Limit = "", 0
		if all, _ := naive(lists, q); !slices.Equal(walked, all) {
			t.Fatalf("round %d: walking the pages gave %v; want every match once, in order: %v", round, walked, all)
		}
	}
}

// TestPaginateWhileVMsComeAndGo: between two pages a VM is created before
// the cursor, one after it, and one of the next page is deleted: the walk
// shows every VM that lived throughout exactly once, in order, and the
// new one after the cursor.
func TestPaginateWhileVMsComeAndGo(t *testing.T) {
	l := Listing{Backend: "lab"}
	for i := range 10 {
		l.VMs = append(l.VMs, vm(fmt.Sprintf("vm%02d", i), hypervisor.StateRunning))
	}
	lists := []Listing{l}
	p, err := Paginate(lists, Query{Limit: 4})
	if err != nil {
		t.Fatal(err)
	}
	seen := ids(p)
	// vm00a sorts before the cursor (vm03), vm07a after it; vm05 goes.
	l.VMs = append(slices.Delete(slices.Clone(l.VMs), 5, 6), vm("vm00a", hypervisor.StateRunning), vm("vm07a", hypervisor.StateRunning))
	lists = []Listing{l}
	for p.Next != "" {
		if p, err = Paginate(lists, Query{Limit: 4, Cursor: p.Next}); err != nil {
			t.Fatal(err)
		}
		seen = append(seen, ids(p)...)
	}
	want := []string{"lab/vm00", "lab/vm01", "lab/vm02", "lab/vm03", "lab/vm04", "lab/vm06", "lab/vm07", "lab/vm07a", "lab/vm08", "lab/vm09"}
	if !slices.Equal(seen, want) {
		t.Errorf("pages while VMs came and went = %v; want %v", seen, want)
	}
	if p.Total != 11 {
		t.Errorf("total on the last page = %d; want 11 (the VMs as they are now)", p.Total)
	}
}

// fleetLists is a fleet of n VMs over backends backends (hypervisortest's
// fleet names), listed as the plugin host keeps them.
func fleetLists(t testing.TB, n, backends int) []Listing {
	var lists []Listing
	for b := range backends {
		f, err := fleet.New(context.Background(), &fleet.Settings{VMs: n / backends})
		if err != nil {
			t.Fatal(err)
		}
		vms, _ := f.ListVMs(context.Background())
		lists = append(lists, Listing{Backend: fmt.Sprintf("pve%d", b), VMs: vms})
	}
	return lists
}

// TestPaginateAllocations: a page costs the same few allocations whether
// the fleet has 12 VMs or 1,000 (both have a next page).
func TestPaginateAllocations(t *testing.T) {
	q := Query{Limit: 5, Cursor: Cursor("pve0/vm00002"), Name: "vm*", State: hypervisor.StateRunning,
		Keep: func(string, string, hypervisor.VM) bool { return true }}
	var allocs []float64
	for _, n := range []int{12, 1000} {
		lists := fleetLists(t, n, 4)
		allocs = append(allocs, testing.AllocsPerRun(50, func() {
			if p, err := Paginate(lists, q); err != nil || p.Total != n {
				t.Fatalf("Paginate over %d VMs = total %d, %v", n, p.Total, err)
			}
		}))
	}
	// The ids' buffer, the heap, the page, the next cursor (its encoding
	// and its prefix), the query's cursor (decoded, made a string).
	const most = 7
	if allocs[0] != allocs[1] || allocs[1] > most {
		t.Errorf("allocations per page with 12 VMs, 1,000 VMs = %v; want the same, at most %d", allocs, most)
	}
}

// lister is a driver whose listing is counted: by ListVMs (a copy) or,
// when shared, ListVMsShared. wait, when set, blocks a listing until it
// returns (both listings of a Gather then wait for each other).
type lister struct {
	hypervisortest.Fake
	vms          []hypervisor.VM
	copies, kept atomic.Int32
	wait         func(ctx context.Context) error
}

func (l *lister) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	l.copies.Add(1)
	if l.wait != nil {
		if err := l.wait(ctx); err != nil {
			return nil, err
		}
	}
	return slices.Clone(l.vms), nil
}

type sharedLister struct{ *lister }

func (s sharedLister) ListVMsShared(ctx context.Context) ([]hypervisor.VM, error) {
	s.kept.Add(1)
	return s.vms, nil
}

func TestGather(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Two backends that each wait for the other to have started: Gather
	// must list them at once, or the first waits until the context ends.
	var started atomic.Int32
	both := make(chan struct{})
	barrier := func(ctx context.Context) error {
		if started.Add(1) == 2 {
			close(both)
		}
		select {
		case <-both:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("the other backend was never listed meanwhile: %w", ctx.Err())
		}
	}
	a := &lister{vms: []hypervisor.VM{vm("a1", hypervisor.StateRunning)}, wait: barrier}
	b := &lister{vms: []hypervisor.VM{vm("b1", hypervisor.StateStopped)}, wait: barrier}
	kept := &lister{vms: []hypervisor.VM{vm("k1", hypervisor.StateRunning)}}
	failing := &hypervisortest.Fake{} // ListVMs: ErrNotSupported
	got := Gather(ctx, []Backend{{"a", a}, {"kept", sharedLister{kept}}, {"b", b}, {"bad", failing}})
	if len(got) != 4 {
		t.Fatalf("Gather() = %d listings; want 4", len(got))
	}
	for i, want := range []struct {
		backend, vm string
	}{{"a", "a1"}, {"kept", "k1"}, {"b", "b1"}} {
		if l := got[i]; l.Backend != want.backend || l.Err != nil || len(l.VMs) != 1 || l.VMs[0].Name != want.vm {
			t.Errorf("Gather()[%d] = %+v; want backend %s listing %s", i, l, want.backend, want.vm)
		}
	}
	if l := got[3]; l.Backend != "bad" || !errors.Is(l.Err, hypervisor.ErrNotSupported) {
		t.Errorf("Gather()[3] = %+v; want backend bad with its error", l)
	}
	if &got[1].VMs[0] != &kept.vms[0] || kept.kept.Load() != 1 || kept.copies.Load() != 0 {
		t.Errorf("Gather() of a SharedLister: %d shared listings, %d copies, the kept list returned: %v; want it shared, not copied",
			kept.kept.Load(), kept.copies.Load(), &got[1].VMs[0] == &kept.vms[0])
	}
	one := Gather(ctx, []Backend{{"kept", sharedLister{kept}}})
	if len(one) != 1 || one[0].Backend != "kept" || len(one[0].VMs) != 1 {
		t.Errorf("Gather(one backend) = %+v", one)
	}
}

func BenchmarkPaginate(b *testing.B) {
	for _, n := range []int{12, 1000, 10000} {
		lists := fleetLists(b, n, 4)
		b.Run(fmt.Sprintf("vms=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Paginate(lists, Query{Limit: 100}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
