package virtualbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// A machine's VM process holds the machine's session until it has ended,
// and it ends after `controlvm poweroff` returns: VBoxManage returns when
// Console::PowerDown's progress completes (VBoxManageControlVM.cpp
// handleControlVM), and the headless VM process leaves its event loop on
// the OnStateChanged event and only then calls ISession::UnlockMachine
// (VBoxHeadless.cpp TrustedMain). Until then VirtualBox refuses what needs
// the session free (MachineImpl.cpp): Machine::unregister, Machine::lockMachine
// for a write lock (modifyvm) and Machine::i_launchVMProcess (startvm).

// hasVMProcess reports whether a machine in state (showvminfo's VMState)
// has a VM process: it runs, is paused or is stuck (a guest meditation).
func hasVMProcess(state string) bool {
	return state == "running" || state == "paused" || state == "stuck"
}

// sessionLocked reports whether msg is one of those refusals.
func sessionLocked(msg string) bool {
	return strings.Contains(msg, "while it is locked") || // Machine::unregister
		strings.Contains(msg, "is already locked for a session (or being unlocked)") || // Machine::lockMachine
		strings.Contains(msg, "is already locked by a session (or being locked or unlocked)") // Machine::i_launchVMProcess
}

// vboxUnlocked runs a VBoxManage command that needs vm's session free
// (args name vm). While VirtualBox refuses it because a VM process holds
// the session and the machine no longer runs (its VM process is ending),
// the command is retried until ctx ends. A machine that runs holds its
// session for good: that refusal is returned at once.
func (d *Driver) vboxUnlocked(ctx context.Context, op, vm string, args ...string) error {
	var b hypervisor.Backoff
	locked := "" // VirtualBox's last refusal for the locked session
	ended := func(err error) error {
		if locked == "" || ctx.Err() == nil {
			return err
		}
		var why error = hypervisor.ErrTimeout
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			why = ctx.Err()
		}
		return fmt.Errorf("virtualbox: %s: %w: VM %q no longer runs but a session still holds it (its VM process has not ended, or another VirtualBox client such as an open settings dialog locks it); retry in a moment: %s", op, why, vm, locked)
	}
	for {
		r, err := d.vbox(ctx, args...)
		if err != nil {
			return ended(ctxError(op, err))
		}
		if r.code == 0 {
			return nil
		}
		msg := errorText(r.stderr)
		if !sessionLocked(msg) {
			return vboxError(op, r)
		}
		mi, err := d.showVMInfo(ctx, op, vm)
		if err != nil {
			return ended(err)
		}
		if hasVMProcess(mi.State) {
			next := "power it off first"
			if args[0] == "startvm" {
				next = "it needs no start"
			}
			return fmt.Errorf("virtualbox: %s: %w: VM %q is %s and its VM process holds it; %s: %s", op, hypervisor.ErrInvalidArgument, vm, mi.State, next, msg)
		}
		locked = msg
		if err := b.Sleep(ctx, time.Second); err != nil {
			return ended(err)
		}
	}
}
