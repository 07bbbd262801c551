//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shirou/gopsutil/v4/common"
	"github.com/shirou/gopsutil/v4/process"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// pageSize is the guest's memory page size (RSS in /proc/P/stat is in pages).
var pageSize = int64(os.Getpagesize())

// passwdFile is where ps maps uids to user names.
const passwdFile = "/etc/passwd"

// PS lists the guest's processes; with a session id only that session's.
// Processes that vanish during the scan are left out.
//
// gopsutil lists the pids; each row is read through an open /proc/P
// directory (stat, cgroup, then environ only when the cgroup names no
// session, cmdline and status), with one reused buffer. With a session id,
// a process of another session is dropped after its cgroup (or environ)
// without reading the rest. Kernel threads have no memory map, so their
// (empty) cmdline and environ are not read.
func (a *Agent) PS(ctx context.Context, session string) ([]wire.Process, error) {
	if session != "" {
		if err := wire.ValidateSessionID(session); err != nil {
			return nil, invalidf("ps: %v", err)
		}
	}
	// gopsutil reads the same proc tree as the agent (fixtures in tests).
	ctx = context.WithValue(ctx, common.EnvKey, common.EnvMap{common.HostProcEnvKey: a.cfg.ProcDir})
	pids, err := process.PidsWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("ps: %w", err)
	}
	slices.Sort(pids)
	btime, err := a.proc.bootTime()
	if err != nil {
		return nil, fmt.Errorf("ps: %w", err)
	}
	sc := psScan{proc: a.proc, btime: btime, nowMS: time.Now().UnixMilli(), users: userNames{file: passwdFile}, members: a.memberScan()}
	out := make([]wire.Process, 0, len(pids))
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("ps: %w", err)
		}
		if row, ok := sc.row(int(pid), session); ok {
			out = append(out, row)
		}
	}
	return out, nil
}

// psScan is the state of one ps scan. It is not safe for concurrent use.
type psScan struct {
	proc    procFS
	btime   int64 // boot time, s since the epoch
	nowMS   int64
	buf     []byte // reused by every read
	users   userNames
	members memberScan
}

// read reads name from d into the scan's buffer; the bytes are valid until
// the next read.
func (s *psScan) read(d pidDir, name string) ([]byte, error) {
	b, err := d.read(name, s.buf)
	s.buf = b[:0]
	return b, err
}

// row builds pid's ps row; false when the process is gone, or belongs to
// another session than want (when want is not "").
func (s *psScan) row(pid int, want string) (wire.Process, bool) {
	d, err := s.proc.openPID(pid)
	if err != nil {
		return wire.Process{}, false
	}
	defer d.close()
	b, err := s.read(d, "stat")
	if err != nil {
		return wire.Process{}, false
	}
	st, err := parseStat(b)
	if err != nil {
		return wire.Process{}, false
	}
	kthread := st.KernelThread()
	row := wire.Process{
		PID:       int32(pid),
		PPID:      int32(st.PPID),
		Name:      st.Comm,
		StartedAt: startMS(s.btime, st.StartTime),
		State:     st.State,
		RSSBytes:  uint64(max(st.RSSPages, 0) * pageSize),
	}
	m := s.members.of(d, &s.buf, kthread)
	row.Session = m.session
	if want != "" && row.Session != want {
		return wire.Process{}, false
	}
	if !kthread {
		if b, err := s.read(d, "cmdline"); err == nil {
			row.Cmdline = cmdlineString(b)
		}
	}
	if m.haveUID {
		row.User = s.users.name(m.uid)
	}
	if age := s.nowMS - row.StartedAt; age > 0 {
		cpuMS := int64(st.UTime+st.STime) * 1000 / userHZ
		row.CPUPercent = float64(cpuMS) * 100 / float64(age)
	}
	return row, true
}

// cmdlineString joins /proc/P/cmdline's NUL-separated arguments with
// spaces, trailing NULs dropped (what strings.Join of gopsutil's
// CmdlineSlice gives).
func cmdlineString(b []byte) string {
	b = bytes.TrimRight(b, "\x00")
	for i, c := range b {
		if c == 0 {
			b[i] = ' '
		}
	}
	return string(b)
}

// statusUID returns the real uid: the first number of the "Uid:" line of
// /proc/P/status. false when the line is missing or malformed.
func statusUID(b []byte) (uint32, bool) {
	ids := statusIDs(b, "Uid:")
	if len(ids) == 0 {
		return 0, false
	}
	return ids[0], true
}

// userNames maps uids to names for one scan. The passwd file is read once,
// at the first lookup, with os/user's rules; a uid it lacks goes through
// os/user (NSS in cgo builds), then stays a number.
type userNames struct {
	file   string
	passwd map[string]string // uid field → first user name; nil until read
	cache  map[uint32]string
}

func (u *userNames) name(uid uint32) string {
	if n, ok := u.cache[uid]; ok {
		return n
	}
	if u.passwd == nil {
		u.passwd = map[string]string{}
		if f, err := os.Open(u.file); err == nil {
			u.passwd = parsePasswd(f)
			f.Close()
		}
		u.cache = map[uint32]string{}
	}
	id := strconv.FormatUint(uint64(uid), 10)
	n, ok := u.passwd[id]
	if !ok {
		n = id
		if usr, err := user.LookupId(id); err == nil {
			n = usr.Username
		}
	}
	u.cache[uid] = n
	return n
}

// parsePasswd maps uid fields to user names the way os/user's pure-Go
// lookup reads /etc/passwd: blank lines and comments skipped, at least six
// colons, a name not starting with + or -, numeric uid and gid fields, the
// first line for a uid wins.
func parsePasswd(r io.Reader) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || strings.Count(line, ":") < 6 {
			continue
		}
		parts := strings.SplitN(line, ":", 7)
		if parts[0] == "" || parts[0][0] == '+' || parts[0][0] == '-' {
			continue
		}
		if _, err := strconv.Atoi(parts[2]); err != nil {
			continue
		}
		if _, err := strconv.Atoi(parts[3]); err != nil {
			continue
		}
		if _, seen := out[parts[2]]; !seen {
			out[parts[2]] = parts[0]
		}
	}
	return out
}
