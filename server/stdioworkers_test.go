package server

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// TestStdioWorkersBound: at most max messages run at once; a message
// submitted while all workers are busy waits for one of them (no new
// worker) or gives up when its done channel closes; stop lets every
// worker exit and refuses what comes after.
func TestStdioWorkersBound(t *testing.T) {
	const max = 3
	release := make(chan struct{})
	running := make(chan string, 2*max)
	var now, peak atomic.Int32
	w := newStdioWorkers(max, func(line []byte) {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		running <- string(line)
		<-release
		now.Add(-1)
	})
	never := make(chan struct{})
	for _, l := range []string{"a", "b", "c"} {
		if !w.submit([]byte(l), never) {
			t.Fatalf("submit(%q) = false; want true", l)
		}
	}
	for range max {
		<-running
	}
	if got := w.started(); got != max {
		t.Fatalf("started() = %d; want %d", got, max)
	}
	closed := make(chan struct{})
	close(closed)
	if w.submit([]byte("d"), closed) {
		t.Fatalf("submit with every worker busy and done closed = true; want false")
	}
	release <- struct{}{} // one worker finishes "a", "b" or "c" and is idle again
	if !w.submit([]byte("e"), never) {
		t.Fatalf("submit(e) = false; want true")
	}
	if got := <-running; got != "e" {
		t.Fatalf("running %q; want e", got)
	}
	if got := w.started(); got != max {
		t.Fatalf("started() after a worker was idle again = %d; want %d", got, max)
	}
	w.stop()
	close(release)
	w.wg.Wait()
	if w.submit([]byte("f"), never) {
		t.Fatalf("submit after stop = true; want false")
	}
	if p := peak.Load(); p != max {
		t.Fatalf("peak concurrency = %d; want %d", p, max)
	}
}

// TestStdioWorkersReuse: messages one after another, each sent once the
// worker of the one before is idle, all run on the one worker the first
// started.
func TestStdioWorkersReuse(t *testing.T) {
	done := make(chan struct{})
	w := newStdioWorkers(maxConcurrentCalls, func([]byte) { done <- struct{}{} })
	for i := range 100 {
		if !w.submit([]byte("x"), nil) {
			t.Fatalf("submit #%d = false; want true", i)
		}
		<-done
		for w.idle.Load() == 0 { // the worker is on its way back to wait
			runtime.Gosched()
		}
	}
	if got := w.started(); got != 1 {
		t.Fatalf("started() after 100 messages one after another = %d; want 1", got)
	}
	w.stop()
	w.wg.Wait()
}
