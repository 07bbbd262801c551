package stdio

import (
	"io"
	"log/slog"
	"sync"
)

// maxQueuedBytes bounds what lineWriter holds for a slow reader: a caller
// that would queue past it waits for the write in progress, so a client
// that stops reading stops the server's workers, as a blocking write did.
const maxQueuedBytes = 1 << 20

// lineWriter writes the stdio transport's messages to out, one per line,
// for any number of goroutines. A message that finds no write in progress
// is written by its caller at once (a sequential call costs one write(2),
// as before); one that arrives while another goroutine is writing is
// queued, and that goroutine writes everything queued with one more
// write(2) before it returns. So concurrent answers share write(2) calls
// and none of their goroutines sleeps on a lock across another's write.
// Messages go out whole and in the order of the calls. After a failed
// write every later message is dropped and err says why. Safe for
// concurrent use; mu guards every field but out and log.
type lineWriter struct {
	out io.Writer
	log *slog.Logger

	mu      sync.Mutex
	drained sync.Cond // signalled when the writer takes the queue
	writing bool      // a goroutine is in write's loop
	queued  []byte    // messages waiting for it, each with its newline
	spare   []byte    // a written queue, for reuse
	err     error
}

func newLineWriter(out io.Writer, log *slog.Logger) *lineWriter {
	w := &lineWriter{out: out, log: log}
	w.drained.L = &w.mu
	return w
}

// write writes b and a newline (b may be extended in place).
func (w *lineWriter) write(b []byte) {
	w.mu.Lock()
	for w.writing && len(w.queued) >= maxQueuedBytes && w.err == nil {
		w.drained.Wait()
	}
	if w.err != nil {
		w.mu.Unlock()
		return
	}
	if w.writing {
		w.queued = append(append(w.queued, b...), '\n')
		w.mu.Unlock()
		return
	}
	w.writing = true
	w.mu.Unlock()
	w.drain(append(b, '\n'), false)
}

// drain writes buf, then whatever was queued meanwhile, until the queue is
// empty; fromQueue says buf is a taken queue (kept for reuse).
func (w *lineWriter) drain(buf []byte, fromQueue bool) {
	for {
		_, err := w.out.Write(buf)
		w.mu.Lock()
		if fromQueue {
			w.spare = buf[:0]
		}
		if err != nil && w.err == nil {
			w.err = err
			w.log.Warn("server: stdio: write failed", "err", err)
		}
		if w.err != nil || len(w.queued) == 0 {
			w.queued = w.queued[:0]
			w.writing = false
			w.drained.Broadcast()
			w.mu.Unlock()
			return
		}
		buf, w.queued, w.spare = w.queued, w.spare, nil
		fromQueue = true
		w.drained.Broadcast()
		w.mu.Unlock()
	}
}

// send writes b and returns the first write error so far (a message queued
// behind another's write is not written yet when it returns).
func (w *lineWriter) send(b []byte) error {
	w.write(b)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}
