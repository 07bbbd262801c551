// Command fleetplugin is the external driver plugin of the bench's fleet
// rows (6c, 6d): hypervisortest's Fleet, many VMs and no guests, served as
// vmgate-plugin-fleet from a plugin_dir, so that `vmgate serve` talks to it
// through the real plugin boundary (a process, its call socket). Its
// settings are FleetSettings ({"vms": 250, "prefix": "vm"}), checked as a
// registered driver's are.
package main

import (
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest/fleet"
	"github.com/vmgate/vmgate/hypervisor/registry"
)

func main() {
	registry.Register("fleet", fleet.New)
	d, _ := registry.Lookup("fleet")
	hypervisor.Serve(hypervisor.NewDeferred(d.New))
}
