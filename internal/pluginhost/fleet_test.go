package pluginhost

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest/fleet"
	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/internal/vmpage"
)

// The plugin host at fleet size: hypervisortest's Fleet driver, registered
// as "fleet", runs as real plugin processes (several backends of many
// VMs) and the state cache, the list and status paths are checked to stay
// flat as the fleet grows.

func init() {
	registry.Register("fleet", fleet.New)
}

var _ vmpage.SharedLister = (*Supervisor)(nil)

// launchFleet runs backends fleet plugins of perBackend VMs each, with the
// state TTL ttl, closed at cleanup.
func launchFleet(tb testing.TB, backends, perBackend int, ttl time.Duration) []*Supervisor {
	tb.Helper()
	h := New(Options{Executable: os.Args[0], Registry: testRegistry(), Logger: slog.New(slog.DiscardHandler), StateTTL: ttl})
	tb.Cleanup(func() {
		if err := h.Close(); err != nil {
			tb.Errorf("Host.Close() = %v", err)
		}
	})
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []*Supervisor
	for i := range backends {
		d, err := h.Launch(ctx, Spec{Driver: "fleet", Backend: fmt.Sprintf("b%d", i), Config: fmt.Appendf(nil, `{"vms":%d}`, perBackend)})
		if err != nil {
			tb.Fatalf("Launch(fleet of %d) = %v", perBackend, err)
		}
		out = append(out, d.(*Supervisor))
	}
	return out
}

// pollAll lists every backend and asks the status of each of its VMs.
func pollAll(tb testing.TB, sups []*Supervisor, perBackend int) {
	tb.Helper()
	ctx := context.Background()
	for _, s := range sups {
		vms, err := s.ListVMsShared(ctx)
		if err != nil || len(vms) != perBackend {
			tb.Fatalf("ListVMsShared() = %d VMs, %v; want %d", len(vms), err, perBackend)
		}
		for _, vm := range vms {
			if st, err := s.Status(ctx, vm.Name); err != nil || st.State != hypervisor.StateRunning {
				tb.Fatalf("Status(%s) = %+v, %v", vm.Name, st, err)
			}
		}
	}
}

// hitAllocs are the allocations of a cached ListVMs, ListVMsShared and
// Status on the first of sups.
func hitAllocs(t *testing.T, sups []*Supervisor) (list, shared, status float64) {
	ctx := context.Background()
	s := sups[0]
	vm := fleet.VMName("", 1)
	list = testing.AllocsPerRun(20, func() { _, _ = s.ListVMs(ctx) })
	shared = testing.AllocsPerRun(20, func() { _, _ = s.ListVMsShared(ctx) })
	status = testing.AllocsPerRun(20, func() { _, _ = s.Status(ctx, vm) })
	return list, shared, status
}

// TestFleetCacheFlat: over 4 plugins of 250 VMs, a cached listing or
// status allocates what it does over 4 of 3 VMs (a shared listing and a
// status nothing at all); polling every VM keeps one entry per VM; an
// exec in one guest keeps the other VMs' statuses; and rounds of polling
// with every answer fetched anew leave the heap and the goroutines where
// the first round left them.
func TestFleetCacheFlat(t *testing.T) {
	small := launchFleet(t, 4, 3, time.Hour)
	big := launchFleet(t, 4, 250, time.Hour)
	pollAll(t, small, 3)
	pollAll(t, big, 250)
	sl, ss, st := hitAllocs(t, small)
	bl, bs, bt := hitAllocs(t, big)
	t.Logf("allocs: ListVMs %v/%v, shared %v/%v, status %v/%v", sl, bl, ss, bs, st, bt)
	if bl != sl || bs != 0 || ss != 0 || bt != st || bt > 1 {
		t.Errorf("allocations of a cache hit with 3 VMs, 250 VMs per backend: ListVMs %v, %v; ListVMsShared %v, %v; Status %v, %v; "+
			"want the same for both, none for ListVMsShared, at most one for Status", sl, bl, ss, bs, st, bt)
	}
	for i, s := range big {
		if n := s.cache.len(); n != 251 {
			t.Errorf("backend %d's cache after polling its 250 VMs holds %d answers; want 251 (the list and each VM's status)", i, n)
		}
	}

	s := big[0]
	s.mu.Lock()
	inst := s.cur
	s.mu.Unlock()
	ctx := context.Background()
	_ = s.FileWrite(ctx, "vm00001", "/x", []byte("x"), 0o644) // fleet VMs have no guest: it fails, and forgets all the same
	for _, tt := range []struct {
		k    cacheKey
		kept bool
	}{{listKey, false}, {statusKey("vm00001"), false}, {statusKey("vm00002"), true}, {statusKey("vm00250"), true}} {
		if _, ok, _ := s.cache.lookup(inst, tt.k); ok != tt.kept {
			t.Errorf("cached %+v after a file write on vm00001: %v; want %v", tt.k, ok, tt.kept)
		}
	}

	// Every answer anew: the TTL is a nanosecond.
	churn := launchFleet(t, 4, 250, time.Nanosecond)
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	pollAll(t, churn, 250)
	heap0, g0 := heap(), runtime.NumGoroutine()
	for range 5 {
		pollAll(t, churn, 250)
	}
	heap1, g1 := heap(), runtime.NumGoroutine()
	t.Logf("heap %d→%d KiB, goroutines %d→%d", heap0>>10, heap1>>10, g0, g1)
	if heap1 > heap0+512<<10 || g1 > g0+4 {
		t.Errorf("after 5 more rounds of 1,000 fresh statuses: heap %d KiB → %d KiB, goroutines %d → %d; want both flat",
			heap0>>10, heap1>>10, g0, g1)
	}
	for i, s := range churn {
		if n := s.cache.len(); n > 251 {
			t.Errorf("backend %d's cache after rounds of polling its 250 VMs holds %d answers; want at most 251", i, n)
		}
	}
}

// BenchmarkFleet measures the plugin host over 4 plugins of n/4 VMs: a
// cached ListVMs (a copy), ListVMsShared (none), Status, and a ListVMs
// that reaches the plugins (state cache off), per round over the 4.
func BenchmarkFleet(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{12, 1000} {
		cached := launchFleet(b, 4, n/4, time.Hour)
		uncached := launchFleet(b, 4, n/4, -1)
		pollAll(b, cached, n/4)
		for _, bc := range []struct {
			name string
			do   func() error
		}{
			{"ListVMs-cached", func() error {
				for _, s := range cached {
					if _, err := s.ListVMs(ctx); err != nil {
						return err
					}
				}
				return nil
			}},
			{"ListVMsShared-cached", func() error {
				for _, s := range cached {
					if _, err := s.ListVMsShared(ctx); err != nil {
						return err
					}
				}
				return nil
			}},
			{"Status-cached", func() error { _, err := cached[0].Status(ctx, "vm00001"); return err }},
			{"ListVMs-plugin", func() error {
				for _, s := range uncached {
					if _, err := s.ListVMs(ctx); err != nil {
						return err
					}
				}
				return nil
			}},
		} {
			b.Run(fmt.Sprintf("%s/vms=%d", bc.name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := bc.do(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
