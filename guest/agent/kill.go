//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// KillWait bounds how long Kill polls for the process to exit.
const KillWait = 2 * time.Second

// Names of processes kill never signals.
const (
	guestAgentName = "qemu-ga"
	selfName       = "vmgate-guest"
)

// Kill sends signal sig to pid after the guards: pid 1, kernel threads, the
// guest agent, vmgate-guest and its ancestors are refused, and with
// startedAtMS > 0 a process that started at another time (a reused pid) is
// refused. The process is pinned with a pidfd before the checks, so the
// signal reaches the process that was checked. It then polls briefly and
// reports whether the process exited (not for STOP and CONT).
func (a *Agent) Kill(ctx context.Context, pid int, sig string, startedAtMS int64) (wire.KillResult, error) {
	name, num, err := wire.ParseSignal(sig)
	if err != nil {
		return wire.KillResult{}, invalidf("kill: %v", err)
	}
	if pid < 1 {
		return wire.KillResult{}, invalidf("kill: pid %d must be at least 2", pid)
	}
	if startedAtMS < 0 {
		return wire.KillResult{}, invalidf("kill: started_at %d is negative", startedAtMS)
	}
	if pid == 1 {
		return wire.KillResult{}, refused(wire.ReasonInit, "kill: refused: pid 1 is init")
	}
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return wire.KillResult{}, notFoundf("kill: pid %d: no such process", pid)
	case errors.Is(err, unix.ENOSYS):
		fd = -1 // kernel before 5.3: plain kill(2) after the checks
	case err != nil:
		return wire.KillResult{}, fmt.Errorf("kill: pidfd_open %d: %w", pid, err)
	}
	if fd >= 0 {
		defer unix.Close(fd)
	}
	st, err := a.checkKillable(pid, startedAtMS)
	if err != nil {
		return wire.KillResult{}, err
	}
	if fd >= 0 {
		err = unix.PidfdSendSignal(fd, unix.Signal(num), nil, 0)
	} else {
		err = syscall.Kill(pid, syscall.Signal(num))
	}
	if errors.Is(err, unix.ESRCH) {
		return wire.KillResult{PID: pid, Signal: name, Exited: true}, nil
	}
	if err != nil {
		return wire.KillResult{}, fmt.Errorf("kill: signal %s to %d: %w", name, pid, err)
	}
	res := wire.KillResult{PID: pid, Signal: name}
	if name == "STOP" || name == "CONT" {
		if now, err := a.proc.stat(pid); err == nil {
			res.State = now.State
		}
		return res, nil
	}
	res.Exited, res.State, res.WaitedMS = a.waitExit(ctx, pid, st.StartTime, KillWait)
	return res, nil
}

// checkKillable applies kill's guards to pid.
func (a *Agent) checkKillable(pid int, startedAtMS int64) (procStat, error) {
	st, err := a.proc.stat(pid)
	if errors.Is(err, errNoProcess) {
		return st, notFoundf("kill: pid %d: no such process", pid)
	}
	if err != nil {
		return st, fmt.Errorf("kill: %w", err)
	}
	if st.KernelThread() || st.PPID == 2 {
		return st, refused(wire.ReasonKernelThread, "kill: refused: pid %d (%s) is a kernel thread", pid, st.Comm)
	}
	if st.Comm == guestAgentName || a.proc.exeBase(pid) == guestAgentName {
		return st, refused(wire.ReasonGuestAgent, "kill: refused: pid %d is the guest agent", pid)
	}
	if pid == os.Getpid() || st.Comm == selfName || a.proc.exeBase(pid) == selfName {
		return st, refused(wire.ReasonSelf, "kill: refused: pid %d is vmgate-guest", pid)
	}
	if a.isAncestor(pid) {
		return st, refused(wire.ReasonAncestor, "kill: refused: pid %d is an ancestor of vmgate-guest", pid)
	}
	if startedAtMS > 0 {
		btime, err := a.proc.bootTime()
		if err != nil {
			return st, fmt.Errorf("kill: %w", err)
		}
		if got := startMS(btime, st.StartTime); got != startedAtMS {
			return st, refused(wire.ReasonPidReused, "kill: refused: pid %d started at %d, not %d: pid was reused", pid, got, startedAtMS)
		}
	}
	return st, nil
}

// isAncestor reports whether pid is on this process's parent chain.
func (a *Agent) isAncestor(pid int) bool {
	cur := os.Getppid()
	for i := 0; i < 4096 && cur > 1; i++ {
		if cur == pid {
			return true
		}
		st, err := a.proc.stat(cur)
		if err != nil {
			return false
		}
		cur = st.PPID
	}
	return false
}

// waitExit polls pid (started at startTicks) adaptively for up to limit.
// A zombie or a pid now holding another process counts as exited.
func (a *Agent) waitExit(ctx context.Context, pid int, startTicks uint64, limit time.Duration) (exited bool, state string, waitedMS int64) {
	start := time.Now()
	step := time.Millisecond
	for {
		st, err := a.proc.stat(pid)
		if err != nil || st.State == "Z" || st.State == "X" || st.StartTime != startTicks {
			return true, "", time.Since(start).Milliseconds()
		}
		if time.Since(start) >= limit {
			return false, st.State, time.Since(start).Milliseconds()
		}
		t := time.NewTimer(step)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, st.State, time.Since(start).Milliseconds()
		case <-t.C:
		}
		step = min(step*2, 100*time.Millisecond)
	}
}
