package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/plugins/internal/helperchan"
)

// The driver registers itself as "qemu": the binary links it in with a
// blank import.
func init() {
	registry.Register(Name, func(_ context.Context, s *Settings) (*Driver, error) { return New(s.config()) })
}

// Name is the driver's name in vmgate.yaml.
const Name = "qemu"

// Settings are the qemu driver's settings: the "settings" of a qemu
// backend in vmgate.yaml and the configuration its plugin gets.
type Settings struct {
	// VMs are QEMU VMs given by their sockets.
	VMs []VMSettings `json:"vms,omitempty"`
	// Lab adds the VMs of `vmgate lab up` (<state_dir>/lab).
	Lab bool `json:"lab,omitempty"`
	// LabDir is where the lab VMs are: <state_dir>/lab unless given.
	// Giving it implies Lab.
	LabDir string `json:"lab_dir,omitempty"`
	// ExecTimeout bounds a command whose request has no timeout.
	ExecTimeout registry.Duration `json:"exec_timeout,omitempty"`
	// InfoTTL is how long guest-info is cached for the exec preflight.
	InfoTTL registry.Duration `json:"info_ttl,omitempty"`
	// HelperSilenceLimit is how long a resident helper may stay silent
	// while it owes an answer before its channel is given up (and dialled
	// again on the next call): unset means 30 s; at least 2 s, at most
	// 1 h.
	HelperSilenceLimit registry.Duration `json:"helper_silence_limit,omitempty"`
}

// VMSettings are one QEMU VM given by its sockets.
type VMSettings struct {
	Name string `json:"name"`
	QMP  string `json:"qmp"`
	QGA  string `json:"qga"`
	// Helper is the host end of the VM's virtio-serial port
	// org.vmgate.guest.0, where vmgate-guest's resident helper listens
	// (optional: without it, helper commands start a process through the
	// guest agent).
	Helper string `json:"helper,omitempty"`
	// Events is a second QMP monitor of the VM (-chardev socket,...
	// -mon chardev=...,mode=control), held by the driver to hear the
	// helper's port close (VSERPORT_CHANGE; the port's -device needs an
	// id) instead of waiting out the silence limit. Optional.
	Events string `json:"events,omitempty"`
	// Console and ConsoleLog are the VM's serial console: the path of a
	// socket chardev (server=on) and its logfile, for vm_console_write
	// and vm_console_read. Optional.
	Console    string `json:"console,omitempty"`
	ConsoleLog string `json:"console_log,omitempty"`
}

var (
	_ registry.Settings        = (*Settings)(nil)
	_ registry.Resolver        = (*Settings)(nil)
	_ registry.TemplateChecker = (*Settings)(nil)
	_ registry.CreateBounder   = (*Settings)(nil)
)

// CreateBounds are the lab's: a created VM boots the lab image.
func (s *Settings) CreateBounds() hypervisor.CreateBounds {
	return hypervisor.CreateBounds{MinMemoryMB: lab.MinMemoryMB, MaxMemoryMB: lab.MaxMemoryMB, MaxCPUs: lab.MaxCPUs,
		Why: fmt.Sprintf("the lab image needs %d MiB to boot", lab.MinMemoryMB)}
}

// CheckTemplate: the QEMU driver makes VMs in its lab directory only.
func (s *Settings) CheckTemplate(json.RawMessage) error {
	if s.LabDir == "" {
		return errors.New("makes VMs in its lab directory: give it lab: true")
	}
	return nil
}

// Resolve makes the socket paths absolute and puts the lab under the state
// directory.
func (s *Settings) Resolve(env registry.Env) {
	for i := range s.VMs {
		s.VMs[i].QMP, s.VMs[i].QGA = env.Abs(s.VMs[i].QMP), env.Abs(s.VMs[i].QGA)
		s.VMs[i].Helper, s.VMs[i].Events = env.Abs(s.VMs[i].Helper), env.Abs(s.VMs[i].Events)
		s.VMs[i].Console, s.VMs[i].ConsoleLog = env.Abs(s.VMs[i].Console), env.Abs(s.VMs[i].ConsoleLog)
	}
	if s.Lab && s.LabDir == "" && env.StateDir != "" {
		s.LabDir = filepath.Join(env.StateDir, "lab")
	}
	s.LabDir = env.Abs(s.LabDir)
}

// Validate checks the settings: some VMs or the lab, and every VM named
// once with both sockets.
func (s *Settings) Validate() error {
	if s.Lab && s.LabDir == "" {
		return registry.Fieldf("lab_dir", "required with lab: true (the config loader sets it to <state_dir>/lab)")
	}
	if s.LabDir == "" && len(s.VMs) == 0 {
		return registry.Fieldf("", "give vms, lab: true, or both")
	}
	return s.config().check()
}

// config is the driver configuration the settings describe.
func (s *Settings) config() Config {
	cfg := Config{LabDir: s.LabDir, ExecTimeout: s.ExecTimeout.D(), InfoTTL: s.InfoTTL.D(), HelperSilenceLimit: s.HelperSilenceLimit.D()}
	for _, vm := range s.VMs {
		cfg.VMs = append(cfg.VMs, VMConfig{Name: vm.Name, QMPSocket: vm.QMP, QGASocket: vm.QGA, HelperSocket: vm.Helper, EventsSocket: vm.Events,
			ConsoleSocket: vm.Console, ConsoleLog: vm.ConsoleLog})
	}
	return cfg
}

var vmName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// check validates cfg; errors are *registry.FieldError named after the
// settings (vms[1].name).
func (cfg Config) check() error {
	if cfg.ExecTimeout < 0 {
		return registry.Fieldf("exec_timeout", "negative")
	}
	if cfg.InfoTTL < 0 {
		return registry.Fieldf("info_ttl", "negative")
	}
	if err := helperchan.CheckSilenceLimit(cfg.HelperSilenceLimit); err != nil {
		return registry.Fieldf("helper_silence_limit", "%w", err)
	}
	seen := make(map[string]bool, len(cfg.VMs))
	for i, vm := range cfg.VMs {
		err := func() error {
			switch {
			case !vmName.MatchString(vm.Name):
				return registry.Fieldf("name", "%q is not a valid VM name ([A-Za-z0-9][A-Za-z0-9._-], at most 64)", vm.Name)
			case seen[vm.Name]:
				return registry.Fieldf("name", "%q defined twice", vm.Name)
			case vm.QMPSocket == "":
				return registry.Fieldf("qmp", "required (the VM's QMP socket)")
			case vm.QGASocket == "":
				return registry.Fieldf("qga", "required (the VM's guest agent socket)")
			case vm.EventsSocket != "" && vm.HelperSocket == "":
				return registry.Fieldf("events", "watches the helper's port: give helper too")
			}
			return nil
		}()
		if err != nil {
			return registry.Within(fmt.Sprintf("vms[%d]", i), err)
		}
		seen[vm.Name] = true
	}
	return nil
}
