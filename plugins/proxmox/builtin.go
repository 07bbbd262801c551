package proxmox

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
// (the "settings" of a pve backend in vmgate.yaml).
type JSONConfig struct {
	URL                string `json:"url"`
	TokenID            string `json:"token_id"`
	TokenSecretFile    string `json:"token_secret_file"`
	CAFile             string `json:"ca_file,omitempty"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify,omitempty"`
	// ExecTimeout is a Go duration ("10m"); empty means DefaultExecTimeout.
	ExecTimeout string `json:"exec_timeout,omitempty"`
}

// NewFromJSON builds a Driver from a JSONConfig, decoded strictly (unknown
// fields and trailing data are errors), with Open: the token's privileges
// are checked at once. It has the signature of the plugin host's Builtin,
// so it can be registered as a built-in driver.
func NewFromJSON(ctx context.Context, config []byte) (hypervisor.Driver, error) {
	var jc JSONConfig
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&jc); err != nil {
		return nil, fmt.Errorf("proxmox: config: %w: %w", hypervisor.ErrInvalidArgument, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("proxmox: config: %w: trailing data", hypervisor.ErrInvalidArgument)
	}
	cfg := Config{URL: jc.URL, TokenID: jc.TokenID, TokenSecretFile: jc.TokenSecretFile, CAFile: jc.CAFile, InsecureSkipVerify: jc.InsecureSkipVerify}
	if jc.ExecTimeout != "" {
		d, err := time.ParseDuration(jc.ExecTimeout)
		if err != nil {
			return nil, fmt.Errorf("proxmox: config: exec_timeout: %w: %w", hypervisor.ErrInvalidArgument, err)
		}
		cfg.ExecTimeout = d
	}
	d, err := Open(ctx, cfg)
	if err != nil {
		return nil, err // a nil interface, not a nil *Driver inside one
	}
	return d, nil
}
