package memory

import (
	"context"
	"fmt"
	"sync"

	"github.com/vmgate/vmgate/policy/store"
)

// guard is the mutex of a standalone in-memory register (Sessions,
// Snapshots) with its closed flag: lockLive takes mu unless ctx has ended
// or the register is closed, and every method runs under it.
type guard struct {
	mu     sync.Mutex
	closed bool
}

// Close makes later calls fail with store.ErrUnavailable.
func (g *guard) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	return nil
}

// lockLive takes mu after checking ctx; the caller unlocks on success.
func (g *guard) lockLive(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return fmt.Errorf("memory: %s: %w: store is closed", op, store.ErrUnavailable)
	}
	return nil
}
