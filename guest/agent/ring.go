//go:build linux

package agent

import (
	"bytes"
	"sync"
	"unicode/utf8"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// ring keeps the last size bytes written to one output stream of a job
// and counts every byte: a reader asks for what arrived since an offset
// (a cursor in the stream, 0 at its start) and learns how much of it the
// ring no longer held. mu guards every field; changed is closed (and
// replaced) on every write, for readers that wait for output.
type ring struct {
	mu      sync.Mutex
	buf     []byte // len(buf) == size once full
	size    int
	total   int64 // bytes ever written
	changed chan struct{}
	onWrite func() // called after each write, outside mu (the job's wake-up)
}

func newRing(size int, onWrite func()) *ring {
	return &ring{size: size, changed: make(chan struct{}), onWrite: onWrite}
}

// Write keeps p (its tail when p is larger than the ring); it never fails.
// Until the stream outgrows the ring, buf holds offsets [0, total) in
// order; after, offset o lives at buf[o % size].
func (r *ring) Write(p []byte) (int, error) {
	n := len(p)
	r.mu.Lock()
	start := r.total
	r.total += int64(n)
	if len(p) > r.size {
		start += int64(len(p) - r.size)
		p = p[len(p)-r.size:]
	}
	if r.total <= int64(r.size) {
		r.buf = append(r.buf, p...)
	} else {
		if len(r.buf) < r.size {
			r.buf = append(r.buf, make([]byte, r.size-len(r.buf))...)
		}
		for len(p) > 0 {
			k := copy(r.buf[int(start%int64(r.size)):], p)
			p, start = p[k:], start+int64(k)
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	if r.onWrite != nil {
		r.onWrite()
	}
	return n, nil
}

// first is the stream offset of the oldest byte held. mu is held.
func (r *ring) first() int64 { return r.total - int64(len(r.buf)) }

// read returns up to max bytes from offset since: the data, where it
// starts (later than since when the ring dropped what was there), and
// the counts. since beyond the stream's end is read as its end.
func (r *ring) read(since int64, max int) wire.JobOutput {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := wire.JobOutput{Total: r.total, DroppedTotal: r.first()}
	since = min(max64(since, 0), r.total)
	from := max64(since, r.first())
	out.Dropped = from - since
	end := min(r.total, from+int64(max))
	out.Offset, out.Next, out.More = from, end, end < r.total
	out.Data = r.copyRange(from, end)
	return out
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// copyRange copies stream offsets [from, end), all held. mu is held.
func (r *ring) copyRange(from, end int64) []byte {
	out := make([]byte, 0, end-from)
	if len(r.buf) < r.size {
		base := r.first()
		return append(out, r.buf[from-base:end-base]...)
	}
	for o := from; o < end; {
		at := int(o % int64(r.size))
		k := min(int(end-o), r.size-at)
		out = append(out, r.buf[at:at+k]...)
		o += int64(k)
	}
	return out
}

// counts is the stream's counts at its end, without data.
func (r *ring) counts() wire.JobOutput { return r.read(1<<62, 0) }

// tail is the last n bytes held.
func (r *ring) tail(n int) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.copyRange(max64(r.first(), r.total-int64(n)), r.total)
}

// lastLine is the last non-empty line of the held output (the line being
// written counts), at most maxLine bytes of its end, valid UTF-8.
func (r *ring) lastLine() string {
	b := bytes.TrimRight(r.tail(lineScan), "\r\n")
	if i := bytes.LastIndexAny(b, "\r\n"); i >= 0 {
		b = b[i+1:]
	}
	if len(b) > maxLine {
		b = b[len(b)-maxLine:]
		for len(b) > 0 && !utf8.FullRune(b) || len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return string(bytes.ToValidUTF8(b, []byte("\uFFFD")))
}

// How much of the end of a stream lastLine looks at, and keeps.
const (
	lineScan = 4096
	maxLine  = 512
)

// wait returns a channel closed at the next write.
func (r *ring) wait() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}
