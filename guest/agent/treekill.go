package agent

import (
	"context"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
)

// Killing a whole process tree: what a run's timeout and a session's
// destroy rely on to leave nothing behind (members finds every process of
// a tree, killUntilGone ends them in rounds until none is left).

// tree names the processes a kill must reach: a cgroup subtree, a process
// group, the descendants of a root pid, every process whose environment
// has markerKey=markerVal, and every process running as uid (any of its
// uids; 0 or less for none).
type tree struct {
	cgroup    string
	pgid      int
	root      int
	markerKey string
	markerVal string
	uid       int
}

// members lists the tree's live processes (zombies excluded), never this
// process or its ancestors, never pid 1.
func (a *Agent) members(t tree) []int {
	set := map[int]bool{}
	if t.cgroup != "" {
		for _, p := range cgroupPIDs(t.cgroup) {
			set[p] = true
		}
	}
	pids, _ := a.proc.pids()
	children := map[int][]int{}
	alive := map[int]bool{}
	for _, pid := range pids {
		st, err := a.proc.stat(pid)
		if err != nil || st.State == "Z" || st.State == "X" || st.KernelThread() {
			continue
		}
		alive[pid] = true
		children[st.PPID] = append(children[st.PPID], pid)
		if t.pgid > 1 && st.PGRP == t.pgid {
			set[pid] = true
		}
		if t.markerKey != "" {
			if v, ok := a.proc.envValue(pid, t.markerKey); ok && v == t.markerVal {
				set[pid] = true
			}
		}
		if t.uid > 0 && !set[pid] {
			_ = a.proc.readFile(pid, "status", func(b []byte) {
				if slices.Contains(statusIDs(b, "Uid:"), uint32(t.uid)) {
					set[pid] = true
				}
			})
		}
	}
	if t.root > 1 {
		queue := []int{t.root}
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			for _, c := range children[p] {
				if !set[c] {
					set[c] = true
				}
				queue = append(queue, c)
			}
		}
	}
	self := os.Getpid()
	out := make([]int, 0, len(set))
	for p := range set {
		if p <= 1 || p == self || !alive[p] || a.isAncestor(p) {
			continue
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// killUntilGone ends every member of t: with grace > 0 it sends SIGTERM
// first and waits up to grace for them to leave; then SIGKILL in rounds
// (cgroup.kill, the process group, each member) until a scan finds none.
// It returns how many processes it signalled and the rounds it took; an
// error when members survive limit.
func (a *Agent) killUntilGone(ctx context.Context, t tree, grace, limit time.Duration) (killed, rounds int, err error) {
	deadline := time.Now().Add(limit)
	seen := map[int]bool{}
	signal := func(pids []int, sig syscall.Signal) {
		if t.pgid > 1 {
			_ = syscall.Kill(-t.pgid, sig)
		}
		for _, p := range pids {
			seen[p] = true
			_ = syscall.Kill(p, sig)
		}
	}
	if grace > 0 {
		m := a.members(t)
		signal(m, syscall.SIGTERM)
		end := time.Now().Add(grace)
		for len(m) > 0 && time.Now().Before(end) {
			time.Sleep(10 * time.Millisecond)
			m = a.members(t)
		}
	}
	step := time.Millisecond
	for {
		m := a.members(t)
		if len(m) == 0 {
			return len(seen), rounds, nil
		}
		if time.Now().After(deadline) {
			return len(seen), rounds, fmt.Errorf("%d processes survived %d kill rounds: %v", len(m), rounds, m)
		}
		rounds++
		if t.cgroup != "" {
			killCgroup(t.cgroup)
		}
		signal(m, syscall.SIGKILL)
		time.Sleep(step)
		step = min(step*2, 50*time.Millisecond)
		if ctx.Err() != nil && time.Now().After(deadline) {
			return len(seen), rounds, ctx.Err()
		}
	}
}
