package virtualbox

import (
	"io"
	"strconv"
)

// The text `guestcontrol run --verbose` prints (VBoxManageGuestCtrl.cpp
// gctlHandleRunCommon and gctlCtxInitGuestSession/gctlCtxTerm) is a fixed
// grammar: a preamble the driver can predict byte for byte except the
// session ID and the pid, one line per iteration of the wait loop, a
// trailer that says how the process ended, and "Closing guest session".
//
// VBoxManage prints it with RTPrintf, through the C library's fully
// buffered stdout (a pipe is not a terminal), while it writes the guest's
// output to fd 1 directly. So the verbose text reaches the pipe in
// buffer-sized blocks (glibc: st_blksize of the pipe, 4096 on Linux) cut
// anywhere in a line, whenever the buffer fills, and the rest at exit; the
// guest's output falls between the blocks. On 7.x and 6.1 the loop spins
// (one line per iteration, many per second), so any command that runs
// longer than a moment has blocks of verbose text inside its output.
//
// vmatcher recognises the verbose text incrementally; vfilter uses it to
// take the blocks out of the stream, whatever their position.

// tokKind is the kind of one token of a line pattern.
type tokKind int

const (
	tokLit    tokKind = iota // exact bytes
	tokDigits                // one or more ASCII digits
	tokDigit                 // exactly one ASCII digit
	tokWord                  // one or more of [A-Za-z0-9_-] (an IPRT status name)
)

type token struct {
	kind tokKind
	lit  string
	tag  string // names a captured field
}

// pattern is one alternative: a sequence of tokens. A pattern may span
// several lines (the preamble does).
type pattern struct {
	name string
	toks []token
}

func lit(s string) token      { return token{kind: tokLit, lit: s} }
func digits(tag string) token { return token{kind: tokDigits, tag: tag} }

// digit is one digit: a ProcessWaitResult is 0..9 (VirtualBox.xidl), and a
// run of one digit cannot absorb a guest's digit next to a block boundary.
func digit(tag string) token              { return token{kind: tokDigit, tag: tag} }
func word(tag string) token               { return token{kind: tokWord, tag: tag} }
func pat(name string, t ...token) pattern { return pattern{name: name, toks: t} }

// verboseGrammar is the text one `run --verbose` prints, for a version.
type verboseGrammar struct {
	preamble pattern
	loop     []pattern // repeated
	trailer  []pattern // at most one, after the loop
	closing  pattern

	inLoop []pattern // loop, trailer and closing: what may follow a loop line
	first  map[int]*[256]bool
	start  map[int][]cursor
}

// startCursors are the cursors of an item's start in phase.
func (g *verboseGrammar) startCursors(phase int) []cursor {
	if g.start == nil {
		g.start = map[int][]cursor{}
	}
	if cs, ok := g.start[phase]; ok {
		return cs
	}
	var pats []pattern
	switch phase {
	case phasePreamble:
		pats = []pattern{g.preamble}
	case phaseLoop:
		pats = g.loopPhase()
	case phaseClosing:
		pats = []pattern{g.closing}
	}
	cs := make([]cursor, len(pats))
	for i := range pats {
		cs[i] = cursor{p: &pats[i]}
	}
	g.start[phase] = cs
	return cs
}

// firstBytes is the set of bytes that can begin an item in phase.
func (g *verboseGrammar) firstBytes(phase int) *[256]bool {
	if g.first == nil {
		g.first = map[int]*[256]bool{}
	}
	if f := g.first[phase]; f != nil {
		return f
	}
	f := new([256]bool)
	for _, c := range g.startCursors(phase) {
		for b := 0; b < 256; b++ {
			if c.accepts(byte(b)) {
				f[b] = true
			}
		}
	}
	g.first[phase] = f
	return f
}

// loopPhase is every pattern that may start an item after the preamble.
func (g *verboseGrammar) loopPhase() []pattern {
	if g.inLoop == nil {
		g.inLoop = append(append(append([]pattern{}, g.loop...), g.trailer...), g.closing)
	}
	return g.inLoop
}

// Texts of gctlProcessWaitResultToText and gctlProcessStatusToText.
var (
	waitResultTexts = []string{"started", "terminated", "status changed", "error", "timed out", "stdin ready",
		"data on stdout", "data on stderr", "waiting flag not supported", "unknown"}
	processStatusTexts = []string{"starting", "started", "paused", "terminating", "successfully terminated",
		"terminated by signal", "abnormally aborted", "timed out", "timed out, hanging", "killed", "error", "unknown"}
)

// runSpecText is what the driver passed to `run`, which the preamble
// repeats.
type runSpecText struct {
	user    string
	image   string
	args    []string // argv[0] first, as ProcessCreate gets them
	timeout int64    // ms; 0: none
}

// newVerboseGrammar builds the grammar of `run --verbose` for VBoxManage
// 7.x (modern) or 6.1.
func newVerboseGrammar(modern bool, s runSpecText) verboseGrammar {
	var pre []token
	if modern {
		// gctlHandleRunCommon prints the final execution parameters while
		// parsing options, before the session exists.
		pre = append(pre, lit("Executing:\n  Image : "+s.image+"\n"))
		for i, a := range s.args {
			pre = append(pre, lit("  arg["+strconv.Itoa(i)+"]: "+a+"\n"))
		}
	}
	pre = append(pre,
		lit("Creating guest session as user '"+s.user+"'...\nWaiting for guest session to start...\nSuccessfully started guest session (ID "),
		digits("session"), lit(")\n"))
	if s.timeout == 0 {
		pre = append(pre, lit("Starting guest process ...\n"))
	} else {
		pre = append(pre, lit("Starting guest process (within "+strconv.FormatInt(s.timeout, 10)+"ms)\n"))
	}
	pre = append(pre, lit("Process '"+s.image+"' (PID "), digits("pid"), lit(") started\n"))
	g := verboseGrammar{preamble: pat("preamble", pre...), closing: pat("closing", lit("Closing guest session ...\n"))}
	if modern {
		for _, t := range waitResultTexts {
			g.loop = append(g.loop, pat("wait", lit("Wait result is '"+t+"' ("), digit("wait"), lit(")\n")))
		}
	} else {
		g.loop = append(g.loop, pat("wait", lit("waitResult: "), digit("wait"), lit("\n")))
	}
	g.loop = append(g.loop, pat("terminated", lit("Process terminated\n")))
	for _, t := range processStatusTexts {
		g.trailer = append(g.trailer, pat("exit", lit("Exit code="), digits("code"), lit(" (Status="), digits("status"), lit(" ["+t+"])\n")))
		g.trailer = append(g.trailer, pat("unexpected", lit("Process now is in status ["+t+"] (unexpected)\n")))
	}
	g.trailer = append(g.trailer,
		pat("guest-timeout", lit("Process timed out (guest side) and was terminated\n")),
		pat("guest-timeout", lit("Process timed out (guest side) and failed to terminate so far\n")),
		pat("quit", lit("Process monitor loop quit with vrc="), word("vrc"), lit("\n")),
		pat("host-timeout", lit("Process monitor loop timed out\n")),
		pat("aborted", lit("Process execution aborted!\n")))
	return g
}

// captures are the fields a pattern's digit runs name.
type captures struct {
	session, pid, code, status int64
	vrc                        string
}

func (c *captures) set(tag string, v int64, w []byte) {
	switch tag {
	case "session":
		c.session = v
	case "pid":
		c.pid = v
	case "code":
		c.code = v
	case "status":
		c.status = v
	case "vrc":
		c.vrc = string(w)
	}
}

// cursor is a position inside one pattern.
type cursor struct {
	p    *pattern
	tok  int    // index into p.toks
	off  int    // bytes of a literal matched, or of a run seen
	val  int64  // the digits of the current run
	word []byte // the current word run
	caps captures
}

// advance feeds one byte to c in place; false means b does not continue
// c (c is then garbage). A digit or word run ends at the first byte that
// is not part of it, which must begin the next token (every run in the
// grammar is followed by a literal).
func (c *cursor) advance(b byte) bool {
	for c.tok < len(c.p.toks) {
		t := &c.p.toks[c.tok]
		if t.kind == tokLit {
			if t.lit[c.off] != b {
				return false
			}
			c.off++
			if c.off == len(t.lit) {
				c.tok, c.off = c.tok+1, 0
			}
			return true
		}
		if t.kind == tokDigit {
			if b < '0' || b > '9' {
				return false
			}
			c.caps.set(t.tag, int64(b-'0'), nil)
			c.tok, c.off = c.tok+1, 0
			return true
		}
		if isRunByte(t.kind, b) {
			if c.off < 19 {
				c.val = c.val*10 + int64(b-'0')
			}
			if t.kind == tokWord {
				c.word = append(c.word, b)
			}
			c.off++
			return true
		}
		if c.off == 0 {
			return false
		}
		c.caps.set(t.tag, c.val, c.word)
		c.tok, c.off, c.val, c.word = c.tok+1, 0, 0, nil
	}
	return false
}

func (c *cursor) done() bool { return c.tok >= len(c.p.toks) }

// accepts is advance on a copy.
func (c cursor) accepts(b byte) bool {
	c.word = nil
	return c.advance(b)
}

func isRunByte(k tokKind, b byte) bool {
	if b >= '0' && b <= '9' {
		return true
	}
	return k == tokWord && (b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z' || b == '_' || b == '-')
}

// Phases of the verbose text.
const (
	phasePreamble = iota
	phaseLoop     // loop lines, a trailer or the closing line next
	phaseClosing  // the closing line next
	phaseDone
)

// vmatcher recognises the verbose text one byte at a time. Its zero value
// is not usable: newVMatcher.
type vmatcher struct {
	g       *verboseGrammar
	phase   int
	live    []cursor // candidate patterns of the current item; empty at an item's start
	scratch []cursor

	// What the text said.
	pid     int64
	trailer string // name of the trailer pattern; "" when none
	code    int
	status  int
}

func newVMatcher(g *verboseGrammar) *vmatcher {
	return &vmatcher{g: g, live: []cursor{{p: &g.preamble}}}
}

// copyFrom makes m a copy of o, reusing m's buffers.
func (m *vmatcher) copyFrom(o *vmatcher) {
	live, scratch := m.live[:0], m.scratch
	*m = *o
	m.live, m.scratch = append(live, o.live...), scratch
}

// starts is the cursors of a new item in the current phase.
func (m *vmatcher) starts() []cursor {
	return m.g.startCursors(m.phase)
}

// accepts reports whether b can come next, without consuming it.
func (m *vmatcher) accepts(b byte) bool {
	if m.phase == phaseDone {
		return false
	}
	if len(m.live) == 0 {
		return m.g.firstBytes(m.phase)[b]
	}
	for _, c := range m.live {
		if c.accepts(b) {
			return true
		}
	}
	return false
}

// feed consumes b; false means b cannot come next in the verbose text (the
// matcher is then unchanged).
func (m *vmatcher) feed(b byte) bool {
	if m.phase == phaseDone {
		return false
	}
	src := m.live
	if len(src) == 0 {
		src = m.starts()
	}
	next := m.scratch[:0]
	for _, c := range src {
		if c.advance(b) {
			next = append(next, c)
		}
	}
	if len(next) == 0 {
		m.scratch = next
		return false
	}
	for i := range next {
		if next[i].done() {
			m.complete(&next[i])
			m.scratch, m.live = next, m.live[:0]
			return true
		}
	}
	m.scratch, m.live = m.live[:0], next
	return true
}

// complete records a finished item and moves on.
func (m *vmatcher) complete(c *cursor) {
	switch c.p.name {
	case "preamble":
		m.pid = c.caps.pid
		m.phase = phaseLoop
	case "wait", "terminated":
	case "closing":
		m.phase = phaseDone
	default:
		m.trailer = c.p.name
		m.code, m.status = int(c.caps.code), int(c.caps.status)
		m.phase = phaseClosing
	}
}

// feedAll feeds p and reports how many bytes were taken.
func (m *vmatcher) feedAll(p []byte) int {
	for i, b := range p {
		if !m.feed(b) {
			return i
		}
	}
	return len(p)
}

// pidKnown reports whether the preamble, with the pid, has been seen.
func (m *vmatcher) pidKnown() bool { return m.phase >= phaseLoop }

// vfilter separates the stdout of `run --verbose` into the guest's output
// and the verbose text. The text arrives in whole blocks of the stdio
// buffer's size (block) while VBoxManage runs, one or more back to back,
// each starting where the text was cut, and in a last, shorter block at
// exit. A run of blocks is recognised where the bytes continue the text
// for a whole block; the last block is the stream's tail that completes
// the text. Bytes that cannot start a block are the guest's. Guest output
// that itself reproduces a whole block of VBoxManage's own text, at the
// point where a block could begin, is the one case it cannot tell apart.
type vfilter struct {
	m     *vmatcher
	block int
	// pending holds bytes not yet classified.
	pending []byte
	out     io.Writer // the guest's output
	// failed is set when bytes taken as a block did not continue the text.
	failed bool

	onPID func(pid int64) // called once, when the pid is known
	probe *vmatcher       // scratch copy of m for look-ahead
}

// DefaultStdioBlock is the size of VBoxManage's stdout buffer on a pipe:
// glibc allocates min(BUFSIZ, st_blksize) (libio/filedoalloc.c), and a
// Linux pipe reports 4096.
const DefaultStdioBlock = 4096

func newVFilter(g *verboseGrammar, out io.Writer, block int, onPID func(int64)) *vfilter {
	if block <= 0 {
		block = DefaultStdioBlock
	}
	return &vfilter{m: newVMatcher(g), out: out, block: block, onPID: onPID}
}

// Write takes the next bytes of the stream.
func (f *vfilter) Write(p []byte) (int, error) {
	f.pending = append(f.pending, p...)
	f.drain(false)
	return len(p), nil
}

// Close is the end of the stream: the tail must complete the text.
func (f *vfilter) Close() { f.drain(true) }

// release hands n pending bytes to the guest's output.
func (f *vfilter) release(n int) {
	if n > 0 {
		f.out.Write(f.pending[:n])
		f.pending = f.pending[n:]
	}
}

// take feeds n pending bytes to the matcher.
func (f *vfilter) take(n int) {
	had := f.m.pidKnown()
	if got := f.m.feedAll(f.pending[:n]); got != n {
		f.failed = true
	}
	f.pending = f.pending[n:]
	if !had && f.m.pidKnown() && f.onPID != nil {
		f.onPID(f.m.pid)
	}
}

func (f *vfilter) drain(eof bool) {
	for !f.failed && len(f.pending) > 0 {
		start, size, ok := f.nextBlock(eof)
		f.release(start)
		if !ok {
			return
		}
		f.take(size)
	}
	if eof && !f.failed {
		f.release(len(f.pending))
	}
}

// nextBlock finds where the next block of verbose text begins in pending:
// (start, size, true) for a block, or the tail at end of stream, of size
// bytes; (safe, 0, false) when it needs more bytes, everything before safe
// being the guest's for sure.
func (f *vfilter) nextBlock(eof bool) (int, int, bool) {
	for c := 0; c < len(f.pending); c++ {
		if !f.m.accepts(f.pending[c]) {
			continue
		}
		switch size, verdict := f.fits(c, eof); verdict {
		case fitYes:
			return c, size, true
		case fitNeedMore:
			return c, 0, false
		}
	}
	return len(f.pending), 0, false
}

type fit int

const (
	fitNo fit = iota
	fitYes
	fitNeedMore
)

// fits checks whether a block starts at pending[c]: the next block bytes
// must all continue the text, or, at end of stream, the rest must complete
// it (the tail, at most a block).
func (f *vfilter) fits(c int, eof bool) (int, fit) {
	rest := f.pending[c:]
	if f.probe == nil {
		f.probe = &vmatcher{}
	}
	probe := f.probe
	probe.copyFrom(f.m)
	n := probe.feedAll(rest[:min(len(rest), f.block)])
	switch {
	case n == f.block:
		return f.block, fitYes
	case n == len(rest) && eof && probe.phase == phaseDone:
		return n, fitYes
	case n == len(rest) && !eof:
		return 0, fitNeedMore
	}
	return 0, fitNo
}

// done reports whether the whole text was seen and taken out cleanly.
func (f *vfilter) done() bool { return !f.failed && f.m.phase == phaseDone }
