package server

import (
	"sync"
	"sync/atomic"
)

// stdioWorkers runs the messages of one stdio connection on long-lived
// goroutines: at most max of them, started on demand and kept while the
// connection lives. A worker keeps the stack a call grew (the gate,
// mcp-go and a driver call are deep), where a goroutine per message
// grew a fresh one for every call (runtime.newstack was an eighth of the
// CPU of a call).
//
// Concurrency: submit is called by one goroutine (the connection's
// reader); run is called by the workers, at most max at once, each
// running one message at a time; stop may be called once, from any
// goroutine, and wg then waits for every worker.
type stdioWorkers struct {
	run  func(line []byte)
	max  int
	work chan []byte   // unbuffered: the line a submit hands to the idle worker it claimed
	quit chan struct{} // closed by stop: idle workers exit, submit gives up
	// idle counts the workers waiting on work that no submit claimed yet:
	// a worker adds itself before it waits, a submit claims one by taking
	// one off, and the claimed worker then takes the submit's line (or
	// both give up on quit).
	idle atomic.Int32

	mu      sync.Mutex // guards n and stopped (and so every wg.Add)
	n       int        // workers started
	stopped bool
	wg      sync.WaitGroup // one per worker
}

func newStdioWorkers(max int, run func(line []byte)) *stdioWorkers {
	return &stdioWorkers{run: run, max: max, work: make(chan []byte), quit: make(chan struct{})}
}

// submit runs line on an idle worker, on a new one while fewer than max
// run, or else on the first one to be idle. It returns false without
// running line when done is closed or stop was called first.
func (w *stdioWorkers) submit(line []byte, done <-chan struct{}) bool {
	if w.claimIdle() {
		return w.handOver(line, nil)
	}
	w.mu.Lock()
	if !w.stopped && w.n < w.max {
		w.n++
		w.wg.Add(1)
		w.mu.Unlock()
		go w.loop(line)
		return true
	}
	w.mu.Unlock()
	// Every worker is busy: the first to be idle takes line.
	w.idle.Add(-1) // a claim on the next worker to be idle
	if !w.handOver(line, done) {
		w.idle.Add(1) // the claim is given back
		return false
	}
	return true
}

// claimIdle claims a worker that waits for work, if there is one.
func (w *stdioWorkers) claimIdle() bool {
	for {
		n := w.idle.Load()
		if n <= 0 {
			return false
		}
		if w.idle.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// handOver gives line to a claimed worker.
func (w *stdioWorkers) handOver(line []byte, done <-chan struct{}) bool {
	select {
	case w.work <- line:
		return true
	case <-done:
		return false
	case <-w.quit:
		return false
	}
}

// loop runs line, then every line handed to it until stop.
func (w *stdioWorkers) loop(line []byte) {
	defer w.wg.Done()
	for {
		w.run(line)
		w.idle.Add(1)
		select {
		case line = <-w.work:
		case <-w.quit:
			return
		}
	}
}

// stop starts no more workers and lets the idle ones exit; the busy ones
// exit when their message is done. w.wg waits for all of them.
func (w *stdioWorkers) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.stopped = true
		close(w.quit)
	}
}

// started is how many workers were started.
func (w *stdioWorkers) started() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}
