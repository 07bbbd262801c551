package memory

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
)

// TestSweepDropsIdleKeys: keys nobody used for a whole window do not pile up.
func TestSweepDropsIdleKeys(t *testing.T) {
	s := New()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range sweepEvery - 1 {
		c := policy.Counter{Key: fmt.Sprintf("k%d", i), Window: time.Second, Max: 1}
		if err := s.ReserveAll(context.Background(), "id", t0, []policy.Counter{c}); err != nil {
			t.Fatalf("ReserveAll(k%d) = %v; want nil", i, err)
		}
	}
	if got := len(s.windows); got != sweepEvery-1 {
		t.Fatalf("keys before the sweep = %d; want %d", got, sweepEvery-1)
	}
	live := policy.Counter{Key: "live", Window: time.Hour, Max: 1}
	if err := s.ReserveAll(context.Background(), "id", t0.Add(time.Minute), []policy.Counter{live}); err != nil {
		t.Fatalf("ReserveAll(live) = %v; want nil", err)
	}
	if got := len(s.windows); got != 1 || s.windows["live"] == nil {
		t.Errorf("keys after the sweep = %d; want only %q", got, "live")
	}
}
