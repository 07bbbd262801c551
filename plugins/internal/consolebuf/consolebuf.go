// Package consolebuf reads serial consoles for the drivers: ReadLog reads
// a console log file a backend appends to, by file offsets; a Ring keeps a
// console's output for drivers whose
// backend hands it out as a stream with no history (libvirt's
// virDomainOpenConsole, Proxmox's termproxy): a reader goroutine the
// driver owns writes what arrives into a Ring, and ConsoleRead calls read
// it by byte offsets, so any number of readers, cursors and tails work on
// one stream.
//
// A Ring keeps the last Size bytes. Offsets count every byte written since
// the Ring was made; what was overwritten before a reader came for it is
// reported as dropped, never made up. A Ring is safe for concurrent use.
package consolebuf

import (
	"errors"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/vmgate/vmgate/hypervisor"
)

// DefaultSize is what a Ring keeps when made with size 0.
const DefaultSize = 1 << 20

// Ring is a bounded console buffer with absolute offsets.
type Ring struct {
	mu   sync.Mutex
	buf  []byte // len(buf) == size; byte at offset o is buf[o%size]
	end  int64  // offset after the last byte written
	size int64
}

// New returns a Ring keeping the last size bytes (DefaultSize for 0).
func New(size int) *Ring {
	if size <= 0 {
		size = DefaultSize
	}
	return &Ring{buf: make([]byte, size), size: int64(size)}
}

// Write appends p, dropping the oldest bytes beyond the Ring's size. It
// never fails (an io.Writer for the stream's reader).
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	if int64(len(p)) > r.size {
		r.end += int64(len(p)) - r.size
		p = p[int64(len(p))-r.size:]
	}
	for len(p) > 0 {
		at := r.end % r.size
		c := copy(r.buf[at:], p)
		p = p[c:]
		r.end += int64(c)
	}
	return n, nil
}

// End is the offset after the last byte written.
func (r *Ring) End() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.end
}

// Read answers a console read (req valid): from req.Since, or the last
// req.TailBytes, at most req.Limit() bytes. A Since past the end (a cursor
// from before the driver's view of the console started over) reads from
// the oldest byte kept, with Reset.
func (r *Ring) Read(req hypervisor.ConsoleReadRequest) hypervisor.ConsoleChunk {
	r.mu.Lock()
	defer r.mu.Unlock()
	oldest := max(0, r.end-r.size)
	limit := int64(req.Limit())
	var c hypervisor.ConsoleChunk
	switch {
	case req.TailBytes > 0:
		want := max(0, r.end-limit)
		c.Start = max(want, oldest)
		c.Dropped = c.Start - want
	case req.Since > r.end:
		c.Start, c.Reset = oldest, true
	default:
		c.Start = max(req.Since, oldest)
		c.Dropped = c.Start - req.Since
	}
	n := min(r.end-c.Start, limit)
	c.Data = make([]byte, n)
	for i := int64(0); i < n; {
		at := (c.Start + i) % r.size
		i += int64(copy(c.Data[i:], r.buf[at:min(r.size, at+n-i)]))
	}
	c.Cursor = c.Start + n
	c.More = c.Cursor < r.end
	return c
}

// ReadLog answers a console read (req valid) from a console log file that
// a backend appends to (QEMU's chardev logfile, VirtualBox's file-mode
// UART): the offsets are the file's. A Since past the file's end means the
// backend started the log afresh (a new process truncated it): the read
// starts over from its beginning, with Reset.
func ReadLog(f *os.File, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
	fi, err := f.Stat()
	if err != nil {
		return hypervisor.ConsoleChunk{}, err
	}
	if !fi.Mode().IsRegular() {
		return hypervisor.ConsoleChunk{}, errors.New("the console log is not a regular file")
	}
	size, limit := fi.Size(), int64(req.Limit())
	var c hypervisor.ConsoleChunk
	switch {
	case req.TailBytes > 0:
		c.Start = max(0, size-limit)
	case req.Since > size:
		c.Start, c.Reset = 0, true
	default:
		c.Start = req.Since
	}
	n := min(size-c.Start, limit)
	c.Data = make([]byte, n)
	got, err := f.ReadAt(c.Data, c.Start)
	if err != nil && !errors.Is(err, io.EOF) {
		return hypervisor.ConsoleChunk{}, err
	}
	c.Data = c.Data[:got]
	c.Cursor = c.Start + int64(got)
	c.More = c.Cursor < size
	return c, nil
}

// OpenLog opens a console log for ReadLog, not following a symlink in its
// last component.
func OpenLog(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
}
