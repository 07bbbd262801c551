package server

import (
	"errors"
	"fmt"

	"github.com/vmgate/vmgate/hypervisor"
)

// Power: vm_power, straight to the driver.

// PowerActions are the actions vm_power accepts.
var PowerActions = []string{"shutdown", "reboot", "reset", "stop", "start"}

func powerTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_power", title: "Power a VM", destructive: true,
		desc: "Change a VM's power state: shutdown (ACPI, guest may refuse), reboot, reset (hard), stop (hard off), start. " +
			"start on a running VM and stop on a stopped one do nothing and say so (done: false).",
		fields: []field{
			vmField(true),
			{name: "action", kind: kindString, desc: "shutdown, reboot, reset, stop or start.", required: true, enum: PowerActions},
		},
		output: []map[string]any{oObject(map[string]any{
			"vm": oString, "action": oString, "done": oBoolean, "state": oString,
		}, "vm", "action", "done")},
	}, (*Server).runPower)
}

// powerArgs are vm_power's arguments.
type powerArgs struct {
	Action string `arg:"action"`
}

// powerNoop is, for the actions that only move a VM to one state, the
// state in which they have nothing to do.
var powerNoop = map[hypervisor.PowerAction]hypervisor.State{
	hypervisor.PowerStart: hypervisor.StateRunning,
	hypervisor.PowerStop:  hypervisor.StateStopped,
}

func (s *Server) runPower(c *call, a *powerArgs) result {
	action := hypervisor.PowerAction(a.Action)
	if r, done := s.powerAlready(c, action); done {
		return r
	}
	if err := c.driver.Power(c.ctx, c.name, action); err != nil {
		return driverFailure(err)
	}
	return success(map[string]any{"vm": c.vm, "action": string(action), "done": true}, fmt.Sprintf("%s: %s done", c.vm, action))
}

// powerAlready answers start on a running VM and stop on a stopped one
// without touching it: the agent learns the VM was already so, rather
// than "start done" (or a backend's refusal). A status that cannot be read
// leaves the action to the driver.
func (s *Server) powerAlready(c *call, action hypervisor.PowerAction) (result, bool) {
	want, ok := powerNoop[action]
	if !ok {
		return result{}, false
	}
	st, err := c.driver.Status(c.ctx, c.name)
	if err != nil {
		if errors.Is(err, hypervisor.ErrUnknownVM) {
			return driverFailure(err), true
		}
		return result{}, false
	}
	if st.State != want {
		return result{}, false
	}
	out := map[string]any{"vm": c.vm, "action": string(action), "done": false, "state": string(st.State)}
	r := success(out, fmt.Sprintf("%s was already %s; %s did nothing", c.vm, st.State, action))
	r.noEffect = true
	return r, true
}
