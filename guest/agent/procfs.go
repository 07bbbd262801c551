//go:build linux

package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

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
// parentheses, so the fields after it are found from the last ')'.
func parseStat(b []byte) (procStat, error) {
	var s procStat
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 1 || closing < open {
		return s, fmt.Errorf("stat: malformed: no (comm)")
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:open])))
	if err != nil || pid < 1 {
		return s, fmt.Errorf("stat: malformed pid %q", b[:open])
	}
	s.PID = pid
	s.Comm = string(b[open+1 : closing])
	f := strings.Fields(string(b[closing+1:]))
	// After comm: state(0) ppid(1) pgrp(2) session(3) tty(4) tpgid(5) flags(6)
	// minflt cminflt majflt cmajflt(7-10) utime(11) stime(12) cutime cstime
	// priority nice num_threads itrealvalue(13-18) starttime(19) vsize(20) rss(21).
	if len(f) < 22 {
		return s, fmt.Errorf("stat: malformed: %d fields after comm; want at least 22", len(f))
	}
	s.State = f[0]
	if len(s.State) != 1 {
		return s, fmt.Errorf("stat: malformed state %q", s.State)
	}
	ints := []struct {
		dst any
		i   int
	}{{&s.PPID, 1}, {&s.PGRP, 2}, {&s.Flags, 6}, {&s.UTime, 11}, {&s.STime, 12}, {&s.StartTime, 19}, {&s.RSSPages, 21}}
	for _, x := range ints {
		switch d := x.dst.(type) {
		case *int:
			v, err := strconv.Atoi(f[x.i])
			if err != nil {
				return s, fmt.Errorf("stat: field %d: %w", x.i, err)
			}
			*d = v
		case *uint64:
			v, err := strconv.ParseUint(f[x.i], 10, 64)
			if err != nil {
				return s, fmt.Errorf("stat: field %d: %w", x.i, err)
			}
			*d = v
		case *int64:
			v, err := strconv.ParseInt(f[x.i], 10, 64)
			if err != nil {
				return s, fmt.Errorf("stat: field %d: %w", x.i, err)
			}
			*d = v
		}
	}
	return s, nil
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
type procFS struct {
	dir string
}

func (p procFS) path(pid int, name string) string {
	return filepath.Join(p.dir, strconv.Itoa(pid), name)
}

// stat reads and parses /proc/P/stat; errNoProcess when P is gone.
func (p procFS) stat(pid int) (procStat, error) {
	b, err := os.ReadFile(p.path(pid, "stat"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return procStat{}, fmt.Errorf("pid %d: %w", pid, errNoProcess)
		}
		return procStat{}, err
	}
	return parseStat(b)
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
	b, err := os.ReadFile(p.path(pid, "cmdline"))
	if err != nil {
		return nil, err
	}
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil, nil
	}
	return strings.Split(string(b), "\x00"), nil
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
func (p procFS) envValue(pid int, key string) (string, bool) {
	b, err := os.ReadFile(p.path(pid, "environ"))
	if err != nil {
		return "", false
	}
	return environValue(b, key)
}

// environValue finds key in a NUL-separated environment block.
func environValue(b []byte, key string) (string, bool) {
	prefix := key + "="
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(prefix)); ok {
			return string(v), true
		}
	}
	return "", false
}

// cgroupPath returns the cgroup v2 path of P ("0::/path" in /proc/P/cgroup).
func (p procFS) cgroupPath(pid int) string {
	b, err := os.ReadFile(p.path(pid, "cgroup"))
	if err != nil {
		return ""
	}
	return cgroupV2Path(b)
}

// cgroupV2Path extracts the unified hierarchy's path from /proc/P/cgroup.
func cgroupV2Path(b []byte) string {
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "0::"); ok {
			return v
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

// sessionOf returns P's session: from its cgroup, else from its marker.
func (p procFS) sessionOf(pid int) string {
	if id := sessionOfCgroup(p.cgroupPath(pid)); id != "" {
		return id
	}
	if id, ok := p.envValue(pid, SessionEnv); ok && wire.ValidateSessionID(id) == nil {
		return id
	}
	return ""
}
