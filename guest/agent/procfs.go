//go:build linux

package agent

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// userHZ is the clock tick of /proc times: USER_HZ is 100 on every Linux
// architecture vmgate-guest is built for (amd64, arm64).
const userHZ = 100

// pfKthread is PF_KTHREAD in /proc/P/stat's flags field.
const pfKthread = 0x00200000

// procStat is the part of /proc/P/stat vmgate-guest reads.
type procStat struct {
	PID       int
	Comm      string
	State     string
	PPID      int
	PGRP      int
	Flags     uint64
	UTime     uint64 // ticks
	STime     uint64 // ticks
	StartTime uint64 // ticks since boot
	RSSPages  int64
}

// errNoProcess: the process does not exist (any more).
var errNoProcess = errors.New("no such process")

// parseStat parses the contents of /proc/P/stat. comm may hold spaces and
// parentheses, so the fields after it are found from the last ')'. It
// allocates only comm (ps calls it once per process).
func parseStat(b []byte) (procStat, error) {
	var s procStat
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 1 || closing < open {
		return s, fmt.Errorf("stat: malformed: no (comm)")
	}
	pid, ok := parseDec(bytes.TrimSpace(b[:open]))
	if !ok || pid < 1 || pid > math.MaxInt32 {
		return s, fmt.Errorf("stat: malformed pid %q", b[:open])
	}
	s.PID = int(pid)
	// After comm: state(0) ppid(1) pgrp(2) session(3) tty(4) tpgid(5) flags(6)
	// minflt cminflt majflt cmajflt(7-10) utime(11) stime(12) cutime cstime
	// priority nice num_threads itrealvalue(13-18) starttime(19) vsize(20) rss(21).
	var f [22][]byte
	n := 0
	for rest := b[closing+1:]; n < len(f); n++ {
		rest = bytes.TrimLeft(rest, " \t\n")
		if len(rest) == 0 {
			break
		}
		end := bytes.IndexAny(rest, " \t\n")
		if end < 0 {
			end = len(rest)
		}
		f[n], rest = rest[:end], rest[end:]
	}
	if n < len(f) {
		return s, fmt.Errorf("stat: malformed: %d fields after comm; want at least 22", n)
	}
	s.Comm = string(b[open+1 : closing])
	if len(f[0]) != 1 {
		return s, fmt.Errorf("stat: malformed state %q", f[0])
	}
	s.State = string(f[0])
	var err error
	if s.PPID, err = statInt(f[1], 1); err != nil {
		return s, err
	}
	if s.PGRP, err = statInt(f[2], 2); err != nil {
		return s, err
	}
	for _, x := range []struct {
		dst *uint64
		i   int
	}{{&s.Flags, 6}, {&s.UTime, 11}, {&s.STime, 12}, {&s.StartTime, 19}} {
		if *x.dst, err = statUint(f[x.i], x.i); err != nil {
			return s, err
		}
	}
	rss, err := statInt(f[21], 21)
	if err != nil {
		return s, err
	}
	s.RSSPages = int64(rss)
	return s, nil
}

// parseDec parses a plain unsigned decimal (digits only, no sign) that
// fits in 63 bits: the fast path of every number in /proc/P/stat.
func parseDec(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}

// statUint parses an unsigned field of /proc/P/stat (field i after comm).
func statUint(b []byte, i int) (uint64, error) {
	if v, ok := parseDec(b); ok {
		return v, nil
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat: field %d: %w", i, err)
	}
	return v, nil
}

// statInt parses a signed field of /proc/P/stat (field i after comm).
func statInt(b []byte, i int) (int, error) {
	if v, ok := parseDec(b); ok {
		return int(v), nil
	}
	v, err := strconv.Atoi(string(b))
	if err != nil {
		return 0, fmt.Errorf("stat: field %d: %w", i, err)
	}
	return v, nil
}

// KernelThread reports whether the stat says kernel thread: the PF_KTHREAD
// flag, or kthreadd itself (pid 2 with parent 0).
func (s procStat) KernelThread() bool {
	return s.Flags&pfKthread != 0 || (s.PID == 2 && s.PPID == 0)
}

// startedAtMS converts the stat's start time to ms since the Unix epoch.
func startMS(bootTimeS int64, startTicks uint64) int64 {
	return bootTimeS*1000 + int64(startTicks)*1000/userHZ
}

// procFS reads a /proc tree (the real one, or a fixture in tests).
//
// Files are read with open/read/close straight on the file descriptor (no
// os.File: no fstat, no poller registration) into reusable buffers: on a
// TCG guest every system call counts, and ps reads four or five files per
// process.
type procFS struct {
	dir string
}

func (p procFS) path(pid int, name string) string {
	return filepath.Join(p.dir, strconv.Itoa(pid), name)
}

// bufPool holds the buffers of the one-file readers below.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// readFD reads fd to its end, appending to buf[:0] (grown as needed).
func readFD(fd int, buf []byte) ([]byte, error) {
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(cap(buf), 4096))
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return buf, err
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// readPath reads the file at path into buf (see readFD).
func readPath(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return buf[:0], &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	b, err := readFD(fd, buf)
	if err != nil {
		return b, &os.PathError{Op: "read", Path: path, Err: err}
	}
	return b, nil
}

// readFile reads /proc/P/name with a pooled buffer and hands the bytes to
// use, which must not keep them.
func (p procFS) readFile(pid int, name string, use func([]byte)) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	b, err := readPath(p.path(pid, name), *bp)
	*bp = b[:0]
	if err != nil {
		return err
	}
	use(b)
	return nil
}

// gone reports whether err says the process does not exist (any more).
func gone(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// stat reads and parses /proc/P/stat; errNoProcess when P is gone.
func (p procFS) stat(pid int) (procStat, error) {
	var st procStat
	var perr error
	err := p.readFile(pid, "stat", func(b []byte) { st, perr = parseStat(b) })
	if err != nil {
		if gone(err) {
			return procStat{}, fmt.Errorf("pid %d: %w", pid, errNoProcess)
		}
		return procStat{}, err
	}
	return st, perr
}

// bootTime reads btime from /proc/stat (seconds since the epoch).
func (p procFS) bootTime() (int64, error) {
	b, err := os.ReadFile(filepath.Join(p.dir, "stat"))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("proc stat: bad btime %q", v)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("proc stat: no btime line")
}

// pidDir is an open /proc/P directory. Every file read through it belongs
// to the process that was P when it was opened: once that process is gone
// (and reaped) the reads fail with ESRCH, even if the pid was reused, so
// the fields of one ps row never mix two processes.
type pidDir struct {
	fd int
}

// openPID opens /proc/P; errNoProcess when P is gone.
func (p procFS) openPID(pid int) (pidDir, error) {
	fd, err := unix.Open(filepath.Join(p.dir, strconv.Itoa(pid)), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return pidDir{fd: -1}, fmt.Errorf("pid %d: %w", pid, errNoProcess)
		}
		return pidDir{fd: -1}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return pidDir{fd: fd}, nil
}

func (d pidDir) close() { _ = unix.Close(d.fd) }

// read reads the file name of the directory into buf (see readFD).
func (d pidDir) read(name string, buf []byte) ([]byte, error) {
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return buf[:0], &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	b, err := readFD(fd, buf)
	if err != nil {
		return b, &os.PathError{Op: "read", Path: name, Err: err}
	}
	return b, nil
}

// pids lists the numeric entries of /proc.
func (p procFS) pids() ([]int, error) {
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(ents))
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out, nil
}

// cmdline reads /proc/P/cmdline as arguments (empty for kernel threads and zombies).
func (p procFS) cmdline(pid int) ([]string, error) {
	var args []string
	err := p.readFile(pid, "cmdline", func(b []byte) {
		if b = bytes.TrimRight(b, "\x00"); len(b) > 0 {
			args = strings.Split(string(b), "\x00")
		}
	})
	return args, err
}

// exeBase is the base name of /proc/P/exe's target, "" when unreadable.
func (p procFS) exeBase(pid int) string {
	t, err := os.Readlink(p.path(pid, "exe"))
	if err != nil {
		return ""
	}
	t = strings.TrimSuffix(t, " (deleted)")
	return filepath.Base(t)
}

// envValue returns the value of key in /proc/P/environ.
func (p procFS) envValue(pid int, key string) (v string, ok bool) {
	_ = p.readFile(pid, "environ", func(b []byte) { v, ok = environValue(b, key) })
	return v, ok
}

// environValue finds key in a NUL-separated environment block.
func environValue(b []byte, key string) (string, bool) {
	prefix := []byte(key + "=")
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			return string(v), true
		}
	}
	return "", false
}

// cgroupPath returns the cgroup v2 path of P ("0::/path" in /proc/P/cgroup).
func (p procFS) cgroupPath(pid int) (path string) {
	_ = p.readFile(pid, "cgroup", func(b []byte) { path = cgroupV2Path(b) })
	return path
}

// cgroupV2Path extracts the unified hierarchy's path from /proc/P/cgroup.
func cgroupV2Path(b []byte) string {
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		if v, ok := bytes.CutPrefix(line, []byte("0::")); ok {
			return string(v)
		}
	}
	return ""
}

// sessionOfCgroup returns the session id of a cgroup path under /vmgate/<id>.
func sessionOfCgroup(path string) string {
	rest, ok := strings.CutPrefix(path, "/"+cgroupParent+"/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	if wire.ValidateSessionID(id) != nil {
		return ""
	}
	return id
}
