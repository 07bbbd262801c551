package virtualbox

import (
	"bytes"
	"regexp"
	"strconv"
	"sync"
)

// The lines `VBoxManage guestcontrol … run --verbose` prints on stdout
// around the guest's own output (VBoxManageGuestCtrl.cpp).
var (
	pidLine     = regexp.MustCompile(`(?m)^Process '[^\n]*' \(PID ([0-9]+)\) started\n`)
	exitLine    = regexp.MustCompile(`(?:Process terminated\n)?Exit code=([0-9]+) \(Status=([0-9]+) \[[^\]\n]*\]\)\n(?:Closing guest session \.\.\.\n)?$`)
	timeoutLine = regexp.MustCompile(`Process timed out \(guest side\) and (?:was terminated|failed to terminate so far)\n(?:Closing guest session \.\.\.\n)?$`)
)

// ProcessStatus values of the VirtualBox API (ProcessStatus_T) that the
// verbose "Exit code=" line reports.
const (
	statusTerminatedNormally   = 500
	statusTerminatedSignal     = 510
	statusTerminatedAbnormally = 511
)

// maxPreamble and maxTrailer bound what is kept of VBoxManage's own lines.
const (
	maxPreamble = 4096
	maxTrailer  = 512
)

// verboseStdout consumes the stdout of `run --verbose`: it finds the guest
// pid in the preamble, keeps at most limit bytes of the guest's output (and
// counts the rest), and keeps the tail to parse the trailer from. It is
// safe for one writer and concurrent readers of PID.
type verboseStdout struct {
	limit int64

	// mu guards everything below.
	mu       sync.Mutex
	pre      []byte // preamble so far, until the pid line
	pid      int64
	started  chan struct{} // closed when the pid line was seen
	head     []byte        // the first limit+maxTrailer bytes after the preamble
	tail     []byte        // the last maxTrailer bytes after the preamble
	n        int64         // bytes after the preamble
	overflow bool          // preamble grew past maxPreamble without a pid line
}

func newVerboseStdout(limit int64) *verboseStdout {
	return &verboseStdout{limit: limit, started: make(chan struct{})}
}

func (v *verboseStdout) Write(p []byte) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	total := len(p)
	if v.pid == 0 && !v.overflow {
		v.pre = append(v.pre, p...)
		m := pidLine.FindSubmatchIndex(v.pre)
		if m == nil {
			if len(v.pre) > maxPreamble {
				v.overflow = true
			}
			return total, nil
		}
		pid, err := strconv.ParseInt(string(v.pre[m[2]:m[3]]), 10, 64)
		if err != nil || pid <= 0 {
			v.overflow = true
			return total, nil
		}
		v.pid = pid
		close(v.started)
		p = append([]byte(nil), v.pre[m[1]:]...)
		v.pre = v.pre[:m[1]]
	} else if v.pid == 0 {
		v.pre = append(v.pre, p...) // kept for the error message, bounded below
		if len(v.pre) > 2*maxPreamble {
			v.pre = v.pre[:2*maxPreamble]
		}
		return total, nil
	}
	if room := v.limit + maxTrailer - int64(len(v.head)); room > 0 {
		v.head = append(v.head, p[:min(int64(len(p)), room)]...)
	}
	v.tail = append(v.tail, p...)
	if len(v.tail) > maxTrailer {
		v.tail = append(v.tail[:0], v.tail[len(v.tail)-maxTrailer:]...)
	}
	v.n += int64(len(p))
	return total, nil
}

// PID returns the guest pid, 0 before the pid line.
func (v *verboseStdout) PID() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.pid
}

// outcome is what the trailer says.
type outcome struct {
	ok       bool // a trailer was found
	timedOut bool
	status   int
	code     int
}

// finish parses the trailer and returns the guest's stdout (capped) and
// whether it was truncated.
func (v *verboseStdout) finish() (out []byte, truncated bool, o outcome) {
	v.mu.Lock()
	defer v.mu.Unlock()
	trailer := 0
	if m := exitLine.FindSubmatchIndex(v.tail); m != nil {
		code, err1 := strconv.Atoi(string(v.tail[m[2]:m[3]]))
		status, err2 := strconv.Atoi(string(v.tail[m[4]:m[5]]))
		if err1 == nil && err2 == nil {
			o = outcome{ok: true, status: status, code: code}
			trailer = len(v.tail) - m[0]
		}
	} else if m := timeoutLine.FindIndex(v.tail); m != nil {
		o = outcome{ok: true, timedOut: true}
		trailer = len(v.tail) - m[0]
	}
	guest := v.n - int64(trailer)
	keep := min(guest, v.limit)
	return bytes.Clone(v.head[:keep]), guest > v.limit, o
}

// preamble returns what VBoxManage printed before the guest output.
func (v *verboseStdout) preamble() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return string(v.pre)
}

// capped keeps the first limit bytes written and counts the rest.
type capped struct {
	limit int64
	// mu guards buf and n.
	mu  sync.Mutex
	buf []byte
	n   int64
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.limit - int64(len(c.buf)); room > 0 {
		c.buf = append(c.buf, p[:min(int64(len(p)), room)]...)
	}
	c.n += int64(len(p))
	return len(p), nil
}

func (c *capped) bytes() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf), c.n > c.limit
}
