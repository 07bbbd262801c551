// Command vboxmanage is the VBoxManage emulator (package vboxemu) as a
// program: it finds its emulated host in vbox.json next to its own
// executable.
package main

import (
	"os"

	"github.com/vmgate/vmgate/internal/vboxemu"
)

func main() {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	os.Exit(vboxemu.Main(os.Args[1:], os.Stdout, os.Stderr, exe, os.Environ()))
}
