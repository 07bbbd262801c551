package proxmox

import (
	"context"
	"net/url"

	"github.com/vmgate/vmgate/hypervisor/registry"
)

// The driver registers itself as "proxmox": the binary links it in with a
// blank import.
func init() {
	// Open checks the token's privileges at once.
	registry.Register(Name, func(ctx context.Context, s *Settings) (*Driver, error) { return Open(ctx, s.config()) })
}

// Name is the driver's name in vmgate.yaml.
const Name = "proxmox"

// Settings are the proxmox driver's settings: the "settings" of a proxmox
// backend in vmgate.yaml and the configuration its plugin gets.
type Settings struct {
	URL                string `json:"url"`
	TokenID            string `json:"token_id"`
	TokenSecretFile    string `json:"token_secret_file"`
	CAFile             string `json:"ca_file,omitempty"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify,omitempty"`
	// ExecTimeout; zero means DefaultExecTimeout.
	ExecTimeout registry.Duration `json:"exec_timeout,omitempty"`
}

var (
	_ registry.Settings = (*Settings)(nil)
	_ registry.Resolver = (*Settings)(nil)
)

// Resolve makes the token secret and CA files absolute.
func (s *Settings) Resolve(env registry.Env) {
	s.TokenSecretFile, s.CAFile = env.Abs(s.TokenSecretFile), env.Abs(s.CAFile)
}

// Validate checks the settings (New reads the files).
func (s *Settings) Validate() error { return s.config().check() }

func (s *Settings) config() Config {
	return Config{URL: s.URL, TokenID: s.TokenID, TokenSecretFile: s.TokenSecretFile, CAFile: s.CAFile,
		InsecureSkipVerify: s.InsecureSkipVerify, ExecTimeout: s.ExecTimeout.D()}
}

// check validates cfg without reading any file; errors are
// *registry.FieldError named after the settings.
func (cfg Config) check() error {
	u, err := url.Parse(cfg.URL)
	switch {
	case cfg.URL == "":
		return registry.Fieldf("url", "required (https://host:8006)")
	case err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return registry.Fieldf("url", "%q must be https://host[:port] without credentials, query or fragment", cfg.URL)
	case cfg.TokenID == "":
		return registry.Fieldf("token_id", "required (USER@REALM!TOKENID)")
	case !tokenIDRE.MatchString(cfg.TokenID):
		return registry.Fieldf("token_id", "%q must be USER@REALM!TOKENID", cfg.TokenID)
	case cfg.TokenSecretFile == "":
		return registry.Fieldf("token_secret_file", "required (a file holding the API token's secret)")
	case cfg.InsecureSkipVerify && cfg.CAFile != "":
		return registry.Fieldf("", "ca_file and insecure_skip_verify exclude each other")
	case cfg.ExecTimeout < 0:
		return registry.Fieldf("exec_timeout", "negative")
	}
	return nil
}
