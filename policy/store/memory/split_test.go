package memory_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/bolt"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestSplitOverMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := memory.NewSplit(memory.New())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestSplitOverBolt(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		b, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := memory.NewSplit(b)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestNewSplitWithoutApprovals(t *testing.T) {
	if s, err := memory.NewSplit(nil); err == nil {
		t.Fatalf("NewSplit(nil) = %v, nil; want an error", s)
	}
}

func TestSplitKeepsCountersOutOfTheApprovalStore(t *testing.T) {
	b, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := memory.NewSplit(b)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := policy.Counter{Key: "k", Window: time.Minute, Max: 5}
	if err := s.ReserveAll(context.Background(), "id1", time.Now(), []policy.Counter{c}); err != nil {
		t.Fatal(err)
	}
	if rs, err := b.Reservations(context.Background(), "k"); err != nil || len(rs) != 0 {
		t.Fatalf("bolt Reservations(k) = %v, %v; want none (counters live in memory)", rs, err)
	}
}

func TestRestore(t *testing.T) {
	t0 := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	c := policy.Counter{Key: "k", Window: time.Minute, Max: 2}
	ctx := context.Background()
	tests := []struct {
		name     string
		restore  []string // ids restored at t0, in order
		wantFree int      // reservations ReserveAll still grants at t0+1s
	}{
		{"none", nil, 2},
		{"one", []string{"a"}, 1},
		{"idempotent", []string{"a", "a", "a"}, 1},
		{"beyond max", []string{"a", "b", "c"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := memory.New()
			for _, id := range tt.restore {
				if err := s.Restore(ctx, id, t0, []policy.Counter{c}); err != nil {
					t.Fatalf("Restore(%s) = %v", id, err)
				}
			}
			free := 0
			for i := range 5 {
				err := s.ReserveAll(ctx, "new"+string(rune('0'+i)), t0.Add(time.Second), []policy.Counter{c})
				if err == nil {
					free++
					continue
				}
				var le *store.LimitedError
				if !errors.As(err, &le) {
					t.Fatalf("ReserveAll = %v; want nil or *LimitedError", err)
				}
				break
			}
			if free != tt.wantFree {
				t.Fatalf("ReserveAll after Restore(%v) granted %d; want %d", tt.restore, free, tt.wantFree)
			}
			// Restored reservations leave the window like any other.
			if err := s.ReserveAll(ctx, "later", t0.Add(time.Minute+time.Second), []policy.Counter{c}); err != nil {
				t.Fatalf("ReserveAll a window later = %v; want nil", err)
			}
		})
	}
}

func TestRestoreRejectsBadInput(t *testing.T) {
	good := policy.Counter{Key: "k", Window: time.Minute, Max: 2}
	tests := []struct {
		name     string
		id       string
		counters []policy.Counter
	}{
		{"empty id", "", []policy.Counter{good}},
		{"empty key", "a", []policy.Counter{{Window: time.Minute, Max: 1}}},
		{"zero window", "a", []policy.Counter{{Key: "k", Max: 1}}},
		{"negative max", "a", []policy.Counter{{Key: "k", Window: time.Minute, Max: -1}}},
		{"same key twice", "a", []policy.Counter{good, good}},
	}
	for _, tt := range tests {
		s := memory.New()
		if err := s.Restore(context.Background(), tt.id, time.Now(), tt.counters); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Restore(%s) = %v; want ErrInvalid", tt.name, err)
		}
		// Nothing changed: the full budget is there.
		for i := range 2 {
			if err := s.ReserveAll(context.Background(), "r"+string(rune('0'+i)), time.Now(), []policy.Counter{good}); err != nil {
				t.Errorf("%s: ReserveAll %d after a rejected Restore = %v; want nil", tt.name, i, err)
			}
		}
	}
	s := memory.New()
	s.Close()
	if err := s.Restore(context.Background(), "a", time.Now(), []policy.Counter{good}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Restore after Close = %v; want ErrUnavailable", err)
	}
}
