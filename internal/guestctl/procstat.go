package guestctl

import (
	"bytes"
	"context"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/hypervisor"
)

// The start time of a process in the guest, read from the guest's procfs
// through the driver's own file channel: what vm_agent_exec with wait:
// false reports, so that kill_process's started_at guard holds for a
// command the guest agent started. vmgate-guest reads the same fields
// in the guest (guest/agent/procfs.go) for list_processes.

// userHZ is the clock tick of /proc times on every Linux vmgate runs
// commands in (amd64, arm64: USER_HZ is 100), as guest/agent/procfs.go.
const userHZ = 100

// StartedAt is the start time of pid in the guest vm of d in ms since the
// Unix epoch, as list_processes shows it and kill_process's started_at
// takes it (the guest's clock, not the host's): /proc/PID/stat's starttime
// after /proc/stat's btime, read through the driver's file channel, for a
// command the guest agent started (no vmgate-guest is needed). ok is false
// when the guest cannot tell (the command already ended, no procfs).
func StartedAt(ctx context.Context, d hypervisor.Driver, vm string, pid int64) (ms int64, ok bool) {
	stat, err := d.FileRead(ctx, vm, "/proc/"+strconv.FormatInt(pid, 10)+"/stat", 4096)
	if err != nil {
		return 0, false
	}
	ticks, ok := statStartTicks(stat.Data)
	if !ok {
		return 0, false
	}
	boot, err := d.FileRead(ctx, vm, "/proc/stat", 1<<16)
	if err != nil {
		return 0, false
	}
	btime, ok := procBootTime(boot.Data)
	if !ok {
		return 0, false
	}
	return btime*1000 + ticks*1000/userHZ, true
}

// statStartTicks is field 22 (starttime) of /proc/P/stat: the 20th after
// the command name, which may hold spaces and parentheses (so the fields
// are counted from the last ')').
func statStartTicks(b []byte) (int64, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// procBootTime is the btime line of /proc/stat: the boot time in s since
// the Unix epoch.
func procBootTime(b []byte) (int64, bool) {
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil && n > 0
		}
	}
	return 0, false
}
