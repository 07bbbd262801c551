package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Reading a log while the server writes it. The readers in this file
// (Search, and Follow in follow.go) take no lock the server takes: they
// open the file read-only and read it with read(2), which the server's
// exclusive flock does not stop. What they can meet at the end of a live
// log is a line the server is still writing (a record's bytes arrive in
// one write(2), which another reader may see half done): a last line
// without its newline is never a record to them. Search reports its
// length in ScanStats.Partial; Follow waits for the rest of it. A line
// that is complete but not a record (a torn line a crash left, which the
// server's next Open ends with a newline) is counted, not matched.
//
// Search does not check the chain (that needs the key: use Verify). It is
// built for speed on large logs: the filter's exact values are looked
// for in the raw bytes first (a call id, grant, tool, VM, decision,
// outcome, session or text appears in the line exactly as the encoder
// writes it), and only a line that holds them all is decoded and checked
// field by field, so a search costs about what `grep -c` of its rarest
// value does.

// Filter selects records. Every field that is set must match; the zero
// Filter matches every record.
type Filter struct {
	CallID     string // call_id, exactly
	Kind       Kind   // decision, outcome, advance, advance_end
	Grant      string
	Tool       string
	VM         string
	Decision   string // allow, deny, approve, rate_limited, invalid, unknown_vm, error, approval_granted, …
	Outcome    string // ok, error, timed_out, …
	ApprovalID string
	Session    string // the call's session argument
	// Text is a substring of a string argument (or an element of a list
	// argument) that holds no secret: stdin, content, content_base64 and
	// env, which the log keeps only as digests, are not searched.
	Text string
	// Since and Until bound the record's time: Since <= time < Until. Zero:
	// unbounded.
	Since, Until time.Time
}

// Match is one record a search found.
type Match struct {
	Offset int64  // of the line in the file
	Line   []byte // the line as stored, without its newline; valid only during the callback
	Record Record
}

// ScanStats says what a search read.
type ScanStats struct {
	Bytes      int64 // read, up to the end of the last complete line
	Lines      int   // complete lines seen (counted only where the search looked at them)
	Candidates int   // lines decoded
	Matched    int
	Torn       int   // lines looked at that are not records (crash artefacts, lines longer than any record)
	Partial    int64 // bytes of a last line without its newline (being written, or torn)
}

// IsZero reports whether f matches every record.
func (f *Filter) IsZero() bool { return *f == Filter{} }

// needles are byte strings every matching line holds, as the encoder
// writes them.
func (f *Filter) needles() [][]byte {
	var out [][]byte
	field := func(name, v string) {
		if v != "" {
			out = append(out, appendString([]byte(`"`+name+`":`), v))
		}
	}
	field("call_id", f.CallID)
	field("kind", string(f.Kind))
	field("grant", f.Grant)
	field("tool", f.Tool)
	field("vm", f.VM)
	field("decision", f.Decision)
	field("outcome", f.Outcome)
	field("approval_id", f.ApprovalID)
	field("session", f.Session)
	if f.Text != "" {
		q := appendString(nil, f.Text)
		out = append(out, q[1:len(q)-1])
	}
	// Every time in [Since, Until) starts with what the two bounds' seconds
	// have in common (the format is fixed-width, so the order of the text
	// is the order of time).
	if !f.Since.IsZero() && !f.Until.IsZero() && f.Until.After(f.Since) {
		const secs = len("2006-01-02T15:04:05")
		lo, hi := timeKey(f.Since)[:secs], timeKey(f.Until.Add(-time.Nanosecond))[:secs]
		n := 0
		for n < secs && lo[n] == hi[n] {
			n++
		}
		if n >= len("2006") {
			out = append(out, append([]byte(`"time":"`), lo[:n]...))
		}
	}
	return out
}

// Match reports whether rec matches f.
func (f *Filter) Match(rec *Record) bool {
	switch {
	case f.CallID != "" && rec.CallID != f.CallID,
		f.Kind != "" && rec.Kind != f.Kind,
		f.Grant != "" && rec.Grant != f.Grant,
		f.Tool != "" && rec.Tool != f.Tool,
		f.VM != "" && rec.VM != f.VM,
		f.Decision != "" && rec.Decision != f.Decision,
		f.Outcome != "" && rec.Outcome != f.Outcome,
		f.ApprovalID != "" && rec.ApprovalID != f.ApprovalID,
		!f.Since.IsZero() && rec.Time.Before(f.Since),
		!f.Until.IsZero() && !rec.Time.Before(f.Until):
		return false
	}
	if f.Session != "" {
		if s, _ := rec.Args["session"].(string); s != f.Session {
			return false
		}
	}
	return f.Text == "" || containsText(rec.Args, f.Text)
}

// containsText reports whether a string argument (at any depth) outside
// the secret ones holds text.
func containsText(v any, text string) bool {
	switch v := v.(type) {
	case string:
		return strings.Contains(v, text)
	case []any:
		for _, e := range v {
			if containsText(e, text) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if isSecretKey(k) || strings.EqualFold(k, "env") {
				continue
			}
			if containsText(e, text) {
				return true
			}
		}
	}
	return false
}

// searchBuf is how much of the file a search holds at once.
const searchBuf = 1 << 20

// Search reads the log in r from its start and calls fn with every record
// f matches, in file order. An error from fn stops the search and is
// returned. See the package notes above on live logs and speed.
func Search(r io.Reader, f Filter, fn func(*Match) error) (ScanStats, error) {
	s := scanner{f: f, fn: fn, needles: f.needles()}
	s.timed = !f.Since.IsZero() || !f.Until.IsZero()
	if s.timed {
		s.since, s.until = timeKey(f.Since), timeKey(f.Until)
	}
	if file, ok := r.(*os.File); ok {
		if done, err := s.mapped(file); done {
			return s.st, err
		}
	}
	buf := make([]byte, searchBuf)
	var off int64 // file offset of buf[0]
	n := 0        // bytes held in buf
	for {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil && !errors.Is(err, io.EOF) {
			return s.st, fmt.Errorf("audit: search: %w", err)
		}
		eof := errors.Is(err, io.EOF)
		if m == 0 && !eof {
			continue
		}
		// Only complete lines: the rest waits for the next read.
		end := bytes.LastIndexByte(buf[:n], '\n') + 1
		if end == 0 && n == len(buf) {
			// A line longer than the buffer: not a record (maxLineBytes);
			// skip to its end.
			err := s.skipLong(r, buf, &off, &n)
			if errors.Is(err, io.EOF) {
				return s.st, nil
			}
			if err != nil {
				return s.st, err
			}
			continue
		}
		if off == 0 && len(s.needles) > 0 {
			s.pick(buf[:n])
		}
		if err := s.chunk(buf[:end], off); err != nil {
			return s.st, err
		}
		s.st.Bytes = off + int64(end)
		copy(buf, buf[end:n])
		off += int64(end)
		n -= end
		if eof {
			s.st.Partial = int64(n)
			return s.st, nil
		}
	}
}

// scanner is one search's state.
type scanner struct {
	f            Filter
	fn           func(*Match) error
	needles      [][]byte // needles[0] is looked for across the buffer (pick)
	rare         int      // the index in needles[0] of its rarest byte
	timed        bool
	since, until []byte // timeKey of the bounds; nil: unbounded
	st           ScanStats
	m            Match
}

// pick chooses the needle to look for across the buffer and the byte of
// it to look for first: the byte that is rarest in sample (the start of
// the log), as grep does. A log is mostly quotes, colons, hex digits and
// a few keys: a needle's first byte is often a quote, found at every
// other step, where one of its letters is found once a line or less, and
// IndexByte skips to it at memory speed.
func (s *scanner) pick(sample []byte) {
	var freq [256]int
	for _, c := range sample[:min(len(sample), 256<<10)] {
		freq[c]++
	}
	best, bestFreq := 0, -1
	for i, n := range s.needles {
		r := 0
		for j := range n {
			if freq[n[j]] < freq[n[r]] {
				r = j
			}
		}
		if bestFreq < 0 || freq[n[r]] < bestFreq {
			best, bestFreq, s.rare = i, freq[n[r]], r
		}
	}
	s.needles[0], s.needles[best] = s.needles[best], s.needles[0]
}

// index is the offset of the first needles[0] in b, or -1: the rare
// byte first, then the whole needle around it.
func (s *scanner) index(b []byte) int {
	n := s.needles[0]
	c := n[s.rare]
	for pos := s.rare; pos < len(b); {
		i := bytes.IndexByte(b[pos:], c)
		if i < 0 {
			return -1
		}
		start := pos + i - s.rare
		if start+len(n) <= len(b) && bytes.Equal(b[start:start+len(n)], n) {
			return start
		}
		pos += i + 1
	}
	return -1
}

// chunk searches the complete lines in b (which ends with a newline),
// found at file offset off.
func (s *scanner) chunk(b []byte, off int64) error {
	if len(s.needles) == 0 {
		for pos := 0; pos < len(b); {
			nl := bytes.IndexByte(b[pos:], '\n') + pos
			s.st.Lines++
			if err := s.line(b[pos:nl], off+int64(pos)); err != nil {
				return err
			}
			pos = nl + 1
		}
		return nil
	}
	for pos := 0; pos < len(b); {
		i := s.index(b[pos:])
		if i < 0 {
			return nil
		}
		i += pos
		start := bytes.LastIndexByte(b[:i], '\n') + 1
		nl := bytes.IndexByte(b[i:], '\n') + i
		s.st.Lines++
		if err := s.line(b[start:nl], off+int64(start)); err != nil {
			return err
		}
		pos = nl + 1
	}
	return nil
}

// line checks one complete line whose first needle is known to be in it
// (or that no needle is asked of).
func (s *scanner) line(l []byte, off int64) error {
	for _, n := range s.needles[min(1, len(s.needles)):] {
		if !bytes.Contains(l, n) {
			return nil
		}
	}
	if s.timed && !s.inTime(l) {
		return nil
	}
	s.st.Candidates++
	s.m = Match{Offset: off, Line: l}
	if err := json.Unmarshal(l, &s.m.Record); err != nil || s.m.Record.Seq == 0 {
		s.st.Torn++
		return nil
	}
	if !s.f.Match(&s.m.Record) {
		return nil
	}
	s.st.Matched++
	return s.fn(&s.m)
}

// inTime reports whether the line's time may be within the bounds (a line
// whose time cannot be read is left to the decoder).
func (s *scanner) inTime(l []byte) bool {
	const key = `"time":"`
	head := l[:min(len(l), 160)]
	i := bytes.Index(head, []byte(key))
	if i < 0 {
		return true
	}
	rest := l[i+len(key):]
	j := bytes.IndexByte(rest[:min(len(rest), 64)], '"')
	if j < 0 {
		return true
	}
	t := rest[:j]
	if len(t) < 20 || t[len(t)-1] != 'Z' {
		return true
	}
	if s.since != nil && compareTimeKey(t, s.since) < 0 {
		return false
	}
	return s.until == nil || compareTimeKey(t, s.until) < 0
}

// timeKey is t as the encoder writes it (RFC 3339 in UTC, nanoseconds
// without trailing zeros); nil for the zero time.
func timeKey(t time.Time) []byte {
	if t.IsZero() {
		return nil
	}
	return t.UTC().AppendFormat(nil, time.RFC3339Nano)
}

// compareTimeKey compares two UTC times written as RFC 3339 with an
// optional fraction: the seconds as text, then the fractions digit by
// digit (a missing digit is a 0), without parsing either.
func compareTimeKey(a, b []byte) int {
	const secs = len("2006-01-02T15:04:05")
	if len(a) < secs || len(b) < secs {
		return bytes.Compare(a, b)
	}
	if c := bytes.Compare(a[:secs], b[:secs]); c != 0 {
		return c
	}
	fa, fb := fraction(a[secs:]), fraction(b[secs:])
	for i := range max(len(fa), len(fb)) {
		da, db := byte('0'), byte('0')
		if i < len(fa) {
			da = fa[i]
		}
		if i < len(fb) {
			db = fb[i]
		}
		if da != db {
			return int(da) - int(db)
		}
	}
	return 0
}

// fraction is the digits of ".123Z" (none for "Z").
func fraction(b []byte) []byte {
	if len(b) > 1 && b[0] == '.' {
		return bytes.TrimSuffix(b[1:], []byte("Z"))
	}
	return nil
}

// skipLong reads past a line longer than buf, which holds its start.
func (s *scanner) skipLong(r io.Reader, buf []byte, off *int64, n *int) error {
	skipped := int64(*n)
	for {
		m, err := r.Read(buf)
		if i := bytes.IndexByte(buf[:m], '\n'); i >= 0 {
			skipped += int64(i + 1)
			if len(s.needles) == 0 { // looked at, as every line is
				s.st.Lines++
				s.st.Torn++
			}
			copy(buf, buf[i+1:m])
			*off += skipped
			*n = m - i - 1
			return nil
		}
		skipped += int64(m)
		if errors.Is(err, io.EOF) {
			s.st.Partial = skipped
			return io.EOF
		}
		if err != nil {
			return fmt.Errorf("audit: search: %w", err)
		}
	}
}
