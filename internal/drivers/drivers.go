// Package drivers lists the hypervisor drivers compiled into vmgate. The
// binary serves each of them as a plugin (`vmgate plugin NAME`) and the
// server launches them through internal/pluginhost.
package drivers

import (
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/plugins/libvirt"
	"github.com/vmgate/vmgate/plugins/proxmox"
	"github.com/vmgate/vmgate/plugins/virtualbox"
)

// Registry returns the built-in drivers by name.
func Registry() pluginhost.Registry {
	return pluginhost.Registry{
		"qemu":       pluginhost.NewQEMU,
		"proxmox":    proxmox.NewFromJSON,
		"virtualbox": virtualbox.NewFromJSON,
		"libvirt":    libvirt.NewFromJSON,
	}
}
