package stdio

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
)

// slowOut is an io.Writer whose Write blocks until release is closed the
// first time (a reader that has not caught up), counting its calls.
type slowOut struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	writes  int
	entered chan struct{} // closed when the first Write starts
	release chan struct{}
	fail    error
}

func (o *slowOut) Write(p []byte) (int, error) {
	o.mu.Lock()
	first := o.writes == 0
	o.writes++
	o.mu.Unlock()
	if first {
		close(o.entered)
		<-o.release
	}
	if o.fail != nil {
		return 0, o.fail
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// TestLineWriterSharesWrites: messages that arrive while a write is in
// progress go out whole, each on its line, with one more write(2) for all
// of them.
func TestLineWriterSharesWrites(t *testing.T) {
	o := &slowOut{entered: make(chan struct{}), release: make(chan struct{})}
	w := newLineWriter(o, slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	go func() { w.write([]byte(`{"id":0}`)); close(done) }()
	<-o.entered
	for i := 1; i <= 20; i++ {
		w.write([]byte(fmt.Sprintf(`{"id":%d}`, i))) // queued: returns at once
	}
	close(o.release)
	<-done
	lines := strings.Split(strings.TrimSuffix(o.buf.String(), "\n"), "\n")
	var want []string
	for i := 0; i <= 20; i++ {
		want = append(want, fmt.Sprintf(`{"id":%d}`, i))
	}
	if !slices.Equal(lines, want) {
		t.Errorf("lines written = %q; want %q", lines, want)
	}
	if o.writes != 2 {
		t.Errorf("Write calls = %d; want 2 (the first message, then the 20 queued behind it)", o.writes)
	}
}

// TestLineWriterConcurrent: many goroutines, every message whole on its
// own line. out is a plain bytes.Buffer: lineWriter writes to it from one
// goroutine at a time, which -race checks.
func TestLineWriterConcurrent(t *testing.T) {
	var buf bytes.Buffer
	w := newLineWriter(&buf, slog.New(slog.DiscardHandler))
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				w.write([]byte(fmt.Sprintf(`{"g":%d,"i":%d,"pad":"%s"}`, g, i, strings.Repeat("x", i))))
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		if !strings.HasPrefix(l, `{"g":`) || !strings.HasSuffix(l, `"}`) || seen[l] {
			t.Fatalf("line %q is torn or repeated", l)
		}
		seen[l] = true
	}
	if len(seen) != 16*200 {
		t.Errorf("%d lines; want %d", len(seen), 16*200)
	}
}

// TestLineWriterFailure: after a failed write later messages are dropped
// and send reports the error.
func TestLineWriterFailure(t *testing.T) {
	o := &slowOut{entered: make(chan struct{}), release: make(chan struct{}), fail: errors.New("broken pipe")}
	close(o.release)
	w := newLineWriter(o, slog.New(slog.DiscardHandler))
	if err := w.send([]byte(`{}`)); err == nil || !strings.Contains(err.Error(), "broken pipe") {
		t.Errorf("send on a broken pipe = %v; want the write's error", err)
	}
	w.write([]byte(`{}`))
	if o.writes != 1 {
		t.Errorf("Write calls = %d; want 1 (nothing written after the failure)", o.writes)
	}
}

// TestLineWriterBoundsItsQueue: a caller that would queue past
// maxQueuedBytes waits for the write in progress.
func TestLineWriterBoundsItsQueue(t *testing.T) {
	o := &slowOut{entered: make(chan struct{}), release: make(chan struct{})}
	w := newLineWriter(o, slog.New(slog.DiscardHandler))
	first := make(chan struct{})
	go func() { w.write([]byte(`{}`)); close(first) }()
	<-o.entered
	w.write(bytes.Repeat([]byte("a"), maxQueuedBytes)) // fills the queue
	blocked := make(chan struct{})
	go func() { w.write([]byte(`{"last":true}`)); close(blocked) }()
	select {
	case <-blocked:
		t.Fatal("a write past the queue's bound returned while the first write was blocked")
	default:
	}
	close(o.release)
	<-blocked
	<-first // the writing goroutine returns once the queue is empty
	if !strings.HasSuffix(o.buf.String(), "{\"last\":true}\n") {
		t.Errorf("the waiting message was not written last")
	}
}
