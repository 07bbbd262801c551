package pluginhost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// Builtin builds a built-in driver from its JSON configuration (empty means
// none). It must validate config before any side effect.
type Builtin func(ctx context.Context, config []byte) (hypervisor.Driver, error)

// Registry maps built-in driver names to their constructors.
type Registry map[string]Builtin

// The full set of drivers compiled into vmgate is internal/drivers.Registry:
// it lives there because the drivers' own plugin tests import this package.

// ServeBuiltin serves the built-in driver name from reg as a plugin on this
// process's stdio handshake (the body of `vmgate plugin NAME`). The driver is
// built when the host's Configure arrives. It returns an error at once for a
// name reg does not have; otherwise it returns when the host stops the plugin.
func ServeBuiltin(reg Registry, name string) error {
	build, ok := reg[name]
	if !ok {
		return fmt.Errorf("pluginhost: serve: %w: %q", ErrUnknownDriver, name)
	}
	hypervisor.Serve(hypervisor.NewDeferred(func(ctx context.Context, config []byte) (hypervisor.Driver, error) {
		return build(ctx, config)
	}))
	return nil
}

// QEMUConfig is the JSON configuration of the built-in qemu driver.
type QEMUConfig struct {
	// LabDir is <stateDir>/lab: every lab VM found there.
	LabDir string `json:"lab_dir,omitempty"`
	// VMs are QEMU VMs given by their sockets.
	VMs []QEMUVM `json:"vms,omitempty"`
	// ExecTimeout bounds a command whose request has no timeout ("10m").
	ExecTimeout Duration `json:"exec_timeout,omitempty"`
	// InfoTTL is how long guest-info is cached ("5s").
	InfoTTL Duration `json:"info_ttl,omitempty"`
}

// QEMUVM is one configured QEMU VM.
type QEMUVM struct {
	Name      string `json:"name"`
	QMPSocket string `json:"qmp_socket"`
	QGASocket string `json:"qga_socket"`
}

// Duration is a time.Duration written as a Go duration string in JSON.
type Duration time.Duration

// MarshalJSON writes d as "1m30s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string like \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// DecodeConfig decodes a driver's JSON configuration strictly into v: unknown
// fields and trailing data are errors wrapping hypervisor.ErrInvalidArgument.
// Empty config leaves v unchanged.
func DecodeConfig(config []byte, v any) error {
	if len(bytes.TrimSpace(config)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", hypervisor.ErrInvalidArgument, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: trailing data after the configuration object", hypervisor.ErrInvalidArgument)
	}
	return nil
}

// NewQEMU is the qemu Builtin: it decodes a QEMUConfig and builds the driver.
func NewQEMU(_ context.Context, config []byte) (hypervisor.Driver, error) {
	var c QEMUConfig
	if err := DecodeConfig(config, &c); err != nil {
		return nil, fmt.Errorf("qemu: config: %w", err)
	}
	cfg := qemu.Config{LabDir: c.LabDir, ExecTimeout: time.Duration(c.ExecTimeout), InfoTTL: time.Duration(c.InfoTTL)}
	for _, vm := range c.VMs {
		cfg.VMs = append(cfg.VMs, qemu.VMConfig{Name: vm.Name, QMPSocket: vm.QMPSocket, QGASocket: vm.QGASocket})
	}
	d, err := qemu.New(cfg)
	if err != nil {
		return nil, err // not a typed nil in a non-nil interface
	}
	return d, nil
}
