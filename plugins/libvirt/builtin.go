package libvirt

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
// (the "settings" of a libvirt backend in vmgate.yaml).
type JSONConfig struct {
	// URI is libvirtd's URI (see Config.URI); empty means qemu:///system.
	URI string `json:"uri,omitempty"`
	// NameGlob lists only the domains whose name matches (path.Match syntax).
	NameGlob string `json:"name_glob,omitempty"`
	// MetadataURI lists only the domains with a <metadata> element in this
	// XML namespace.
	MetadataURI string `json:"metadata_uri,omitempty"`
	// ExecTimeout is a Go duration ("10m"); empty means DefaultExecTimeout.
	ExecTimeout string `json:"exec_timeout,omitempty"`
	// InfoTTL is a Go duration ("5s"); empty means DefaultInfoTTL.
	InfoTTL string `json:"info_ttl,omitempty"`
	// DialTimeout is a Go duration ("10s"); empty means DefaultDialTimeout.
	DialTimeout string `json:"dial_timeout,omitempty"`
}

// NewFromJSON builds a Driver from a JSONConfig, decoded strictly (unknown
// fields and trailing data are errors). It has the signature of the plugin
// host's Builtin, so it can be registered as a built-in driver. Every
// setting is optional: an empty config means the local system daemon with
// the defaults. Nothing is connected until the first call.
func NewFromJSON(_ context.Context, config []byte) (hypervisor.Driver, error) {
	var jc JSONConfig
	trimmed := bytes.TrimSpace(config)
	if len(trimmed) == 0 {
		trimmed = []byte("{}")
	}
	if trimmed[0] != '{' {
		return nil, fmt.Errorf("libvirt: config: %w: want a JSON object", hypervisor.ErrInvalidArgument)
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&jc); err != nil {
		return nil, fmt.Errorf("libvirt: config: %w: %w", hypervisor.ErrInvalidArgument, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("libvirt: config: %w: trailing data", hypervisor.ErrInvalidArgument)
	}
	cfg := Config{URI: jc.URI, NameGlob: jc.NameGlob, MetadataURI: jc.MetadataURI}
	for _, f := range []struct {
		name string
		in   string
		out  *time.Duration
	}{
		{"exec_timeout", jc.ExecTimeout, &cfg.ExecTimeout},
		{"info_ttl", jc.InfoTTL, &cfg.InfoTTL},
		{"dial_timeout", jc.DialTimeout, &cfg.DialTimeout},
	} {
		if f.in == "" {
			continue
		}
		d, err := time.ParseDuration(f.in)
		if err != nil {
			return nil, fmt.Errorf("libvirt: config: %s: %w: %w", f.name, hypervisor.ErrInvalidArgument, err)
		}
		if d <= 0 {
			return nil, fmt.Errorf("libvirt: config: %s: %w: %q must be positive", f.name, hypervisor.ErrInvalidArgument, f.in)
		}
		*f.out = d
	}
	d, err := New(cfg)
	if err != nil {
		return nil, err // not a typed-nil *Driver in the interface
	}
	return d, nil
}
