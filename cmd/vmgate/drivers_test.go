package main

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/internal/pluginhost"
)

// builtins are the drivers the binary ships; drivers.go must link in each.
var builtins = []string{"libvirt", "proxmox", "qemu", "virtualbox"}

// TestRegisteredDrivers: the binary's blank imports register every
// built-in driver, the plugin host's table is the registry's, and each
// driver refuses bad settings rather than starting half-configured.
func TestRegisteredDrivers(t *testing.T) {
	if got := registry.Names(); !slices.Equal(got, builtins) {
		t.Errorf("registry.Names() = %v; want %v", got, builtins)
	}
	reg := pluginhost.Registered()
	if got := slices.Sorted(maps.Keys(reg)); !slices.Equal(got, builtins) {
		t.Errorf("pluginhost.Registered() has %v; want %v", got, builtins)
	}
	for _, name := range builtins {
		if !config.IsBuiltin(name) {
			t.Errorf("config.IsBuiltin(%q) = false; want true", name)
		}
		build, ok := reg[name]
		if !ok {
			continue
		}
		for _, bad := range []string{`{"no_such_field": true}`, `{"exec_timeout": "-1s"}`, `{"exec_timeout": 60}`, `[]`, `{} {}`} {
			if d, err := build(context.Background(), []byte(bad)); !errors.Is(err, hypervisor.ErrInvalidArgument) {
				t.Errorf("Registered()[%q](%s) = %v, %v; want %v", name, bad, d, err, hypervisor.ErrInvalidArgument)
			}
		}
	}
	if config.IsBuiltin("firecracker") {
		t.Errorf("config.IsBuiltin(firecracker) = true; want false (an external plugin)")
	}
}

// TestConfigSettingsBuildTheDrivers: the DriverConfig that config.Parse
// makes of a backend's settings in vmgate.yaml is what the built-in driver
// of that name accepts, for every built-in driver.
func TestConfigSettingsBuildTheDrivers(t *testing.T) {
	dir := t.TempDir()
	for name, mode := range map[string]os.FileMode{"pve.secret": 0o600, "vbox.pw": 0o600, "VBoxManage": 0o755} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("s3cret\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	doc := `state_dir: state
grants: [{name: local, policy: builtin:default}]
backends:
  - {name: lab, driver: qemu, settings: {lab: true, exec_timeout: 1m, info_ttl: 2s, vms: [{name: v1, qmp: q.sock, qga: g.sock}]}}
  - {name: pve, driver: proxmox, settings: {url: "https://pve:8006", token_id: "vmgate@pve!agent", token_secret_file: pve.secret, exec_timeout: 30s}}
  - {name: vbox, driver: virtualbox, settings: {vboxmanage: ./VBoxManage, username: vagrant, password_file: vbox.pw, exec_timeout: 5m}}
  - {name: virt, driver: libvirt, settings: {uri: "qemu+tcp://virt.example/system", name_glob: "vmgate-*", metadata_uri: "urn:vmgate:vm", exec_timeout: 5m, info_ttl: 2s, dial_timeout: 3s}}
`
	cfg, err := config.Parse([]byte(doc), dir, "")
	if err != nil {
		t.Fatalf("config.Parse() = %v", err)
	}
	reg := pluginhost.Registered()
	var covered []string
	for _, b := range cfg.Backends {
		build, ok := reg[b.Driver]
		if !ok {
			t.Fatalf("backend %s: driver %q is not registered", b.Name, b.Driver)
		}
		d, err := build(context.Background(), b.DriverConfig)
		if err != nil {
			t.Errorf("Registered()[%q](%s) = %v; want the driver", b.Driver, b.DriverConfig, err)
			continue
		}
		if c, ok := d.(hypervisor.Closer); ok {
			c.Close()
		}
		covered = append(covered, b.Driver)
	}
	slices.Sort(covered)
	if !slices.Equal(covered, builtins) {
		t.Errorf("drivers built from config = %v; want every built-in %v", covered, builtins)
	}
}
