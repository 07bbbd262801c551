package server

import (
	"fmt"

	"github.com/vmgate/vmgate/hypervisor"
)

// Power: vm_power, straight to the driver.

// PowerActions are the actions vm_power accepts.
var PowerActions = []string{"shutdown", "reboot", "reset", "stop", "start"}

func powerTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_power", title: "Power a VM", destructive: true,
		desc: "Change a VM's power state: shutdown (ACPI, guest may refuse), reboot, reset (hard), stop (hard off), start.",
		fields: []field{
			vmField(true),
			{name: "action", kind: kindString, desc: "shutdown, reboot, reset, stop or start.", required: true, enum: PowerActions},
		},
	}, (*Server).runPower)
}

// powerArgs are vm_power's arguments.
type powerArgs struct {
	Action string `arg:"action"`
}

func (s *Server) runPower(c *call, a *powerArgs) result {
	action := hypervisor.PowerAction(a.Action)
	if err := c.driver.Power(c.ctx, c.name, action); err != nil {
		return driverFailure(err)
	}
	return success(map[string]any{"vm": c.vm, "action": string(action), "done": true}, fmt.Sprintf("%s: %s done", c.vm, action))
}
