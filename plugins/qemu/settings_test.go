package qemu

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
)

// TestRegisteredSettings: the driver's JSON settings as the plugin host
// sends them build the driver; bad ones are refused with
// ErrInvalidArgument before anything is connected.
func TestRegisteredSettings(t *testing.T) {
	tests := []struct {
		config string
		ok     bool
	}{
		{`{"lab":true,"lab_dir":"/s/lab","exec_timeout":"90s","info_ttl":"5s"}`, true},
		{`{"lab_dir":"/s/lab"}`, true},
		{`{"vms":[{"name":"vm1","qmp":"q.sock","qga":"g.sock"}]}`, true},
		{``, false},   // neither VMs nor a lab
		{`{}`, false}, // the same
		{`{"lab":true}`, false},
		{`{"lab_dir":"lab","lab_dir2":"x"}`, false},
		{`{"lab_dir":"a","lab_dir":"b"}`, false},
		{`{"lab_dir":"lab","exec_timeout":90}`, false},
		{`{"lab_dir":"lab","exec_timeout":"soon"}`, false},
		{`{"lab_dir":"lab","exec_timeout":"-1s"}`, false},
		{`{"lab_dir":"lab","info_ttl":"0s"}`, false},
		{`{"lab_dir":"lab"} {}`, false},
		{`[]`, false},
		{`null`, false},
		{`{"vms":[{"name":"vm1"}]}`, false},
		{`{"vms":[{"name":"vm1","qmp":"q","qga":"g"},{"name":"vm1","qmp":"q2","qga":"g2"}]}`, false},
		{`{"vms":[{"name":"Bad Name!","qmp":"q","qga":"g"}]}`, false},
		{`{"vms":[{"name":"vm1","qmp_socket":"q","qga_socket":"g"}]}`, false},
	}
	for _, tt := range tests {
		d, err := registry.New(context.Background(), Name, []byte(tt.config))
		if (err == nil) != tt.ok {
			t.Errorf("registry.New(Name, %s) = %v; want ok=%v", tt.config, err, tt.ok)
		}
		if err != nil && !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("registry.New(Name, %s) = %v; want ErrInvalidArgument", tt.config, err)
		}
		if c, ok := d.(hypervisor.Closer); ok {
			c.Close()
		}
	}
}

// TestSettingsReachTheConfig: every setting ends up in the driver's Config.
func TestSettingsReachTheConfig(t *testing.T) {
	d, err := registry.New(context.Background(), Name,
		[]byte(`{"lab_dir":"/s/lab","exec_timeout":"90s","info_ttl":"2s","vms":[{"name":"vm1","qmp":"/q.sock","qga":"/g.sock"}]}`))
	if err != nil {
		t.Fatalf("registry.New(Name, ) = %v", err)
	}
	drv := d.(*Driver)
	defer drv.Close()
	want := Config{LabDir: "/s/lab", ExecTimeout: 90 * time.Second, InfoTTL: 2 * time.Second,
		VMs: []VMConfig{{Name: "vm1", QMPSocket: "/q.sock", QGASocket: "/g.sock"}}}
	got := drv.cfg
	got.Logger = nil
	if got.LabDir != want.LabDir || got.ExecTimeout != want.ExecTimeout || got.InfoTTL != want.InfoTTL ||
		len(got.VMs) != 1 || got.VMs[0] != want.VMs[0] {
		t.Errorf("driver config = %+v; want %+v", got, want)
	}
}

// TestSettingsResolve: relative sockets follow the config file; lab: true
// puts the lab under the state directory; a given lab_dir is kept; an
// optional socket left out stays out.
func TestSettingsResolve(t *testing.T) {
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join("/etc/vmgate", p)
	}
	s := Settings{Lab: true, VMs: []VMSettings{{Name: "a", QMP: "q.sock", QGA: "/run/g.sock", Helper: "h.sock"}}}
	s.Resolve(registry.Env{Abs: abs, StateDir: "/var/lib/vmgate"})
	if s.LabDir != "/var/lib/vmgate/lab" || s.VMs[0].QMP != "/etc/vmgate/q.sock" || s.VMs[0].QGA != "/run/g.sock" ||
		s.VMs[0].Helper != "/etc/vmgate/h.sock" || s.VMs[0].Events != "" {
		t.Errorf("Resolve() = %+v; want the lab under the state dir and the sockets absolute", s)
	}
	own := Settings{Lab: true, LabDir: "labs"}
	own.Resolve(registry.Env{Abs: abs, StateDir: "/var/lib/vmgate"})
	if own.LabDir != "/etc/vmgate/labs" {
		t.Errorf("Resolve(lab_dir: labs).LabDir = %q; want /etc/vmgate/labs", own.LabDir)
	}
}
