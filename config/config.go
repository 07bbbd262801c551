// Package config reads vmgate.yaml, strictly: unknown keys, duplicate keys,
// wrong types and invalid values are errors naming the field, and nothing
// is guessed. With no file, Default gives the embedded defaults: bbolt
// store and audit log under the state directory, the lab VMs as backend
// "lab", and grant "local" with the built-in default policy.
//
// A Config is plain data: reading policy files and opening stores is the
// caller's job (cmd/vmgate serve).
package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"

	"gopkg.in/yaml.v3"
)

// defaultPolicy is the built-in policy document: read-only tools allowed,
// exec, kill and snapshot_create rate-limited, destroy_session, vm_power,
// snapshot_revert and snapshot_delete need an operator's approval, file writes denied, sessions sandboxed as tightly as
// is useful (net none, their own uid, write only their own directories;
// only cgroup v2 may be missing, membership then goes by the uid).
//
//go:embed default_policy.json
var defaultPolicy []byte

// DefaultPolicy returns the built-in policy document (a copy).
func DefaultPolicy() []byte { return bytes.Clone(defaultPolicy) }

// BuiltinPolicy as a grant's policy names DefaultPolicy.
const BuiltinPolicy = "builtin:default"

// sandboxedPolicy is the default policy with every vm_agent_exec confined:
// in a session, or in a sandbox of its own (net none, user session, writes
// only in its own directories), never as root.
//
//go:embed sandboxed_policy.json
var sandboxedPolicy []byte

// BuiltinSandboxed as a grant's policy names the sandboxed built-in policy.
const BuiltinSandboxed = "builtin:sandboxed"

// Builtin returns the built-in policy a grant's policy names (BuiltinPolicy
// or BuiltinSandboxed): its file name and a copy of it; ok is false for a
// file name.
func Builtin(name string) (file string, doc []byte, ok bool) {
	switch name {
	case BuiltinPolicy:
		return "default_policy.json", DefaultPolicy(), true
	case BuiltinSandboxed:
		return "sandboxed_policy.json", bytes.Clone(sandboxedPolicy), true
	}
	return "", nil, false
}

// The store types.
const (
	StoreBolt   = "bolt"
	StoreMemory = "memory"
	StoreRedis  = "redis"
)

// The audit fsync modes.
const (
	FsyncAlways   = "always"
	FsyncInterval = "interval"
)

// MaxFileSize bounds a config file.
const MaxFileSize = 1 << 20

// Config is vmgate.yaml.
type Config struct {
	StateDir string    `yaml:"state_dir"`
	Store    Store     `yaml:"store"`
	Audit    Audit     `yaml:"audit"`
	Grants   []Grant   `yaml:"grants"`
	Backends []Backend `yaml:"backends"`
	// PluginDir holds external drivers (executables vmgate-plugin-NAME).
	PluginDir string   `yaml:"plugin_dir"`
	HTTP      HTTP     `yaml:"http"`
	Limits    Limits   `yaml:"limits"`
	Operator  Operator `yaml:"operator"`
	Metrics   Metrics  `yaml:"metrics"`
	// Templates are what vm_create makes VMs from (templates.go).
	Templates []Template `yaml:"templates"`

	// root is the parsed document, for the lines of errors.
	root *yaml.Node
}

// Operator is the person who approves parked calls on the web page (/ui
// on the HTTP listener). Its token is separate from every grant's: a
// grant's token does not open the page, and the operator token is not a
// grant. Empty TokenSHA256 means no web page.
type Operator struct {
	// Name is who the audit log says decided an approval (default "operator").
	Name string `yaml:"name"`
	// TokenSHA256 is the hex SHA-256 of the operator's token.
	TokenSHA256 string `yaml:"token_sha256"`
}

// Metrics configures the Prometheus endpoint /metrics. With Addr it has a
// listener of its own; otherwise it is served on the HTTP listener behind
// the operator token (Authorization: Bearer), or not at all without one.
type Metrics struct {
	Addr string `yaml:"addr"`
	// Replica is the value of the constant label replica on every series,
	// so that the replicas behind one address tell themselves apart. With
	// store type redis it defaults to the host name (set it when several
	// replicas share a host); otherwise there is no such label.
	Replica string `yaml:"replica"`
	// PerVMLabels adds one series per VM (vmgate_vm_state{backend, vm,
	// state}); off, no series carries a VM's name (server/metrics).
	PerVMLabels bool `yaml:"per_vm_labels"`
}

// replicaRE is what a replica label may be.
var replicaRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`)

// ReplicaLabel is the replica label of this process's metrics: metrics.replica,
// else the host name with store type redis, else "" (no label).
func (c *Config) ReplicaLabel() string {
	if c.Metrics.Replica != "" || c.Store.Type != StoreRedis {
		return c.Metrics.Replica
	}
	if h, err := os.Hostname(); err == nil && replicaRE.MatchString(h) {
		return h
	}
	return "unknown"
}

// Store selects the counter and approval store.
type Store struct {
	Type   string `yaml:"type"`   // bolt (default), memory or redis
	Path   string `yaml:"path"`   // bolt: the file (default <state_dir>/store.db)
	URL    string `yaml:"url"`    // redis: redis://… (one server)
	Prefix string `yaml:"prefix"` // redis: key prefix
	// Sentinel (redis, instead of url): the primary Redis Sentinel
	// watches, followed through failovers (store.go).
	Sentinel *Sentinel `yaml:"sentinel"`
}

// Audit configures the audit log.
type Audit struct {
	Path    string `yaml:"path"`     // default <state_dir>/audit.log
	KeyFile string `yaml:"key_file"` // default next to the log
	Fsync   string `yaml:"fsync"`    // always (default) or interval
}

// Grant is one identity.
type Grant struct {
	Name string `yaml:"name"`
	// TokenSHA256 is the hex SHA-256 of the grant's HTTP bearer token.
	TokenSHA256 string `yaml:"token_sha256"`
	// Policy is a policy file (relative to the config file), BuiltinPolicy
	// or BuiltinSandboxed.
	Policy string `yaml:"policy"`
	// VMs are globs over VM ids ("lab/*"); empty means every VM.
	VMs []string `yaml:"vms"`
	// RequestsPerMinute overrides http.requests_per_minute for this grant.
	RequestsPerMinute int `yaml:"requests_per_minute"`
}

// HTTP configures `serve --http`.
type HTTP struct {
	Addr           string   `yaml:"addr"`
	AllowedOrigins []string `yaml:"allowed_origins"`
	AllowedHosts   []string `yaml:"allowed_hosts"`
	TLSCert        string   `yaml:"tls_cert"`
	TLSKey         string   `yaml:"tls_key"`
	// RequestsPerMinute is each grant's request budget (0: the default,
	// 1200); a grant's own requests_per_minute overrides it.
	RequestsPerMinute int `yaml:"requests_per_minute"`
	// BodyTimeoutS is how long a client has to send a request body (0: 10).
	BodyTimeoutS int          `yaml:"body_timeout_s"`
	Sessions     HTTPSessions `yaml:"sessions"`
}

// Limits are the server's caps.
type Limits struct {
	MaxOutputBytes int64 `yaml:"max_output_bytes"`
	MaxTimeoutS    int64 `yaml:"max_timeout_s"`
}

// Default is the configuration used when there is no config file.
func Default(stateDir string) *Config {
	c := &Config{
		StateDir: stateDir,
		Grants:   []Grant{{Name: "local", Policy: BuiltinPolicy}},
		Backends: []Backend{{Name: "lab", Driver: DriverQEMU, Settings: yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{
			{Kind: yaml.ScalarNode, Tag: "!!str", Value: "lab"},
			{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"},
		}}}},
		Templates: []Template{{Name: "lab", Backend: "lab",
			MemoryMB: Range{Min: ptr[int64](128), Max: ptr[int64](1024)},
			CPUs:     Range{Max: ptr[int64](2)}}},
	}
	err := c.Backends[0].decodeSettings(0)
	if err == nil {
		c.fill("")
		if err := c.validateTemplates(); err != nil {
			panic("config: the default templates do not validate: " + err.Error()) // a bug, not input
		}
		err = c.buildDriverConfigs()
	}
	if err != nil {
		panic("config: the default backends do not build: " + err.Error()) // a bug, not input
	}
	return c
}

// Load reads and validates the config file at name. defaultStateDir is
// used when the file sets no state_dir.
func Load(name, defaultStateDir string) (*Config, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", name, err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("config: %s is larger than %d bytes", name, MaxFileSize)
	}
	c, err := Parse(data, filepath.Dir(name), defaultStateDir)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", name, err)
	}
	return c, nil
}

// Parse decodes and validates a config document; relative paths in it are
// resolved against dir.
func Parse(data []byte, dir, defaultStateDir string) (*Config, error) {
	var c Config
	if err := strictDecode(data, &c); err != nil {
		return nil, err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err == nil {
		c.root = &root
	}
	for i := range c.Backends {
		if err := c.Backends[i].decodeSettings(i); err != nil {
			return nil, err
		}
	}
	if c.StateDir == "" {
		c.StateDir = defaultStateDir
	}
	c.fill(dir)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := c.buildDriverConfigs(); err != nil {
		return nil, err
	}
	return &c, nil
}

func strictDecode(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty document")
		}
		return err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("more than one YAML document")
	}
	return nil
}

// fill sets defaults and resolves relative paths against dir.
func (c *Config) fill(dir string) {
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) || dir == "" {
			return p
		}
		return filepath.Join(dir, p)
	}
	c.StateDir = abs(c.StateDir)
	if c.Store.Type == "" {
		c.Store.Type = StoreBolt
	}
	if c.Store.Type == StoreBolt && c.Store.Path == "" && c.StateDir != "" {
		c.Store.Path = filepath.Join(c.StateDir, "store.db")
	}
	c.Store.Path = abs(c.Store.Path)
	if sn := c.Store.Sentinel; sn != nil {
		sn.PasswordFile, sn.SentinelPasswordFile = abs(sn.PasswordFile), abs(sn.SentinelPasswordFile)
	}
	if c.Audit.Path == "" && c.StateDir != "" {
		c.Audit.Path = filepath.Join(c.StateDir, "audit.log")
	}
	c.Audit.Path = abs(c.Audit.Path)
	c.Audit.KeyFile = abs(c.Audit.KeyFile)
	if c.Audit.Fsync == "" {
		c.Audit.Fsync = FsyncAlways
	}
	for i := range c.Grants {
		if _, _, builtin := Builtin(c.Grants[i].Policy); !builtin {
			c.Grants[i].Policy = abs(c.Grants[i].Policy)
		}
	}
	c.PluginDir = abs(c.PluginDir)
	for i := range c.Backends {
		c.Backends[i].resolve(abs, c.StateDir)
	}
	c.HTTP.TLSCert, c.HTTP.TLSKey = abs(c.HTTP.TLSCert), abs(c.HTTP.TLSKey)
}

var (
	grantRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$`)
	sha256hex = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Validate checks every field; the first problem is the error.
func (c *Config) Validate() error {
	if c.StateDir == "" {
		return errors.New("state_dir: required (no default state directory)")
	}
	if err := c.validateStore(); err != nil {
		return err
	}
	if c.Audit.Fsync != FsyncAlways && c.Audit.Fsync != FsyncInterval {
		return fmt.Errorf("audit.fsync: %q (want always or interval)", c.Audit.Fsync)
	}
	tokens, err := c.validateGrants()
	if err != nil {
		return err
	}
	for _, step := range []func() error{c.validateBackends, c.validateTemplates, func() error { return c.validateListeners(tokens) },
		c.validateHTTPLimits, c.validateHTTPOrigins} {
		if err := step(); err != nil {
			return err
		}
	}
	if (c.HTTP.TLSCert == "") != (c.HTTP.TLSKey == "") {
		return errors.New("http: tls_cert and tls_key go together")
	}
	if c.Limits.MaxOutputBytes < 0 || c.Limits.MaxOutputBytes > 1<<30 {
		return fmt.Errorf("limits.max_output_bytes: %d out of range [0, %d]", c.Limits.MaxOutputBytes, 1<<30)
	}
	if c.Limits.MaxTimeoutS < 0 || c.Limits.MaxTimeoutS > 86400 {
		return fmt.Errorf("limits.max_timeout_s: %d out of range [0, 86400]", c.Limits.MaxTimeoutS)
	}
	return nil
}

// validateGrants checks the grants and returns their token hashes (by
// hash, the grant's name).
func (c *Config) validateGrants() (map[string]string, error) {
	if len(c.Grants) == 0 {
		return nil, errors.New("grants: at least one grant is required")
	}
	seen := map[string]bool{}
	tokens := map[string]string{}
	for i, g := range c.Grants {
		if !grantRE.MatchString(g.Name) {
			return nil, fmt.Errorf("grants[%d].name: %q is not a valid grant name", i, g.Name)
		}
		if seen[g.Name] {
			return nil, fmt.Errorf("grants[%d].name: %q defined twice", i, g.Name)
		}
		seen[g.Name] = true
		if g.TokenSHA256 != "" {
			if !sha256hex.MatchString(g.TokenSHA256) {
				return nil, fmt.Errorf("grants[%d].token_sha256: want 64 lowercase hex digits (sha256sum of the token)", i)
			}
			if other, dup := tokens[g.TokenSHA256]; dup {
				return nil, fmt.Errorf("grants[%d].token_sha256: the same token as grant %q", i, other)
			}
			tokens[g.TokenSHA256] = g.Name
		}
		if g.Policy == "" {
			return nil, fmt.Errorf("grants[%d].policy: required (a policy file, %q or %q)", i, BuiltinPolicy, BuiltinSandboxed)
		}
		for j, glob := range g.VMs {
			if _, err := path.Match(glob, ""); err != nil || glob == "" {
				return nil, fmt.Errorf("grants[%d].vms[%d]: bad glob %q", i, j, glob)
			}
		}
	}
	return tokens, nil
}

// validateListeners checks the HTTP and metrics addresses and the
// operator (whose token must be none of the grants' tokens).
func (c *Config) validateListeners(tokens map[string]string) error {
	if c.HTTP.Addr != "" {
		if _, _, err := net.SplitHostPort(c.HTTP.Addr); err != nil {
			return fmt.Errorf("http.addr: %w", err)
		}
	}
	if c.Operator.TokenSHA256 != "" {
		if !sha256hex.MatchString(c.Operator.TokenSHA256) {
			return errors.New("operator.token_sha256: want 64 lowercase hex digits (sha256sum of the token)")
		}
		if g, dup := tokens[c.Operator.TokenSHA256]; dup {
			return fmt.Errorf("operator.token_sha256: the same token as grant %q (the operator needs a token of its own)", g)
		}
	}
	if c.Operator.Name != "" && !grantRE.MatchString(c.Operator.Name) {
		return fmt.Errorf("operator.name: %q is not a valid name", c.Operator.Name)
	}
	if c.Metrics.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Metrics.Addr); err != nil {
			return fmt.Errorf("metrics.addr: %w", err)
		}
	}
	if c.Metrics.Replica != "" && !replicaRE.MatchString(c.Metrics.Replica) {
		return c.fieldError("metrics.replica", "%q: want 1 to 128 of [A-Za-z0-9._:@-]", c.Metrics.Replica)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// PolicyDocument returns the name and bytes of grant g's policy.
func (g Grant) PolicyDocument() (string, []byte, error) {
	if file, doc, ok := Builtin(g.Policy); ok {
		return file, doc, nil
	}
	data, err := os.ReadFile(g.Policy)
	if err != nil {
		return "", nil, fmt.Errorf("config: grant %s: policy: %w", g.Name, err)
	}
	return g.Policy, data, nil
}
