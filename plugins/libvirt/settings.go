package libvirt

import (
	"context"
	"path"
	"strings"

	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/plugins/internal/helperchan"
)

// The driver registers itself as "libvirt": the binary links it in with a
// blank import.
func init() {
	registry.Register(Name, func(_ context.Context, s *Settings) (*Driver, error) { return New(s.config()) })
}

// Name is the driver's name in vmgate.yaml.
const Name = "libvirt"

// Settings are the libvirt driver's settings: the "settings" of a libvirt
// backend in vmgate.yaml and the configuration its plugin gets. Every
// setting is optional: none means every domain of the local system
// libvirtd, with the defaults.
type Settings struct {
	// URI is libvirtd's URI (see Config.URI); empty means qemu:///system.
	URI string `json:"uri,omitempty"`
	// NameGlob lists only the domains whose name matches (path.Match syntax).
	NameGlob string `json:"name_glob,omitempty"`
	// MetadataURI lists only the domains with a <metadata> element in this
	// XML namespace.
	MetadataURI string `json:"metadata_uri,omitempty"`
	// ExecTimeout; zero means DefaultExecTimeout.
	ExecTimeout registry.Duration `json:"exec_timeout,omitempty"`
	// InfoTTL; zero means DefaultInfoTTL.
	InfoTTL registry.Duration `json:"info_ttl,omitempty"`
	// DialTimeout; zero means DefaultDialTimeout.
	DialTimeout registry.Duration `json:"dial_timeout,omitempty"`
	// HelperSilenceLimit is how long a resident helper may stay silent
	// while it owes an answer before its channel is given up (and dialled
	// again on the next call): unset means 30 s; at least 2 s, at most
	// 1 h.
	HelperSilenceLimit registry.Duration `json:"helper_silence_limit,omitempty"`
}

var _ registry.Settings = (*Settings)(nil)

// Validate checks the settings by the driver's own rules (New's), without
// connecting.
func (s *Settings) Validate() error {
	_, err := s.config().check()
	return err
}

func (s *Settings) config() Config {
	return Config{URI: s.URI, NameGlob: s.NameGlob, MetadataURI: s.MetadataURI,
		ExecTimeout: s.ExecTimeout.D(), InfoTTL: s.InfoTTL.D(), DialTimeout: s.DialTimeout.D(),
		HelperSilenceLimit: s.HelperSilenceLimit.D()}
}

// check validates cfg and parses its URI; errors are *registry.FieldError
// named after the settings.
func (cfg Config) check() (endpoint, error) {
	ep, err := parseURI(cfg.URI)
	if err != nil {
		return endpoint{}, registry.Within("uri", err)
	}
	if cfg.NameGlob != "" {
		if _, err := path.Match(cfg.NameGlob, ""); err != nil {
			return endpoint{}, registry.Fieldf("name_glob", "%q: %w", cfg.NameGlob, err)
		}
	}
	if cfg.MetadataURI != "" && (strings.ContainsAny(cfg.MetadataURI, " \t\n\"'<>&") || !strings.Contains(cfg.MetadataURI, ":")) {
		return endpoint{}, registry.Fieldf("metadata_uri", "%q: want an absolute URI", cfg.MetadataURI)
	}
	for _, d := range []struct {
		name string
		neg  bool
	}{{"exec_timeout", cfg.ExecTimeout < 0}, {"info_ttl", cfg.InfoTTL < 0}, {"dial_timeout", cfg.DialTimeout < 0}} {
		if d.neg {
			return endpoint{}, registry.Fieldf(d.name, "negative")
		}
	}
	if err := helperchan.CheckSilenceLimit(cfg.HelperSilenceLimit); err != nil {
		return endpoint{}, registry.Fieldf("helper_silence_limit", "%w", err)
	}
	return ep, nil
}
