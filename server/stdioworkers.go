package server

import "sync"

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
	work chan []byte   // unbuffered: a send succeeds only when an idle worker takes the line
	quit chan struct{} // closed by stop: idle workers exit, submit gives up

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
	select {
	case w.work <- line:
		return true
	default:
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
