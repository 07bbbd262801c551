package drivers

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/hypervisor"
)

// TestRegistry: every built-in driver is registered and refuses a bad
// config rather than starting half-configured.
func TestRegistry(t *testing.T) {
	reg := Registry()
	for _, name := range []string{"qemu", "proxmox", "virtualbox", "libvirt"} {
		build, ok := reg[name]
		if !ok {
			t.Errorf("Registry()[%q] missing", name)
			continue
		}
		if d, err := build(context.Background(), []byte(`{"no_such_field": true}`)); err == nil {
			t.Errorf("Registry()[%q](unknown field) = %v, nil; want an error", name, d)
		}
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
	reg := Registry()
	var covered []string
	for _, b := range cfg.Backends {
		build, ok := reg[b.Driver]
		if !ok {
			t.Fatalf("backend %s: driver %q is not in Registry()", b.Name, b.Driver)
		}
		d, err := build(context.Background(), b.DriverConfig)
		if err != nil {
			t.Errorf("Registry()[%q](%s) = %v; want the driver", b.Driver, b.DriverConfig, err)
			continue
		}
		if c, ok := d.(hypervisor.Closer); ok {
			c.Close()
		}
		covered = append(covered, b.Driver)
	}
	slices.Sort(covered)
	builtins := slices.Sorted(maps.Keys(reg))
	if !slices.Equal(builtins, slices.Sorted(slices.Values(config.BuiltinDrivers))) {
		t.Errorf("Registry() has %v; config.BuiltinDrivers = %v; want the same drivers", builtins, config.BuiltinDrivers)
	}
	if !slices.Equal(covered, builtins) {
		t.Errorf("drivers built from config = %v; want every built-in %v", covered, builtins)
	}
}
