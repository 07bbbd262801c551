package virtualbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// JSONConfig is the driver's configuration as the plugin host passes it
// (the "settings" of a VirtualBox backend in vmgate.yaml).
type JSONConfig struct {
	// VBoxManage is the program; empty means VBoxManage on PATH.
	VBoxManage   string `json:"vboxmanage,omitempty"`
	Username     string `json:"username"`
	PasswordFile string `json:"password_file"`
	// GuestTempDir is where stdin is staged in the guest; empty means /tmp.
	GuestTempDir string `json:"guest_temp_dir,omitempty"`
	// ExecTimeout is a Go duration ("10m"); empty means DefaultExecTimeout.
	ExecTimeout string `json:"exec_timeout,omitempty"`
}

// NewFromJSON builds a Driver from a JSONConfig, decoded strictly (unknown
// fields and trailing data are errors). It has the signature of the plugin
// host's Builtin, so it can be registered as a built-in driver.
func NewFromJSON(_ context.Context, config []byte) (hypervisor.Driver, error) {
	var jc JSONConfig
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&jc); err != nil {
		return nil, fmt.Errorf("virtualbox: config: %w: %w", hypervisor.ErrInvalidArgument, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("virtualbox: config: %w: trailing data", hypervisor.ErrInvalidArgument)
	}
	cfg := Config{VBoxManage: jc.VBoxManage, Username: jc.Username, PasswordFile: jc.PasswordFile, GuestTempDir: jc.GuestTempDir}
	if jc.ExecTimeout != "" {
		d, err := time.ParseDuration(jc.ExecTimeout)
		if err != nil {
			return nil, fmt.Errorf("virtualbox: config: exec_timeout: %w: %w", hypervisor.ErrInvalidArgument, err)
		}
		cfg.ExecTimeout = d
	}
	d, err := New(cfg)
	if err != nil {
		return nil, err // a nil interface, not a nil *Driver inside one
	}
	return d, nil
}
