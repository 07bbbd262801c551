package server

import (
	"context"
	"sync"
	"time"
)

// The reaper: every so often it destroys the sessions past their ttl or
// idle time (catalog.Guest.Reap) and deletes the undo snapshots past their
// retention (undo.go). The lease reaper is server/lease's own.

// DefaultReapEvery is how often the reaper runs when Config.ReapEvery is 0.
// A negative Config.ReapEvery disables it.
const DefaultReapEvery = 30 * time.Second

// reaper runs the passes until stop. Its fields are set by startReaper.
type reaper struct {
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
}

// startReaper starts s's reaper, one pass every every (0: DefaultReapEvery;
// negative: none).
func startReaper(s *Server, every time.Duration) *reaper {
	r := &reaper{}
	if every == 0 {
		every = DefaultReapEvery
	}
	if every < 0 {
		return r
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.env.Guest.Reap(ctx)
				s.undo.reap(ctx)
			}
		}
	}()
	return r
}

// stop ends the reaper and waits for its pass in flight.
func (r *reaper) stop() {
	r.once.Do(func() {
		if r.cancel != nil {
			r.cancel()
			<-r.done
		}
	})
}
