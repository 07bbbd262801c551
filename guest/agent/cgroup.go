//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// limitControllers are the controllers a session's limits need.
var limitControllers = []string{"cpu", "memory", "pids"}

// cgroupUsable reports whether CgroupRoot is a writable cgroup v2 mount.
func (a *Agent) cgroupUsable() bool {
	if a.cfg.CgroupRoot == "" {
		return false
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(a.cfg.CgroupRoot, &fs); err != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return false
	}
	return unix.Access(filepath.Join(a.cfg.CgroupRoot, "cgroup.subtree_control"), unix.W_OK) == nil
}

func (a *Agent) cgroupParentDir() string { return filepath.Join(a.cfg.CgroupRoot, cgroupParent) }

func (a *Agent) sessionCgroup(id string) string { return filepath.Join(a.cgroupParentDir(), id) }

// ensureCgroupParent creates <root>/vmgate and enables the limit controllers
// for it and its children. It returns the controllers enabled.
func (a *Agent) ensureCgroupParent() (map[string]bool, error) {
	avail, err := os.ReadFile(filepath.Join(a.cfg.CgroupRoot, "cgroup.controllers"))
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, c := range strings.Fields(string(avail)) {
		have[c] = true
	}
	enabled := map[string]bool{}
	parent := a.cgroupParentDir()
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	for _, c := range limitControllers {
		if !have[c] {
			continue
		}
		// Each controller on its own: one that cannot be enabled leaves the others.
		e1 := os.WriteFile(filepath.Join(a.cfg.CgroupRoot, "cgroup.subtree_control"), []byte("+"+c), 0)
		e2 := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+c), 0)
		if e1 == nil && e2 == nil {
			enabled[c] = true
		} else {
			a.cfg.Logger.Warn("cgroup controller not enabled", "controller", c, "root", e1, "parent", e2)
		}
	}
	return enabled, nil
}

// createSessionCgroup makes the session's group (root's, so that an
// unprivileged member cannot move itself out) and writes its limits. It
// returns the controllers enabled for the group, sorted.
func (a *Agent) createSessionCgroup(id string, l wire.Limits) ([]string, error) {
	enabled, err := a.ensureCgroupParent()
	if err != nil {
		return nil, fmt.Errorf("cgroup parent: %w", err)
	}
	need := map[string]bool{"memory": l.MemoryMB > 0, "pids": l.Pids > 0, "cpu": l.CPUPercent > 0}
	for c, n := range need {
		if n && !enabled[c] {
			return nil, refused(wire.ReasonNoCgroupLimit, "cgroup controller %q is not available for the limit", c)
		}
	}
	controllers := make([]string, 0, len(enabled))
	for c := range enabled {
		controllers = append(controllers, c)
	}
	slices.Sort(controllers)
	dir := a.sessionCgroup(id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	writes := []struct{ file, val string }{}
	if l.MemoryMB > 0 {
		writes = append(writes, struct{ file, val string }{"memory.max", strconv.FormatInt(l.MemoryMB<<20, 10)})
		writes = append(writes, struct{ file, val string }{"memory.swap.max", "0"})
	}
	if l.Pids > 0 {
		writes = append(writes, struct{ file, val string }{"pids.max", strconv.FormatInt(l.Pids, 10)})
	}
	if l.CPUPercent > 0 {
		writes = append(writes, struct{ file, val string }{"cpu.max", fmt.Sprintf("%d 100000", l.CPUPercent*1000)})
	}
	for _, w := range writes {
		err := os.WriteFile(filepath.Join(dir, w.file), []byte(w.val), 0)
		if err != nil && w.file == "memory.swap.max" && errors.Is(err, os.ErrNotExist) {
			continue // no swap accounting: nothing to cap
		}
		if err != nil {
			_ = os.Remove(dir)
			return nil, fmt.Errorf("cgroup: %s: %w", w.file, err)
		}
	}
	return controllers, nil
}

// newRunCgroup makes a leaf for one run inside the session's group and
// returns its path and an open directory fd for clone3's CLONE_INTO_CGROUP.
func (a *Agent) newRunCgroup(id, runID string) (string, *os.File, error) {
	dir := filepath.Join(a.sessionCgroup(id), "run-"+runID)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("cgroup: run group: %w", err)
	}
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		_ = os.Remove(dir)
		return "", nil, fmt.Errorf("cgroup: run group: %w", err)
	}
	return dir, f, nil
}

// cgroupPIDs lists the processes in dir and every cgroup below it.
func cgroupPIDs(dir string) []int {
	var out []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if n, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && n > 0 {
				out = append(out, n)
			}
		}
		return nil
	})
	return out
}

// killCgroup SIGKILLs every process in dir's subtree: cgroup.kill where the
// kernel has it (5.14+), else each listed process. It returns how many
// processes were listed before the kill.
func killCgroup(dir string) int {
	pids := cgroupPIDs(dir)
	if len(pids) == 0 {
		return 0
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
		return len(pids)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(pids)
}

// removeCgroupTree removes dir and its child cgroups (deepest first).
// Cgroup directories are removed with rmdir; their files are not unlinked.
func removeCgroupTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("rmdir %s: %w", dir, err)
	}
	return nil
}
