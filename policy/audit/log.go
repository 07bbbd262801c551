package audit

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Options configure Open.
type Options struct {
	// KeyFile is the HMAC key file; default DefaultKeyFile(path). It is
	// created (0600) when missing and the log is empty or new; a non-empty
	// log without its key file is an error.
	KeyFile string
	// Fsync is FsyncAlways (default) or FsyncInterval.
	Fsync string
	// Interval bounds how long written records stay without fsync: in
	// interval mode all records, in always mode outcome records
	// (AppendLazy). Default DefaultInterval.
	Interval time.Duration
	// Logger receives recovery and failure reports; default slog.Default().
	Logger *slog.Logger

	// maxBatch, when > 0, caps the records per write+fsync. Benchmarks set
	// it to 1 to measure one fsync per record against group commit.
	maxBatch int
}

// Log is an open audit log. Its methods are safe for concurrent use.
type Log struct {
	path     string
	f        *os.File
	always   bool
	interval time.Duration
	maxBatch int
	logger   *slog.Logger
	torn     []TornLine

	// mu guards closed and orders appends against Close: appenders hold the
	// read lock until their record is committed (or queued, for lazy ones),
	// Close takes the write lock.
	mu     sync.RWMutex
	closed bool
	stop   chan struct{} // closed by Close: the writer commits what is left and exits
	done   chan struct{} // closed when the writer has exited

	// lazyMu guards lazy and lazyArmed: the encoded bodies of lazy appends
	// waiting to ride with the next commit, and whether lazyTimer runs to
	// flush them at most interval after the first of them. AppendLazy holds
	// mu's read lock while it adds to lazy, so nothing is added after Close.
	lazyMu    sync.Mutex
	lazy      [][]byte
	lazyArmed bool
	lazyTimer *time.Timer   // Reset under lazyMu; the writer receives from it
	kick      chan struct{} // wakes the writer to commit pending requests or a long lazy backlog

	// pendMu guards pending: durable requests waiting for a commit. Whoever
	// releases writeMu checks pending afterwards (unlockWrite), so a request
	// queued while a commit ran is never left behind.
	pendMu  sync.Mutex
	pending []*request

	// failed is set together with broken, for AppendLazy.
	failed atomic.Bool
	// Counters of the writer's I/O, for Stats.
	writes, syncs, records atomic.Uint64

	// writeMu guards everything below: whoever commits holds it, the writer
	// goroutine or an Append that found the log idle and commits its record
	// itself (no hand-off to another goroutine on the call path).
	writeMu    sync.Mutex
	flushTimer *time.Timer // fsyncs written records interval after they were written
	flushArmed bool
	batch      []*request // the batch of an inline commit
	seq        uint64
	prevHash   string
	size       int64 // offset of the end of the last complete record
	// reserved is the size up to which blocks are reserved ahead of the
	// appends (reserveLocked); -1 once the file system refused for good.
	reserved int64
	dirty    bool  // written since the last fsync
	broken   error // set after a failure that left the file in doubt
	mac      hash.Hash
	buf      []byte
	seqs     []uint64 // the seqs of the batch being committed
	spare    [][]byte // the lazy slice the writer hands back for reuse
}

// maxLazy is the lazy backlog at which AppendLazy wakes the writer instead
// of waiting for the next commit or the timer.
const maxLazy = 1024

// Stats counts a Log's I/O since Open.
type Stats struct {
	Records uint64 // records written
	Writes  uint64 // write(2) calls, one per batch
	Syncs   uint64 // fsync calls
}

// Stats returns the log's I/O counts. Tests use it to hold the fsync budget
// (one shared fsync per durable append, none for lazy ones); operators to
// see how well appends are grouped.
func (l *Log) Stats() Stats {
	return Stats{Records: l.records.Load(), Writes: l.writes.Load(), Syncs: l.syncs.Load()}
}

var requestPool = sync.Pool{New: func() any { return &request{wait: make(chan reply, 1)} }}

// request is one queued record.
type request struct {
	body []byte     // the record marshalled without seq, prev_hash and hash
	wait chan reply // nil for a lazy append
	// written: answer once written; the fsync comes with the next group
	// commit or the timed flush (AppendWritten).
	written bool
}

type reply struct {
	seq uint64
	err error
}

// Open opens (creating it 0600 if needed) the log at path for appending. It
// verifies the whole existing chain with the key and refuses a log whose
// chain is broken (the error wraps ErrTampered). A torn last line is kept,
// terminated with a newline, logged and returned by Torn; appends continue
// the chain from the last good record. Only one Log may have a file open at
// a time (an exclusive flock); a second Open fails.
func Open(path string, opts Options) (*Log, error) {
	l, keyFile, err := newLog(path, opts)
	if err != nil {
		return nil, err
	}
	_, statErr := os.Stat(path)
	isNew := errors.Is(statErr, fs.ErrNotExist)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
		}
	}()
	key, err := lockAndKey(f, path, keyFile, isNew)
	if err != nil {
		return nil, err
	}
	rep, err := walk(f, key, nil)
	if err != nil {
		return nil, fmt.Errorf("audit: open: %s: %w", path, err)
	}
	l.seq, l.prevHash, l.torn = rep.LastSeq, rep.LastHash, rep.Torn
	end, err := terminateLastLine(f)
	if err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	for _, t := range l.torn {
		l.logger.Warn("audit: torn line in log (incomplete write, e.g. a crash); the chain continues after it",
			"path", path, "line", t.Line, "offset", t.Offset, "seq", t.Seq)
	}
	l.size = end
	l.f = f
	l.mac = hmac.New(sha256.New, key)
	l.stop = make(chan struct{})
	l.done = make(chan struct{})
	l.kick = make(chan struct{}, 1)
	l.lazyTimer = time.NewTimer(time.Hour)
	l.lazyTimer.Stop()
	l.flushTimer = time.NewTimer(time.Hour)
	l.flushTimer.Stop()
	go l.writer()
	ok = true
	return l, nil
}

// newLog is the Log opts describe for path, not open yet, and the file of
// its key.
func newLog(path string, opts Options) (*Log, string, error) {
	l := &Log{
		path:     path,
		always:   true,
		interval: opts.Interval,
		maxBatch: opts.maxBatch,
		logger:   opts.Logger,
	}
	switch opts.Fsync {
	case "", FsyncAlways:
	case FsyncInterval:
		l.always = false
	default:
		return nil, "", fmt.Errorf("audit: open: fsync %q: want %q or %q: %w", opts.Fsync, FsyncAlways, FsyncInterval, ErrInvalid)
	}
	if l.interval == 0 {
		l.interval = DefaultInterval
	}
	if l.interval < 0 {
		return nil, "", fmt.Errorf("audit: open: negative interval %v: %w", l.interval, ErrInvalid)
	}
	if l.logger == nil {
		l.logger = slog.Default()
	}
	keyFile := opts.KeyFile
	if keyFile == "" {
		keyFile = DefaultKeyFile(path)
	}
	return l, keyFile, nil
}

// lockAndKey takes the exclusive flock on f (the log at path), checks that
// it is a regular file and returns its key: keyFile's, made anew for an
// empty log. A log just created (isNew) has its directory synced.
func lockAndKey(f *os.File, path, keyFile string, isNew bool) ([]byte, error) {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return nil, fmt.Errorf("audit: open: %s is %w: %w", path, ErrInUse, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("audit: open: %s: not a regular file: %w", path, ErrInvalid)
	}
	var key []byte
	if fi.Size() == 0 {
		key, err = LoadOrCreateKey(keyFile)
	} else {
		key, err = LoadKey(keyFile)
	}
	if err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	if isNew {
		if err := syncDir(filepath.Dir(path)); err != nil {
			return nil, fmt.Errorf("audit: open: %w", err)
		}
	}
	return key, nil
}

// terminateLastLine ends f with a newline if it does not end with one (a
// torn tail, or a complete record whose newline was lost), so the next
// record starts on its own line, and returns f's size.
func terminateLastLine(f *os.File) (int64, error) {
	end, err := f.Seek(0, 2)
	if err != nil || end == 0 {
		return end, err
	}
	var last [1]byte
	if _, err := f.ReadAt(last[:], end-1); err != nil {
		return 0, err
	}
	if last[0] == '\n' {
		return end, nil
	}
	if _, err := f.Write([]byte{'\n'}); err != nil {
		return 0, fmt.Errorf("terminate torn line: %w", err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("terminate torn line: %w", err)
	}
	return end + 1, nil
}

// Torn returns the torn lines Open found (nil when none).
func (l *Log) Torn() []TornLine { return append([]TornLine(nil), l.torn...) }

// Path returns the log's path.
func (l *Log) Path() string { return l.path }

// Append appends rec and returns its seq once it is durable (Fsync always) or
// written (Fsync interval). The record is validated first (a bad record is an
// error wrapping ErrInvalid and nothing is written) and its Args redacted.
// Any error means the record may not be in the log: the caller must deny.
// If ctx ends first, Append returns ctx.Err(); the record may still be
// written later (a decision without an outcome).
func (l *Log) Append(ctx context.Context, rec Record) (uint64, error) {
	return l.append(ctx, rec, false)
}

// AppendWritten is Append without the wait for an fsync of its own, for a
// decision that reserves nothing and changes nothing (a read-only call): it
// returns once the record is written to the file, so a crash of the process
// loses nothing, and the record is fsynced with the next group commit or,
// when none comes, Options.Interval after it was written (only a power loss
// within that time can lose it). With Fsync interval it is Append. It never
// starts an fsync, but it may wait for one that is running when it arrives
// (commits are serial).
func (l *Log) AppendWritten(ctx context.Context, rec Record) (uint64, error) {
	return l.append(ctx, rec, true)
}

func (l *Log) append(ctx context.Context, rec Record, written bool) (uint64, error) {
	body, err := encodeBody(&rec)
	if err != nil {
		return 0, fmt.Errorf("audit: append: %w", err)
	}
	req := requestPool.Get().(*request)
	req.body, req.written = body, written
	if err := l.commitOrEnqueue(ctx, req); err != nil {
		req.body = nil
		requestPool.Put(req)
		return 0, fmt.Errorf("audit: append: %w", err)
	}
	select {
	case r := <-req.wait:
		// The writer is done with req: reuse it.
		req.body = nil
		requestPool.Put(req)
		if r.err != nil {
			return 0, fmt.Errorf("audit: append: %w", r.err)
		}
		return r.seq, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("audit: append: %w", ctx.Err())
	}
}

// AppendLazy records rec (an outcome record, or the record of a refused
// call) and returns without waiting and without costing a write or an
// fsync of its own: the record is held in memory and written with the next
// batch, so it is fsynced by the next group commit, or, when no commit
// comes, written and fsynced Options.Interval after it was appended. It
// returns an error only when rec is invalid or the log cannot take it
// (closed, broken); a later write failure is logged. A crash may lose a
// lazily appended record.
func (l *Log) AppendLazy(ctx context.Context, rec Record) error {
	body, err := encodeBody(&rec)
	if err != nil {
		return fmt.Errorf("audit: append lazy: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("audit: append lazy: %w", err)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return fmt.Errorf("audit: append lazy: %w", ErrClosed)
	}
	if l.failed.Load() {
		return fmt.Errorf("audit: append lazy: %w", ErrBroken)
	}
	l.lazyMu.Lock()
	l.lazy = append(l.lazy, body)
	n := len(l.lazy)
	if !l.lazyArmed {
		l.lazyArmed = true
		l.lazyTimer.Reset(l.interval)
	}
	l.lazyMu.Unlock()
	if n >= maxLazy {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// takeLazy returns the lazy bodies waiting and disarms their timer. writeMu held.
func (l *Log) takeLazy() [][]byte {
	l.lazyMu.Lock()
	defer l.lazyMu.Unlock()
	if l.lazyArmed {
		l.lazyTimer.Stop() // no stale tick is delivered after Stop (Go 1.23 timers)
		l.lazyArmed = false
	}
	lazy := l.lazy
	l.lazy = l.spare[:0]
	l.spare = nil
	return lazy
}

func (l *Log) lazyLen() int {
	l.lazyMu.Lock()
	defer l.lazyMu.Unlock()
	return len(l.lazy)
}

// recycleLazy hands a taken lazy slice back for reuse. writeMu held.
func (l *Log) recycleLazy(lazy [][]byte) {
	if cap(lazy) > 4*maxLazy {
		return
	}
	clear(lazy)
	l.lazyMu.Lock()
	l.spare = lazy[:0]
	l.lazyMu.Unlock()
}

// commitOrEnqueue queues req and, when no commit is running, commits it
// (with whatever else is queued) in the caller: no hand-off to another
// goroutine on the call path. Requests that arrive while a commit runs wait
// for the next one, which the committer leaves to the writer goroutine
// (unlockWrite), so they share one write(2) and one fsync. Either way
// req.wait gets the reply.
func (l *Log) commitOrEnqueue(ctx context.Context, req *request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return ErrClosed
	}
	l.pendMu.Lock()
	l.pending = append(l.pending, req)
	l.pendMu.Unlock()
	if l.writeMu.TryLock() {
		l.commitPendingLocked()
		l.unlockWrite(false)
	}
	return nil
}

// takePending takes up to maxBatch queued requests.
func (l *Log) takePending() []*request {
	l.pendMu.Lock()
	defer l.pendMu.Unlock()
	n := len(l.pending)
	if l.maxBatch > 0 {
		n = min(n, l.maxBatch)
	}
	if n == 0 {
		return nil
	}
	batch := append(l.batch[:0], l.pending[:n]...)
	rest := copy(l.pending, l.pending[n:])
	clear(l.pending[rest:])
	l.pending = l.pending[:rest]
	return batch
}

func (l *Log) hasPending() bool {
	l.pendMu.Lock()
	defer l.pendMu.Unlock()
	return len(l.pending) > 0
}

// commitPendingLocked commits the queued requests and the lazy records
// waiting; false when no request was queued. writeMu held.
func (l *Log) commitPendingLocked() bool {
	batch := l.takePending()
	if len(batch) == 0 {
		return false
	}
	l.commitLocked(l.takeLazy(), batch)
	l.scheduleFlushLocked()
	clear(batch)
	l.batch = batch[:0]
	return true
}

// unlockWrite releases writeMu, then makes sure requests queued meanwhile
// are committed: the writer goroutine (drain) commits them itself. An
// appender commits them once itself when that is only a write(2) (no
// request among them waits for an fsync), which costs it a few
// microseconds and saves waking the writer and then the waiters from it;
// otherwise it wakes the writer, so an appender is not kept fsyncing for
// others.
func (l *Log) unlockWrite(drain bool) {
	helped := false
	for {
		l.writeMu.Unlock()
		if !l.hasPending() {
			return
		}
		if !drain && (helped || !l.pendingWriteOnly()) {
			select {
			case l.kick <- struct{}{}:
			default: // a kick is already waiting: the writer will look
			}
			return
		}
		if !l.writeMu.TryLock() {
			return // the holder checks pending when it unlocks
		}
		helped = true
		l.commitPendingLocked()
	}
}

// pendingWriteOnly reports whether committing the next batch of queued
// requests needs no fsync.
func (l *Log) pendingWriteOnly() bool {
	if !l.always {
		return true
	}
	l.pendMu.Lock()
	defer l.pendMu.Unlock()
	n := len(l.pending)
	if l.maxBatch > 0 {
		n = min(n, l.maxBatch)
	}
	return !needsSync(l.pending[:n])
}

// Close writes and fsyncs every queued record, then closes the file.
// Appends after Close fail with ErrClosed. Close is idempotent.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.done
		return nil
	}
	l.closed = true
	close(l.stop)
	l.mu.Unlock()
	<-l.done
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	l.flushTimer.Stop()
	var err error
	if l.dirty && l.broken == nil {
		l.syncs.Add(1)
		err = l.f.Sync()
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("audit: close: %w", err)
	}
	return nil
}

// encodeBody validates rec, fills its time and encodes it, arguments
// redacted, without the fields the writer assigns (see appendBody).
func encodeBody(rec *Record) ([]byte, error) {
	if rec.Seq != 0 || rec.PrevHash != "" || rec.Hash != "" {
		return nil, fmt.Errorf("seq, prev_hash and hash are set by the log: %w", ErrInvalid)
	}
	if err := checkKind(rec); err != nil {
		return nil, err
	}
	if rec.CallID == "" {
		return nil, fmt.Errorf("record without a call id: %w", ErrInvalid)
	}
	if rec.DurationMS < 0 || math.IsNaN(rec.DurationMS) || math.IsInf(rec.DurationMS, 0) {
		return nil, fmt.Errorf("duration_ms %v: want a finite number >= 0: %w", rec.DurationMS, ErrInvalid)
	}
	for i, c := range rec.Counters {
		if c.Key == "" || c.Window < time.Millisecond || c.Max < 0 {
			return nil, fmt.Errorf("counters[%d]: need a key, window_ms > 0 and max >= 0: %w", i, ErrInvalid)
		}
	}
	if rec.Time.IsZero() {
		rec.Time = time.Now()
	}
	rec.Time = rec.Time.UTC()
	if !rec.SnapshotTaken.IsZero() {
		rec.SnapshotTaken = rec.SnapshotTaken.UTC()
	}
	body, err := appendBody(make([]byte, 0, 384), rec)
	if err != nil {
		return nil, fmt.Errorf("encode: %v: %w", err, ErrInvalid)
	}
	if len(body) > MaxRecordBytes {
		return nil, fmt.Errorf("%d bytes, at most %d: %w", len(body), MaxRecordBytes, ErrTooLarge)
	}
	return body, nil
}

// checkKind checks what rec's kind requires of its fields.
func checkKind(rec *Record) error {
	advanceFields := rec.Units != 0 || rec.ValidMS != 0
	switch rec.Kind {
	case KindDecision:
		if rec.Decision == "" {
			return fmt.Errorf("decision record without a decision: %w", ErrInvalid)
		}
		if rec.Refunded {
			return fmt.Errorf("decision record marked refunded: %w", ErrInvalid)
		}
		if rec.Advance != "" && len(rec.Counters) == 0 {
			return fmt.Errorf("decision record naming an advance without counters: %w", ErrInvalid)
		}
	case KindOutcome:
		if rec.Outcome == "" {
			return fmt.Errorf("outcome record without an outcome: %w", ErrInvalid)
		}
		if len(rec.Counters) > 0 || rec.Advance != "" {
			return fmt.Errorf("outcome record with counters or an advance (reservations belong to the decision record): %w", ErrInvalid)
		}
	case KindAdvance:
		if len(rec.Counters) == 0 || rec.Units < 1 || rec.ValidMS < 1 || rec.Advance != "" {
			return fmt.Errorf("advance record needs counters, units >= 1 and valid_ms >= 1: %w", ErrInvalid)
		}
		return nil
	case KindAdvanceEnd:
		if len(rec.Counters) > 0 || rec.Units < 0 || rec.ValidMS != 0 || rec.Advance != "" {
			return fmt.Errorf("advance end record with counters, negative units or valid_ms: %w", ErrInvalid)
		}
		return nil
	default:
		return fmt.Errorf("kind %q: want %q, %q, %q or %q: %w", rec.Kind, KindDecision, KindOutcome, KindAdvance, KindAdvanceEnd, ErrInvalid)
	}
	if advanceFields {
		return fmt.Errorf("%s record with units or valid_ms (they belong to advance records): %w", rec.Kind, ErrInvalid)
	}
	return nil
}

// writer is the goroutine that commits what appenders queued while another
// commit was running (woken by kick), commits a long lazy backlog, and runs
// the timed flushes.
func (l *Log) writer() {
	defer close(l.done)
	for {
		select {
		case <-l.flushTimer.C:
			l.flush()
		case <-l.lazyTimer.C:
			// Lazy records waited an interval without a commit to ride
			// with: write them and make them durable now.
			l.writeMu.Lock()
			l.commitLocked(l.takeLazy(), nil)
			l.unlockWrite(true)
			l.flush()
		case <-l.kick:
			// Requests queued behind a commit, or a long lazy backlog.
			l.writeMu.Lock()
			if !l.commitPendingLocked() && l.lazyLen() >= maxLazy {
				l.commitLocked(l.takeLazy(), nil)
				l.scheduleFlushLocked()
			}
			l.unlockWrite(true)
		case <-l.stop:
			// Close set closed: nothing new is queued. Commit what is.
			l.writeMu.Lock()
			for l.hasPending() {
				l.commitPendingLocked()
			}
			l.commitLocked(l.takeLazy(), nil)
			l.writeMu.Unlock()
			return
		}
	}
}

// reserveChunk is how far ahead of the appends the log reserves blocks.
const reserveChunk = 1 << 20

// reserveBlocksFn is reserveBlocks (a variable for tests).
var reserveBlocksFn = reserveBlocks

// reserveLocked makes sure the blocks for the next n bytes of the log are
// reserved, reserving them a chunk at a time (fallocate with
// FALLOC_FL_KEEP_SIZE: the size, and so what readers see, is unchanged).
// An append into reserved blocks allocates nothing when its data is
// written back, so the fsync after it writes the data and the inode, not
// the allocation's metadata as well: on ext4 an fsync after a small append
// took 0.65 ms instead of 0.76 (p50 of 1500 on the lab machine's disk).
// Where the file system cannot reserve (errors.ErrUnsupported), the log
// stops trying; after another error (a full disk) it tries again a chunk
// later. At most a chunk of blocks past the end stays reserved. writeMu
// held.
func (l *Log) reserveLocked(n int64) {
	if l.reserved < 0 || l.size+n <= l.reserved {
		return
	}
	err := reserveBlocksFn(l.f, l.size, n+reserveChunk)
	l.reserved = l.size + n + reserveChunk
	switch {
	case err == nil:
	case errors.Is(err, errors.ErrUnsupported):
		l.reserved = -1
		l.logger.Debug("audit: the file system cannot reserve blocks ahead of the log; appends allocate as they go", "path", l.path, "err", err)
	default:
		l.logger.Debug("audit: cannot reserve blocks ahead of the log now", "path", l.path, "err", err)
	}
}

// scheduleFlushLocked arms the flush timer while written records wait for
// an fsync, and stops it when none do.
func (l *Log) scheduleFlushLocked() {
	switch {
	case l.dirty && !l.flushArmed:
		l.flushTimer.Reset(l.interval)
		l.flushArmed = true
	case !l.dirty && l.flushArmed:
		l.flushTimer.Stop() // no stale tick is delivered after Stop (Go 1.23 timers)
		l.flushArmed = false
	}
}

// flush is the timed fsync of written records. It waits for the disk
// without writeMu, so appends keep committing meanwhile (an fsync covers
// what was written before it began; what they write stays dirty for the
// next flush, or for their own fsync in always mode). Writer goroutine only.
func (l *Log) flush() {
	l.writeMu.Lock()
	l.flushArmed = false
	if !l.dirty || l.broken != nil {
		l.unlockWrite(true)
		return
	}
	l.dirty = false
	l.unlockWrite(true)
	l.syncs.Add(1)
	err := l.f.Sync()
	l.writeMu.Lock()
	if err != nil && l.broken == nil {
		l.failed.Store(true)
		l.broken = fmt.Errorf("fsync: %w: %w", err, ErrBroken)
		l.logger.Error("audit: fsync failed; the log refuses appends until reopened", "path", l.path, "err", err)
	}
	l.scheduleFlushLocked()
	l.unlockWrite(true)
}

// syncLocked fsyncs written records. writeMu held.
func (l *Log) syncLocked() {
	if !l.dirty || l.broken != nil {
		return
	}
	l.syncs.Add(1)
	if err := l.f.Sync(); err != nil {
		l.failed.Store(true)
		l.broken = fmt.Errorf("fsync: %w: %w", err, ErrBroken)
		l.logger.Error("audit: fsync failed; the log refuses appends until reopened", "path", l.path, "err", err)
		return
	}
	l.dirty = false
}

// needsSync reports whether a request of batch waits for durability.
func needsSync(batch []*request) bool {
	for _, r := range batch {
		if !r.written {
			return true
		}
	}
	return false
}

// commitLocked writes the lazy bodies, then batch, with one write(2), and
// answers batch's waiters after one fsync when any of them waits for
// durability (Fsync always, and not every one an AppendWritten). writeMu
// held.
func (l *Log) commitLocked(lazy [][]byte, batch []*request) {
	defer l.recycleLazy(lazy)
	if len(lazy) == 0 && len(batch) == 0 {
		return
	}
	answer := func(err error) {
		if err != nil && len(lazy) > 0 {
			l.logger.Error("audit: lazily appended records lost", "path", l.path, "records", len(lazy), "err", err)
		}
		for i, r := range batch {
			var s uint64
			if err == nil {
				s = l.seqs[i]
			}
			r.wait <- reply{seq: s, err: err}
		}
	}
	if l.broken != nil {
		answer(l.broken)
		return
	}
	buf, seq, last := l.chainLocked(lazy, batch)
	if cap(buf) <= 1<<20 {
		l.buf = buf
	}
	l.reserveLocked(int64(len(buf)))
	l.writes.Add(1)
	if _, err := l.f.Write(buf); err != nil {
		l.undoWriteLocked(err)
		answer(fmt.Errorf("write: %w", err))
		return
	}
	l.records.Add(uint64(len(lazy) + len(batch)))
	l.seq, l.prevHash = seq, last
	l.size += int64(len(buf))
	l.dirty = true
	if l.always && needsSync(batch) {
		l.syncLocked()
		if l.broken != nil {
			answer(l.broken)
			return
		}
	}
	answer(nil)
}

// chainLocked encodes lazy, then batch, as the next records of the chain
// into one buffer (l.buf reused), and returns it, the last sequence number
// and the last record's hash; l.seqs gets batch's sequence numbers.
// writeMu held.
func (l *Log) chainLocked(lazy [][]byte, batch []*request) (buf []byte, seq uint64, last string) {
	seq = l.seq
	buf = l.buf[:0]
	var prev []byte // the previous record's hash, in buf once the first record is in
	if len(l.prevHash) > 0 {
		prev = []byte(l.prevHash)
	}
	var sum [sha256.Size]byte
	add := func(body []byte) {
		seq++
		start := len(buf)
		buf = append(buf, `{"seq":`...)
		buf = strconv.AppendUint(buf, seq, 10)
		buf = append(buf, `,"prev_hash":"`...)
		buf = append(buf, prev...)
		buf = append(buf, `",`...)
		buf = append(buf, body[1:]...)
		l.mac.Reset()
		l.mac.Write(prev)
		l.mac.Write(buf[start:])
		buf = buf[:len(buf)-1]
		buf = append(buf, `,"hash":"`...)
		h := len(buf)
		buf = hex.AppendEncode(buf, l.mac.Sum(sum[:0]))
		buf = append(buf, "\"}\n"...)
		prev = buf[h : h+2*sha256.Size]
	}
	for _, body := range lazy {
		add(body)
	}
	l.seqs = l.seqs[:0]
	for _, r := range batch {
		add(r.body)
		l.seqs = append(l.seqs, seq)
	}
	// buf may have been reallocated after prev was taken: take it again.
	last = string(buf[len(buf)-2-2*sha256.Size-1 : len(buf)-3])
	return buf, seq, last
}

// undoWriteLocked takes back whatever part of a failed write reached the
// file, so the chain ends at the last complete record and readers can
// verify it; a log it cannot truncate is broken. writeMu held.
func (l *Log) undoWriteLocked(err error) {
	l.reserved = 0 // a truncate frees the blocks past the end
	if terr := l.f.Truncate(l.size); terr != nil {
		l.failed.Store(true)
		l.broken = fmt.Errorf("write: %w; truncate back: %v: %w", err, terr, ErrBroken)
		l.logger.Error("audit: write failed and could not be undone; the log refuses appends until reopened",
			"path", l.path, "err", err, "truncate_err", terr)
	}
}
