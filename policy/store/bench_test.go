package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/bolt"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/policy/store/redis"
)

// BenchmarkReserveAll measures one reservation of 1 and of 3 counters on
// every store, serially and from parallel goroutines sharing the counters.
// The virtual clock advances 1 µs per call and windows are 1 ms long, so
// each key holds about a thousand live entries and every call prunes one.
// Compare the stores with each other (memory is the baseline).
func BenchmarkReserveAll(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B) store.Store
	}{
		{"memory", func(b *testing.B) store.Store { return memory.New() }},
		{"bolt", func(b *testing.B) store.Store { return openBolt(b, true) }},
		{"bolt-sync", func(b *testing.B) store.Store { return openBolt(b, false) }},
		{"redis", func(b *testing.B) store.Store {
			addr, _, _ := redistest.Start(b)
			s, err := redis.Open("redis://"+addr, redis.Options{Timeout: 5 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		// Through Sentinel every reservation waits for the replica (WAIT 1
		// in the same round trip): compare with redis.
		{"redis-sentinel", func(b *testing.B) store.Store {
			d := redistest.StartSentinel(b, redistest.SentinelOptions{})
			s, err := redis.OpenSentinel(redis.Sentinel{Master: redistest.MasterName, Addrs: d.SentinelAddrs()}, redis.Options{Timeout: 5 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	}
	for _, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			s := st.open(b)
			defer s.Close()
			for _, n := range []int{1, 3} {
				cs := make([]policy.Counter, n)
				for i := range cs {
					cs[i] = policy.Counter{Key: fmt.Sprintf("bench%d|grant=alice", i), Name: "bench", Window: time.Millisecond, Max: 1 << 30}
				}
				var tick atomic.Int64
				t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Hour)
				reserve := func(b *testing.B) {
					i := tick.Add(1)
					if err := s.ReserveAll(context.Background(), strconv.FormatInt(i, 10), t0.Add(time.Duration(i)*time.Microsecond), cs); err != nil {
						b.Fatalf("ReserveAll = %v", err)
					}
				}
				b.Run(fmt.Sprintf("counters=%d", n), func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						reserve(b)
					}
				})
				b.Run(fmt.Sprintf("counters=%d/parallel", n), func(b *testing.B) {
					b.ReportAllocs()
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							reserve(b)
						}
					})
				})
			}
		})
	}
}

func openBolt(b *testing.B, noSync bool) store.Store {
	s, err := bolt.Open(filepath.Join(b.TempDir(), "state.db"), bolt.Options{NoSync: noSync})
	if err != nil {
		b.Fatal(err)
	}
	return s
}
