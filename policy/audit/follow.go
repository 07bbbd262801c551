package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"syscall"
	"time"
)

// Following a live log (`vmgate audit tail -f`). Tail reports every
// record once, in file order, as the server appends it, and never one
// twice:
//
//   - it reads only complete lines: a last line without its newline is
//     being written (or was torn by a crash) and is read again once it
//     is complete;
//   - a complete line that is not a record (a crash's torn line, which the
//     server ends with a newline when it reopens the log) is an EventTorn;
//   - the server takes back a write that failed part way (it truncates
//     the file to the end of its last complete record and reuses the seqs
//     of what it took back): Tail remembers the last records it read
//     (where, their seq and a hash of the line), notices that the file
//     shrank or that the last of them changed, reports the ones the file no
//     longer holds as an EventWithdrawn and goes on after the last one it
//     still holds;
//   - a seq that does not follow the previous one in an otherwise intact
//     log is an EventGap (records removed: see Verify);
//   - a file at the path that is another file now (rotated, recreated) is
//     an EventReplaced, and Tail follows the new one from its start.
//
// It polls the file (every TailOptions.Poll) rather than asking the
// kernel to notify it, which works on every file system.

// EventKind is what an Event reports.
type EventKind uint8

// The events of Tail.
const (
	EventRecord    EventKind = iota // a record the filter matches
	EventTorn                       // a complete line that is not a record
	EventWithdrawn                  // records reported before that the log no longer holds
	EventGap                        // a seq that does not follow the previous record's
	EventReplaced                   // the path names another file now; following it from its start
)

// Event is one thing Tail saw.
type Event struct {
	Kind   EventKind
	Offset int64   // of the line (EventRecord, EventTorn, EventGap)
	Record *Record // EventRecord; valid only during the callback
	Line   []byte  // EventRecord, EventTorn: the line as stored; valid only during the callback
	// Seqs are the seqs of the records an EventWithdrawn takes back, and
	// Shown how many of them the filter had matched.
	Seqs  []uint64
	Shown int
	// Detail says what happened, in words.
	Detail string
}

// TailOptions configure Tail.
type TailOptions struct {
	// Last is how many records before the end to start with (the last
	// Last records the filter matches); 0 starts at the end.
	Last int
	// FromStart reports every record from the start of the log (Last is
	// then ignored).
	FromStart bool
	// Follow keeps reading as the log grows until ctx ends; without it
	// Tail returns at the end of the file.
	Follow bool
	// Poll is how often a follower looks for growth; default 200 ms.
	Poll time.Duration
	// Filter selects the records reported (the other events are reported
	// whatever the filter).
	Filter Filter
}

// DefaultPoll is TailOptions.Poll when unset.
const DefaultPoll = 200 * time.Millisecond

// tailRing bounds how many of the last records Tail remembers to notice
// a write the server took back (it remembers at least half as many).
const tailRing = 4096

// seenLine is a record line Tail reported (or read past).
type seenLine struct {
	off, end int64
	seq      uint64
	sum      uint64 // maphash of the line
	shown    bool
}

// tailer is one Tail's state. Concurrency: one goroutine (Tail's).
type tailer struct {
	path    string
	f       *os.File
	ino     uint64
	off     int64 // the next byte to read: always the start of a line
	seed    maphash.Seed
	ring    []seenLine
	lastSeq uint64 // 0: not known yet
	skipTo  uint64 // records up to this seq were reported before a rewrite: not again
	buf     []byte
	o       TailOptions
	fn      func(*Event) error
	rec     Record
}

// Tail reports the records of the log at path as described above: the
// last o.Last ones first, then (with o.Follow) every record appended,
// until ctx ends (it then returns nil) or fn returns an error (returned).
func Tail(ctx context.Context, path string, o TailOptions, fn func(*Event) error) error {
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	t := &tailer{path: path, seed: maphash.MakeSeed(), o: o, fn: fn, buf: make([]byte, 64<<10)}
	if err := t.open(); err != nil {
		return err
	}
	defer func() { t.f.Close() }()
	if err := t.start(); err != nil {
		return err
	}
	tick := time.NewTicker(o.Poll)
	defer tick.Stop()
	for {
		if err := t.check(); err != nil {
			return err
		}
		if err := t.read(); err != nil {
			return err
		}
		if !o.Follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (t *tailer) open() error {
	f, err := os.Open(t.path)
	if err != nil {
		return fmt.Errorf("audit: tail: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit: tail: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return fmt.Errorf("audit: tail: %s is not a regular file: %w", t.path, ErrInvalid)
	}
	t.f, t.ino = f, inode(fi)
	return nil
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// start places t.off: at the start of the last o.Last matching records,
// which it reports, or at the end of the last complete line.
func (t *tailer) start() error {
	fi, err := t.f.Stat()
	if err != nil {
		return fmt.Errorf("audit: tail: %w", err)
	}
	if t.o.FromStart {
		return nil
	}
	if t.o.Last > 0 && !t.o.Filter.IsZero() {
		return t.startFiltered()
	}
	end, err := t.completeEnd(fi.Size())
	if err != nil {
		return err
	}
	t.off = end
	if t.o.Last > 0 {
		if t.off, err = t.lineStartBack(end, t.o.Last); err != nil {
			return err
		}
	}
	return t.prime()
}

// startFiltered finds the last o.Last records the filter matches with a
// search, reports them, and goes on from where the search stopped.
func (t *tailer) startFiltered() error {
	type hit struct {
		off  int64
		line []byte
	}
	var last []hit
	st, err := Search(io.NewSectionReader(t.f, 0, 1<<62), t.o.Filter, func(m *Match) error {
		if len(last) == t.o.Last {
			last = last[1:]
		}
		last = append(last, hit{m.Offset, bytes.Clone(m.Line)})
		return nil
	})
	if err != nil {
		return fmt.Errorf("audit: tail: %w", err)
	}
	t.off = st.Bytes
	if err := t.prime(); err != nil {
		return err
	}
	for _, h := range last {
		if err := json.Unmarshal(h.line, &t.rec); err != nil {
			continue
		}
		if err := t.fn(&Event{Kind: EventRecord, Offset: h.off, Record: &t.rec, Line: h.line}); err != nil {
			return err
		}
	}
	return nil
}

// completeEnd is the offset just past the last newline before size.
func (t *tailer) completeEnd(size int64) (int64, error) {
	for end := size; end > 0; {
		from := max(0, end-int64(len(t.buf)))
		b := t.buf[:end-from]
		if _, err := t.f.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("audit: tail: %w", err)
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			return from + int64(i) + 1, nil
		}
		end = from
	}
	return 0, nil
}

// lineStartBack is the start of the n-th line before end (a line start).
func (t *tailer) lineStartBack(end int64, n int) (int64, error) {
	pos := end - 1 // skip the newline that ends the last line
	for pos > 0 {
		from := max(0, pos-int64(len(t.buf)))
		b := t.buf[:pos-from]
		if _, err := t.f.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("audit: tail: %w", err)
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] == '\n' {
				n--
				if n == 0 {
					return from + int64(i) + 1, nil
				}
			}
		}
		pos = from
	}
	return 0, nil
}

// prime remembers the record that ends at t.off, so that a write taken
// back right after it is noticed.
func (t *tailer) prime() error {
	if t.off == 0 {
		return nil
	}
	start, err := t.lineStartBack(t.off, 1)
	if err != nil {
		return err
	}
	line := make([]byte, t.off-1-start)
	if _, err := t.f.ReadAt(line, start); err != nil {
		return fmt.Errorf("audit: tail: %w", err)
	}
	var cf chainFields
	if json.Unmarshal(line, &cf) == nil && cf.Seq > 0 {
		t.remember(seenLine{off: start, end: t.off, seq: cf.Seq, sum: maphash.Bytes(t.seed, line)})
	}
	return nil
}

func (t *tailer) remember(s seenLine) {
	if len(t.ring) == tailRing {
		// Forget the older half at once (no copy per record).
		t.ring = t.ring[:copy(t.ring, t.ring[tailRing/2:])]
	}
	t.ring = append(t.ring, s)
	t.lastSeq = s.seq
}

// intact reports whether the file still holds s's line where it was.
func (t *tailer) intact(s seenLine) (bool, error) {
	line := make([]byte, s.end-s.off)
	_, err := t.f.ReadAt(line, s.off)
	if errors.Is(err, io.EOF) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("audit: tail: %w", err)
	}
	return line[len(line)-1] == '\n' && maphash.Bytes(t.seed, line[:len(line)-1]) == s.sum, nil
}

// check notices a replaced file and a write the server took back.
func (t *tailer) check() error {
	fi, err := os.Stat(t.path)
	switch {
	case err == nil && inode(fi) != t.ino:
		return t.replaced("the log at " + t.path + " is another file now")
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("audit: tail: %w", err)
	}
	size, err := t.size()
	if err != nil {
		return err
	}
	if len(t.ring) == 0 {
		if size < t.off {
			return t.replaced(fmt.Sprintf("the log shrank to %d bytes, before the first record read", size))
		}
		return nil
	}
	return t.verify()
}

// verify recovers when the last remembered record is not in the file
// any more.
func (t *tailer) verify() error {
	if len(t.ring) == 0 {
		return nil
	}
	ok, err := t.intact(t.ring[len(t.ring)-1])
	if err != nil || ok {
		return err
	}
	return t.recover()
}

func (t *tailer) size() (int64, error) {
	fi, err := t.f.Stat()
	if err != nil {
		return 0, fmt.Errorf("audit: tail: %w", err)
	}
	return fi.Size(), nil
}

// recover goes back to the last remembered record the file still holds
// and reports the ones after it as withdrawn.
func (t *tailer) recover() error {
	i := len(t.ring) - 1
	for ; i >= 0; i-- {
		ok, err := t.intact(t.ring[i])
		if err != nil {
			return err
		}
		if ok {
			break
		}
	}
	gone := t.ring[i+1:]
	ev := &Event{Kind: EventWithdrawn}
	for _, s := range gone {
		ev.Seqs = append(ev.Seqs, s.seq)
		if s.shown {
			ev.Shown++
		}
	}
	if i < 0 {
		// Nothing remembered is left: the log was rewritten further back
		// than Tail remembers. Records before the oldest remembered one
		// are skipped by seq below.
		base := t.ring[0].seq - 1
		ev.Detail = fmt.Sprintf("the log no longer holds records %d to %d, which were reported, nor is the record before them known; following from the start, skipping seqs up to %d", gone[0].seq, gone[len(gone)-1].seq, base)
		t.ring, t.off, t.lastSeq = t.ring[:0], 0, 0
		t.skipTo = base
		return t.fn(ev)
	}
	ev.Detail = fmt.Sprintf("the server took back %d record(s) after seq %d (a write that failed part way; they were never acknowledged)", len(gone), t.ring[i].seq)
	t.off, t.lastSeq = t.ring[i].end, t.ring[i].seq
	t.ring = t.ring[:i+1]
	return t.fn(ev)
}

func (t *tailer) replaced(why string) error {
	t.f.Close()
	if err := t.open(); err != nil {
		return err
	}
	t.ring, t.off, t.lastSeq, t.skipTo = t.ring[:0], 0, 0, 0
	return t.fn(&Event{Kind: EventReplaced, Detail: why + "; following it from its start"})
}

// read reports the complete lines from t.off to the end of the file.
// After each read it checks that the last record it remembers is still
// where it was, so that what it read follows that record in the file as
// it is now (the server truncates only back to the end of a record).
func (t *tailer) read() error {
	for {
		n, err := t.f.ReadAt(t.buf, t.off)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("audit: tail: %w", err)
		}
		before := t.off
		if err := t.verify(); err != nil {
			return err
		}
		if t.off != before {
			continue // recovered: read again from where the log is whole
		}
		b := t.buf[:n]
		end := bytes.LastIndexByte(b, '\n') + 1
		if end == 0 {
			if n < len(t.buf) {
				return nil // nothing, or a line still being written
			}
			if err := t.longLine(); err != nil {
				return err
			}
			continue
		}
		for pos := 0; pos < end; {
			nl := bytes.IndexByte(b[pos:end], '\n') + pos
			if err := t.line(b[pos:nl], t.off+int64(pos)); err != nil {
				return err
			}
			pos = nl + 1
		}
		t.off += int64(end)
		if n < len(t.buf) {
			return nil
		}
	}
}

// longLine handles a line longer than the buffer: the buffer grows up to
// the longest record; a longer line is no record, and is skipped once it
// is complete.
func (t *tailer) longLine() error {
	if len(t.buf) <= maxLineBytes {
		t.buf = make([]byte, min(2*len(t.buf), maxLineBytes+1))
		return nil
	}
	for pos := t.off + int64(len(t.buf)); ; {
		n, err := t.f.ReadAt(t.buf, pos)
		if i := bytes.IndexByte(t.buf[:n], '\n'); i >= 0 {
			ev := &Event{Kind: EventTorn, Offset: t.off, Detail: fmt.Sprintf("a line of %d bytes, longer than any record", pos+int64(i)-t.off)}
			t.off = pos + int64(i) + 1
			t.buf = make([]byte, 64<<10)
			return t.fn(ev)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil // not complete yet
			}
			return fmt.Errorf("audit: tail: %w", err)
		}
		pos += int64(n)
	}
}

// line reports one complete line found at off.
func (t *tailer) line(l []byte, off int64) error {
	t.rec = Record{}
	if err := json.Unmarshal(l, &t.rec); err != nil || t.rec.Seq == 0 {
		return t.fn(&Event{Kind: EventTorn, Offset: off, Line: l, Detail: "a line that is not a record (a write cut short by a crash)"})
	}
	seq := t.rec.Seq
	s := seenLine{off: off, end: off + int64(len(l)) + 1, seq: seq, sum: maphash.Bytes(t.seed, l)}
	if t.skipTo > 0 && seq <= t.skipTo {
		t.remember(s)
		return nil
	}
	t.skipTo = 0
	if t.lastSeq != 0 && seq != t.lastSeq+1 {
		detail := fmt.Sprintf("seq %d follows seq %d", seq, t.lastSeq)
		if seq > t.lastSeq+1 {
			detail += fmt.Sprintf(": %d record(s) missing (check the log with vmgate audit verify)", seq-t.lastSeq-1)
		}
		if err := t.fn(&Event{Kind: EventGap, Offset: off, Detail: detail}); err != nil {
			return err
		}
	}
	s.shown = t.o.Filter.Match(&t.rec)
	t.remember(s)
	if !s.shown {
		return nil
	}
	return t.fn(&Event{Kind: EventRecord, Offset: off, Record: &t.rec, Line: l})
}
