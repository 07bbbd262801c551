//go:build linux

package agent

import (
	"os"
	"runtime"
	"strconv"
	"sync"
)

// forker is one OS thread that never ends, from which every run that has
// no thread of its own is forked (runSetup.start). A child's parent-death
// signal (Pdeathsig) fires when the thread that forked it ends, not the
// process, and the Go runtime ends a thread whenever a goroutine locked to
// it returns, which the sandbox's own threads do (startConfined,
// createNetNS). In a short-lived vmgate-guest that was harmless; in the
// resident helper any runtime thread may be one that a later locked
// goroutine takes and ends, killing the command it once forked.
//
// reqs is set once by once.
var forker struct {
	once sync.Once
	reqs chan func()
}

// init keeps the main goroutine on the process's main thread for good
// (LockOSThread in an init: main runs locked there), so that no other
// goroutine ever runs on it. The threads this package confines (a run's,
// a session's kept thread) must end when their goroutine returns locked,
// and the runtime ends every thread so but the main one, which it only
// parks ("wedges"): a confined goroutine that had landed on it would have
// left it in a destroyed session's network and mount namespaces for the
// process's life.
func init() { runtime.LockOSThread() }

// forkOnStableThread runs start (an exec.Cmd's Start) on the forker thread.
func forkOnStableThread(start func() error) error {
	forker.once.Do(func() {
		forker.reqs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for fn := range forker.reqs {
				fn()
			}
		}()
	})
	errc := make(chan error, 1)
	forker.reqs <- func() { errc <- start() }
	return <-errc
}

// childStarted undoes, for a run's process, what the resident helper set
// for itself and a child inherits: its oom_score_adj (the helper's own is
// low, so that the kernel's OOM killer takes a command before the helper;
// a command keeps the guest's default, 0). Between the fork and this write
// the child runs with the helper's value for the few instructions it
// takes to get here.
func (a *Agent) childStarted(pid int) {
	if a.res == nil || !a.res.oomLowered {
		return
	}
	p := "/proc/" + strconv.Itoa(pid) + "/oom_score_adj"
	if err := os.WriteFile(p, []byte("0"), 0); err != nil {
		a.cfg.Logger.Warn("run: resetting oom_score_adj", "pid", pid, "err", err)
	}
}
