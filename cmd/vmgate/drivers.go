package main

// The built-in hypervisor drivers: each registers itself with
// hypervisor/registry (name, settings, constructor) when linked in. This
// is the one place that names them; config, the plugin host and the server
// find them in the registry.
import (
	_ "github.com/vmgate/vmgate/plugins/libvirt"
	_ "github.com/vmgate/vmgate/plugins/proxmox"
	_ "github.com/vmgate/vmgate/plugins/qemu"
	_ "github.com/vmgate/vmgate/plugins/virtualbox"
)
