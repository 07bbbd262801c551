package tools

import (
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/catalog"
)

// Power: vm_power, straight to the driver.

// powerActions are the actions vm_power accepts.
func powerActions() []string { return []string{"shutdown", "reboot", "reset", "stop", "start"} }

func powerTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_power", Title: "Power a VM", Destructive: true,
		Desc: "Change a VM's power state: shutdown (ACPI, guest may refuse), reboot, reset (hard), stop (hard off), start. " +
			"start on a running VM and stop on a stopped one do nothing and say so (done: false). " +
			"reboot and reset return once the guest runs its new boot (waited_for: \"new boot\"), or say why they did not wait (no_wait).",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "action", Kind: catalog.KindString, Desc: "shutdown, reboot, reset, stop or start.", Required: true, Enum: powerActions()},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vm": catalog.OString(), "action": catalog.OString(), "done": catalog.OBoolean(), "state": catalog.OString(),
			"waited_for": catalog.OString(), "boot_id_changed": catalog.OBoolean(), "no_wait": catalog.OString(),
		}, "vm", "action", "done")},
	}, runPower)
}

// powerArgs are vm_power's arguments.
type powerArgs struct {
	Action string `arg:"action"`
}

// UndoApplies: a policy's snapshot_before applies to the actions that lose
// the guest's state, stop and reset (catalog.Undoable).
func (a *powerArgs) UndoApplies() bool {
	return a.Action == string(hypervisor.PowerStop) || a.Action == string(hypervisor.PowerReset)
}

// powerNoop is, for the actions that only move a VM to one state, the
// state in which they have nothing to do.
var powerNoop = map[hypervisor.PowerAction]hypervisor.State{
	hypervisor.PowerStart: hypervisor.StateRunning,
	hypervisor.PowerStop:  hypervisor.StateStopped,
}

func runPower(e *catalog.Env, c *catalog.Call, a *powerArgs) catalog.Result {
	action := hypervisor.PowerAction(a.Action)
	if r, done := powerAlready(e, c, action); done {
		return r
	}
	// A reboot or reset returns once the guest runs its new boot (or says
	// why it did not wait), so that the next call reaches the new boot
	// (hypervisor.PowerWait); the other actions are the driver's Power.
	o, err := hypervisor.PowerWait(c.Ctx, c.Driver, c.Name, action)
	if err != nil {
		return catalog.DriverFailure(err)
	}
	out := map[string]any{"vm": c.VM, "action": string(action), "done": true}
	text := fmt.Sprintf("%s: %s done", c.VM, action)
	switch {
	case o.WaitedFor != "":
		out["waited_for"], out["boot_id_changed"] = o.WaitedFor, o.BootIDChanged
		text += "; the guest runs its new boot"
	case o.NoWait != "":
		out["no_wait"] = o.NoWait
		text += "; not waited for: " + o.NoWait + " (the next call may still reach the old boot or find the guest down)"
	}
	return catalog.Success(out, text)
}

// Deadline: a reboot or reset waits for the guest's new boot, which a TCG
// guest on a loaded machine may take minutes to reach, as vm_create's
// boot does (catalog.Deadliner).
func (a *powerArgs) Deadline(e *catalog.Env) time.Duration {
	if hypervisor.BootsAnew(hypervisor.PowerAction(a.Action)) {
		return e.Timeouts.Create
	}
	return e.Timeouts.Call
}

// powerAlready answers start on a running VM and stop on a stopped one
// without touching it: the agent learns the VM was already so, rather
// than "start done" (or a backend's refusal). A status that cannot be read
// leaves the action to the driver.
func powerAlready(e *catalog.Env, c *catalog.Call, action hypervisor.PowerAction) (catalog.Result, bool) {
	want, ok := powerNoop[action]
	if !ok {
		return catalog.Result{}, false
	}
	st, err := c.Driver.Status(c.Ctx, c.Name)
	if err != nil {
		if errors.Is(err, hypervisor.ErrUnknownVM) {
			return catalog.DriverFailure(err), true
		}
		return catalog.Result{}, false
	}
	if st.State != want {
		return catalog.Result{}, false
	}
	out := map[string]any{"vm": c.VM, "action": string(action), "done": false, "state": string(st.State)}
	r := catalog.Success(out, fmt.Sprintf("%s was already %s; %s did nothing", c.VM, st.State, action))
	r.NoEffect = true
	return r, true
}
