//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/shirou/gopsutil/v4/common"
	"github.com/shirou/gopsutil/v4/process"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// pageSize is the guest's memory page size (RSS in /proc/P/stat is in pages).
var pageSize = int64(os.Getpagesize())

// PS lists the guest's processes; with a session id only that session's.
// Processes that vanish during the scan are left out.
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
	btime, err := a.proc.bootTime()
	if err != nil {
		return nil, fmt.Errorf("ps: %w", err)
	}
	now := time.Now().UnixMilli()
	users := map[uint32]string{}
	out := make([]wire.Process, 0, len(pids))
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("ps: %w", err)
		}
		row, ok := a.processRow(ctx, int(pid), btime, now, users)
		if !ok || (session != "" && row.Session != session) {
			continue
		}
		out = append(out, row)
	}
	return out, nil
}

// processRow builds one ps row; false when the process is gone.
func (a *Agent) processRow(ctx context.Context, pid int, btime, nowMS int64, users map[uint32]string) (wire.Process, bool) {
	st, err := a.proc.stat(pid)
	if err != nil {
		return wire.Process{}, false
	}
	p := &process.Process{Pid: int32(pid)}
	row := wire.Process{
		PID:       int32(pid),
		PPID:      int32(st.PPID),
		Name:      st.Comm,
		StartedAt: startMS(btime, st.StartTime),
		State:     st.State,
		RSSBytes:  uint64(max(st.RSSPages, 0) * pageSize),
		Session:   a.proc.sessionOf(pid),
	}
	if args, err := p.CmdlineSliceWithContext(ctx); err == nil {
		row.Cmdline = strings.Join(args, " ")
	}
	if uids, err := p.UidsWithContext(ctx); err == nil && len(uids) > 0 {
		row.User = userName(uids[0], users)
	}
	if age := nowMS - row.StartedAt; age > 0 {
		cpuMS := int64(st.UTime+st.STime) * 1000 / userHZ
		row.CPUPercent = float64(cpuMS) * 100 / float64(age)
	}
	return row, true
}

// userName maps a uid to a name through the guest's passwd, caching per scan.
func userName(uid uint32, cache map[uint32]string) string {
	if n, ok := cache[uid]; ok {
		return n
	}
	id := strconv.FormatUint(uint64(uid), 10)
	n := id
	if u, err := user.LookupId(id); err == nil {
		n = u.Username
	}
	cache[uid] = n
	return n
}
