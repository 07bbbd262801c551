package config

// The built-in drivers register their settings types; config itself
// imports none of them (the binary links them in, cmd/vmgate/drivers.go).
import (
	_ "github.com/vmgate/vmgate/plugins/libvirt"
	_ "github.com/vmgate/vmgate/plugins/proxmox"
	_ "github.com/vmgate/vmgate/plugins/qemu"
	_ "github.com/vmgate/vmgate/plugins/virtualbox"
)
