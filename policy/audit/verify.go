package audit

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// ProblemKind classifies the first bad record Verify finds.
type ProblemKind string

// The problem kinds.
const (
	// ProblemAltered: the hash does not match the line: a byte of it was
	// changed, or it was forged, or the key is not the log's key.
	ProblemAltered ProblemKind = "altered"
	// ProblemInserted: a line with a wrong hash whose next record continues
	// the chain from the record before it.
	ProblemInserted ProblemKind = "inserted"
	// ProblemRemoved: a genuine record whose seq skips ahead: records before
	// it are missing.
	ProblemRemoved ProblemKind = "removed"
	// ProblemReordered: a genuine record out of its place (seq behind, or the
	// skipped record follows it).
	ProblemReordered ProblemKind = "reordered"
	// ProblemUnlinked: a genuine record with the expected seq whose prev_hash
	// is not the previous record's hash (spliced from another log).
	ProblemUnlinked ProblemKind = "unlinked"
	// ProblemMalformed: a line that is not a record, in the middle of the log,
	// and not a torn line (the chain does not continue after it).
	ProblemMalformed ProblemKind = "malformed"
)

// Problem is the first bad record.
type Problem struct {
	Line   int         // 1-based line number
	Offset int64       // byte offset of the line
	Seq    uint64      // the seq in the line, 0 when unreadable
	Want   uint64      // the seq expected at that line
	Kind   ProblemKind //
	Detail string      // what exactly is wrong
}

// TornLine is a line cut short by a crash: not a record, and either the last
// line of the log or followed by a record that continues the chain from the
// record before it.
type TornLine struct {
	Line   int
	Offset int64
	Seq    uint64 // the seq the torn record would have had
	Last   bool   // the log's last line (a truncated tail)
}

// Report is what Verify found.
type Report struct {
	Records  int    // records that verified
	Lines    int    // lines read
	LastSeq  uint64 // seq of the last good record (0: none)
	LastHash string // hash of the last good record ("" : none)
	// Torn lists torn lines, in order. They are crash artefacts, not
	// tampering: the chain verified around them.
	Torn []TornLine
	// Bad is the first bad record; nil when the chain verified.
	Bad *Problem
}

// OK reports whether the chain verified (torn lines allowed).
func (r Report) OK() bool { return r.Bad == nil }

// TornTail reports whether the last line of the log is torn.
func (r Report) TornTail() bool { return len(r.Torn) > 0 && r.Torn[len(r.Torn)-1].Last }

// ChainError is returned with a Report whose Bad is set. It wraps ErrTampered.
type ChainError struct{ Problem Problem }

func (e *ChainError) Error() string {
	p := e.Problem
	seq := "unreadable seq"
	if p.Seq != 0 {
		seq = fmt.Sprintf("seq %d", p.Seq)
	}
	return fmt.Sprintf("line %d (%s, want seq %d): %s: %s", p.Line, seq, p.Want, p.Kind, p.Detail)
}

func (e *ChainError) Unwrap() error { return ErrTampered }

// Verify reads a log from r and checks its chain with key: every line must be
// the record that follows the previous one (seq+1, prev_hash equal to its
// hash, hash matching its bytes). It stops at the first bad record and
// returns it in Report.Bad together with a *ChainError (wrapping
// ErrTampered). Torn lines are reported in Report.Torn and are not an error.
// Other errors are read errors.
func Verify(r io.Reader, key []byte) (Report, error) {
	if len(key) != KeySize {
		return Report{}, fmt.Errorf("audit: verify: key has %d bytes, want %d: %w", len(key), KeySize, ErrKeyFile)
	}
	rep, err := walk(r, key, nil)
	if err != nil {
		return rep, fmt.Errorf("audit: verify: %w", err)
	}
	return rep, nil
}

// Read calls fn with every record of the log at path, in order, skipping torn
// lines. It checks the chain's links (seq and prev_hash) but not the hashes,
// which need the key: use it on a log that Open or Verify accepted, for
// example to rebuild counters from decision records (Counters) and refunds
// (outcome records with Refunded). An error from fn stops Read and is
// returned.
func Read(path string, fn func(Record) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("audit: read: %w", err)
	}
	defer f.Close()
	if _, err := walk(f, nil, fn); err != nil {
		return fmt.Errorf("audit: read: %w", err)
	}
	return nil
}

// hashSuffixLen is len(`,"hash":"` + 64 hex + `"}`).
const hashSuffixLen = len(`,"hash":"`) + 2*sha256.Size + len(`"}`)

// maxTornRun bounds how many consecutive non-record lines may be torn lines
// (each crash leaves at most one).
const maxTornRun = 16

// line is one line of a log, parsed.
type line struct {
	no      int
	off     int64
	newline bool
	rec     *Record // nil: not a record
	why     string  // why it is not a record
	macOK   bool
}

// lineReader reads and parses lines, with lookahead.
type lineReader struct {
	br    *bufio.Reader
	key   []byte
	mac   hash.Hash
	full  bool // decode whole records (for Read), not only the chain fields
	no    int
	off   int64
	ahead []line
	eof   bool
	err   error
}

func (lr *lineReader) readRaw() (raw []byte, newline bool, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := lr.br.ReadSlice('\n')
		if len(buf)+len(chunk) <= maxLineBytes {
			buf = append(buf, chunk...)
		} else {
			tooLong = true
		}
		lr.off += int64(len(chunk))
		switch {
		case err == nil:
			return buf[:len(buf)-1], true, tooLong, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(buf) == 0 && !tooLong {
				return nil, false, false, io.EOF
			}
			return buf, false, tooLong, nil
		default:
			return nil, false, false, err
		}
	}
}

// next reads and parses the next line into the lookahead queue.
func (lr *lineReader) fill() bool {
	if lr.eof || lr.err != nil {
		return false
	}
	start := lr.off
	raw, nl, tooLong, err := lr.readRaw()
	if errors.Is(err, io.EOF) {
		lr.eof = true
		return false
	}
	if err != nil {
		lr.err = err
		return false
	}
	lr.no++
	l := line{no: lr.no, off: start, newline: nl}
	if tooLong {
		l.why = fmt.Sprintf("line longer than %d bytes", maxLineBytes)
	} else {
		l.rec, l.macOK, l.why = lr.parse(raw)
	}
	lr.ahead = append(lr.ahead, l)
	return true
}

// peek returns the i-th line ahead (0: the next one).
func (lr *lineReader) peek(i int) (line, bool) {
	for len(lr.ahead) <= i {
		if !lr.fill() {
			return line{}, false
		}
	}
	return lr.ahead[i], true
}

func (lr *lineReader) pop() (line, bool) {
	l, ok := lr.peek(0)
	if ok {
		lr.ahead = lr.ahead[1:]
	}
	return l, ok
}

// chainFields is what Verify needs of a record.
type chainFields struct {
	Seq      uint64 `json:"seq"`
	PrevHash string `json:"prev_hash"`
	Hash     string `json:"hash"`
}

func (lr *lineReader) parse(raw []byte) (*Record, bool, string) {
	if len(raw) < hashSuffixLen+2 || raw[0] != '{' {
		return nil, false, "not a record"
	}
	suffix := raw[len(raw)-hashSuffixLen:]
	if !bytes.HasPrefix(suffix, []byte(`,"hash":"`)) || !bytes.HasSuffix(suffix, []byte(`"}`)) {
		return nil, false, "no hash at the end of the line"
	}
	sum := suffix[len(`,"hash":"`) : len(suffix)-2]
	var want [sha256.Size]byte
	if n, err := hex.Decode(want[:], sum); err != nil || n != sha256.Size || !isLowerHex(sum) {
		return nil, false, "hash is not 64 lowercase hex digits"
	}
	rec := new(Record)
	if lr.full {
		if err := json.Unmarshal(raw, rec); err != nil {
			return nil, false, "not valid JSON: " + err.Error()
		}
	} else {
		var cf chainFields
		if err := json.Unmarshal(raw, &cf); err != nil {
			return nil, false, "not valid JSON: " + err.Error()
		}
		rec.Seq, rec.PrevHash, rec.Hash = cf.Seq, cf.PrevHash, cf.Hash
	}
	if rec.Seq == 0 {
		return nil, false, "seq missing or 0"
	}
	if lr.key == nil {
		return rec, true, ""
	}
	lr.mac.Reset()
	lr.mac.Write([]byte(rec.PrevHash))
	lr.mac.Write(raw[:len(raw)-hashSuffixLen])
	lr.mac.Write([]byte{'}'})
	var got [sha256.Size]byte
	return rec, hmac.Equal(lr.mac.Sum(got[:0]), want[:]), ""
}

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// misplaced says how rec, a genuine record (its hash holds) that does not
// continue the chain after the record lastSeq, breaks it: records missing
// before it, records out of order, or a prev_hash that is not the previous
// record's.
func misplaced(rec *Record, lr *lineReader, lastSeq uint64) (ProblemKind, string) {
	want := lastSeq + 1
	switch {
	case rec.Seq > want:
		if n, ok := lr.peek(0); ok && n.rec != nil && n.macOK && n.rec.Seq == want {
			return ProblemReordered, fmt.Sprintf("seq %d comes before seq %d", rec.Seq, want)
		}
		if rec.Seq > want+1 {
			return ProblemRemoved, fmt.Sprintf("seq %d to %d are missing", want, rec.Seq-1)
		}
		return ProblemRemoved, fmt.Sprintf("seq %d is missing", want)
	case rec.Seq < want:
		return ProblemReordered, fmt.Sprintf("seq %d after seq %d", rec.Seq, lastSeq)
	}
	return ProblemUnlinked, "prev_hash is not the hash of the previous record"
}

// walk checks the chain of the log in r (the hashes too when key is not nil)
// and calls fn, if not nil, with every good record.
func walk(r io.Reader, key []byte, fn func(Record) error) (Report, error) {
	lr := &lineReader{br: bufio.NewReaderSize(r, 64<<10), key: key, full: fn != nil}
	if key != nil {
		lr.mac = hmac.New(sha256.New, key)
	}
	var rep Report
	bad := func(l line, seq uint64, kind ProblemKind, detail string) (Report, error) {
		p := Problem{Line: l.no, Offset: l.off, Seq: seq, Want: rep.LastSeq + 1, Kind: kind, Detail: detail}
		rep.Bad = &p
		return rep, &ChainError{Problem: p}
	}
	// continues reports whether l is the genuine record after the last good one.
	continues := func(l line) bool {
		return l.rec != nil && l.macOK && l.rec.Seq == rep.LastSeq+1 && l.rec.PrevHash == rep.LastHash
	}
	for {
		l, ok := lr.pop()
		if !ok {
			break
		}
		rep.Lines = l.no
		want := rep.LastSeq + 1
		if l.rec == nil {
			// Torn if only non-records follow up to the end, or the first
			// record after the run continues the chain.
			torn := false
			for i := 0; i < maxTornRun; i++ {
				n, ok := lr.peek(i)
				if !ok {
					torn = lr.err == nil
					break
				}
				if n.rec != nil {
					torn = continues(n)
					break
				}
			}
			if !torn {
				if lr.err != nil {
					break
				}
				return bad(l, 0, ProblemMalformed, l.why)
			}
			_, more := lr.peek(0)
			rep.Torn = append(rep.Torn, TornLine{Line: l.no, Offset: l.off, Seq: want, Last: !more && lr.err == nil})
			continue
		}
		rec := l.rec
		if !l.macOK {
			if n, ok := lr.peek(0); ok && continues(n) {
				return bad(l, rec.Seq, ProblemInserted, "hash does not match, and the next record continues the chain without this one")
			}
			return bad(l, rec.Seq, ProblemAltered, "hash does not match the record (changed, forged, or not this log's key)")
		}
		if !continues(l) {
			kind, detail := misplaced(rec, lr, rep.LastSeq)
			return bad(l, rec.Seq, kind, detail)
		}
		rep.Records++
		rep.LastSeq, rep.LastHash = rec.Seq, rec.Hash
		if fn != nil {
			if err := fn(*rec); err != nil {
				return rep, err
			}
		}
	}
	if lr.err != nil {
		return rep, lr.err
	}
	return rep, nil
}
