//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// FreezeTimeout bounds how long freezing a session may take.
const FreezeTimeout = 10 * time.Second

// freezeSession stops every process of session m, so that root-side work
// on its directories cannot race them, and returns thaw, which lets them
// run again; the caller defers it (it is safe to call once, whatever
// happened in between). The caller holds the lock, so no run of the
// session starts meanwhile.
//
// With a cgroup the session's group is frozen (cgroup.freeze 1) and
// freezeSession waits for cgroup.events to say "frozen 1": the kernel
// holds every member, forks included. Without one, every member (by uid
// and marker, as destroy finds them) is sent SIGSTOP in rounds until one
// scan finds them all stopped: a stopped process neither forks nor
// continues another, so the set is closed then. thaw continues only the
// processes freezeSession stopped; one already stopped stays so.
func (a *Agent) freezeSession(m meta) (thaw func(), err error) {
	if m.Tracking == wire.TrackCgroup && a.cfg.CgroupRoot != "" {
		if cg := a.sessionCgroup(m.ID); exists(cg) {
			return a.freezeCgroup(cg, FreezeTimeout)
		}
	}
	return a.stopMembers(tree{markerKey: SessionEnv, markerVal: m.marker(), uid: m.uid()}, FreezeTimeout)
}

// freezeCgroup freezes the cgroup dir and waits until it is frozen.
func (a *Agent) freezeCgroup(dir string, limit time.Duration) (thaw func(), err error) {
	ctl := filepath.Join(dir, "cgroup.freeze")
	thaw = func() {
		if err := os.WriteFile(ctl, []byte("0"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			a.cfg.Logger.Error("thawing a session's cgroup", "cgroup", dir, "err", err)
		}
	}
	if err := os.WriteFile(ctl, []byte("1"), 0); err != nil {
		return nil, fmt.Errorf("freezing %s: %w", dir, err)
	}
	deadline := time.Now().Add(limit)
	step := 100 * time.Microsecond
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err == nil && slices.Contains(strings.Split(string(b), "\n"), "frozen 1") {
			return thaw, nil
		}
		if err != nil || time.Now().After(deadline) {
			thaw()
			return nil, fmt.Errorf("freezing %s: not frozen after %v (%v)", dir, limit, err)
		}
		time.Sleep(step)
		step = min(2*step, 20*time.Millisecond)
	}
}

// stopMembers sends SIGSTOP to every member of t until a scan finds them
// all stopped; thaw sends SIGCONT to those it stopped.
func (a *Agent) stopMembers(t tree, limit time.Duration) (thaw func(), err error) {
	stopped := map[int]bool{}
	thaw = func() {
		for pid := range stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	deadline := time.Now().Add(limit)
	for {
		running := 0
		for _, pid := range a.members(t) {
			st, err := a.proc.stat(pid)
			if err != nil || st.State == "T" || st.State == "t" {
				continue // gone, or stopped (by this loop or before it)
			}
			running++
			if err := syscall.Kill(pid, syscall.SIGSTOP); err == nil {
				stopped[pid] = true
			}
		}
		if running == 0 {
			return thaw, nil
		}
		if time.Now().After(deadline) {
			thaw()
			return nil, fmt.Errorf("stopping the session's processes: %d still running after %v", running, limit)
		}
		time.Sleep(time.Millisecond)
	}
}
