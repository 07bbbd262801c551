package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/plugins/libvirt"
	"github.com/vmgate/vmgate/plugins/proxmox"
	"github.com/vmgate/vmgate/plugins/virtualbox"
)

// The built-in drivers. Any other driver name is an external plugin:
// vmgate-plugin-NAME in plugin_dir.
const (
	DriverQEMU       = "qemu"
	DriverProxmox    = "proxmox"
	DriverVirtualBox = "virtualbox"
	DriverLibvirt    = "libvirt"
)

// BuiltinDrivers are the driver names whose settings Parse checks itself.
var BuiltinDrivers = []string{DriverQEMU, DriverProxmox, DriverVirtualBox, DriverLibvirt}

var (
	// backendNameRE: a backend name is the prefix of its VM ids ("lab/vm1").
	backendNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	// driverNameRE is the plugin host's rule for driver names.
	driverNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
	// proxmoxTokenRE is USER@REALM!TOKENID, as the proxmox driver wants it.
	proxmoxTokenRE = regexp.MustCompile(`^[^\s@!:=]+@[A-Za-z][A-Za-z0-9._-]*![A-Za-z][A-Za-z0-9._-]*$`)
)

// Backend is one hypervisor backend: a driver and its settings.
type Backend struct {
	// Name is the VM-id prefix of the backend's VMs: [a-z0-9][a-z0-9-]{0,31}.
	Name string `yaml:"name"`
	// Driver is a built-in driver (BuiltinDrivers) or NAME of an external
	// plugin vmgate-plugin-NAME in plugin_dir.
	Driver string `yaml:"driver"`
	// InProcess runs a built-in driver inside the server rather than as a
	// plugin process (debugging). External drivers always run as plugins.
	InProcess bool `yaml:"in_process"`
	// Settings are the raw driver settings, checked strictly per built-in
	// driver at load time; an external driver checks its own when launched.
	Settings yaml.Node `yaml:"settings"`

	// QEMU holds the decoded settings of a qemu backend.
	QEMU *QEMUSettings `yaml:"-"`
	// DriverConfig is the JSON configuration the driver gets through the
	// plugin host (pluginhost.Spec.Config); set by Parse and Default.
	DriverConfig json.RawMessage `yaml:"-"`

	// builtin is the decoded settings of a proxmox, virtualbox or libvirt
	// backend (*proxmox.JSONConfig, *virtualbox.JSONConfig,
	// *libvirt.JSONConfig); external holds the
	// settings of an external driver as JSON.
	builtin  any
	external json.RawMessage
}

// QEMUSettings are the settings of driver qemu.
type QEMUSettings struct {
	VMs []QEMUVM `yaml:"vms"`
	// Lab adds the lab VMs of <state_dir>/lab.
	Lab bool `yaml:"lab"`
	// ExecTimeout bounds a command whose request has no timeout ("10m").
	ExecTimeout string `yaml:"exec_timeout"`
	// InfoTTL is how long guest-info is cached ("5s").
	InfoTTL string `yaml:"info_ttl"`
}

// QEMUVM is one QEMU VM given by its sockets.
type QEMUVM struct {
	Name string `yaml:"name"`
	QMP  string `yaml:"qmp"`
	QGA  string `yaml:"qga"`
}

// IsBuiltin reports whether driver is compiled into vmgate.
func IsBuiltin(driver string) bool { return slices.Contains(BuiltinDrivers, driver) }

// decodeSettings checks b.Settings against b.Driver's settings type (every
// key known, every value of the right type) and keeps the decoded value.
// i is b's index, for the error paths.
func (b *Backend) decodeSettings(i int) error {
	at := fmt.Sprintf("backends[%d].settings", i)
	node := &b.Settings
	empty := node.Kind == 0 || (node.Kind == yaml.ScalarNode && node.Tag == "!!null")
	if !empty && node.Kind != yaml.MappingNode {
		return fmt.Errorf("%s: want a mapping (line %d)", at, node.Line)
	}
	switch b.Driver {
	case DriverQEMU:
		var qs QEMUSettings
		if !empty {
			if err := checkNode(node, reflect.TypeOf(qs), "yaml", at); err != nil {
				return err
			}
			if err := node.Decode(&qs); err != nil {
				return fmt.Errorf("%s: %w", at, err)
			}
		}
		b.QEMU = &qs
	case DriverProxmox:
		var pc proxmox.JSONConfig
		if err := decodeJSONSettings(node, empty, &pc, at); err != nil {
			return err
		}
		b.builtin = &pc
	case DriverVirtualBox:
		var vc virtualbox.JSONConfig
		if err := decodeJSONSettings(node, empty, &vc, at); err != nil {
			return err
		}
		b.builtin = &vc
	case DriverLibvirt:
		var lc libvirt.JSONConfig
		if err := decodeJSONSettings(node, empty, &lc, at); err != nil {
			return err
		}
		b.builtin = &lc
	default:
		if !driverNameRE.MatchString(b.Driver) {
			return fmt.Errorf("backends[%d].driver: %q is neither a built-in driver (%s) nor a plugin name ([a-z0-9][a-z0-9_-]{0,31})",
				i, b.Driver, strings.Join(BuiltinDrivers, ", "))
		}
		if empty {
			b.external = json.RawMessage(`{}`)
			return nil
		}
		v, err := nodeValue(node, at)
		if err != nil {
			return err
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("%s: not expressible as JSON: %w", at, err)
		}
		b.external = raw
	}
	return nil
}

// decodeJSONSettings checks node against the json-tagged struct v points
// to, then decodes it through JSON (the way the driver will read it).
func decodeJSONSettings(node *yaml.Node, empty bool, v any, at string) error {
	if empty {
		return nil
	}
	if err := checkNode(node, reflect.TypeOf(v).Elem(), "json", at); err != nil {
		return err
	}
	val, err := nodeValue(node, at)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(val)
	if err != nil {
		return fmt.Errorf("%s: %w", at, err)
	}
	if err := pluginhost.DecodeConfig(raw, v); err != nil {
		return fmt.Errorf("%s: %w", at, err)
	}
	return nil
}

// resolvePaths makes the host-side file names in b's settings absolute.
func (b *Backend) resolvePaths(abs func(string) string) {
	if b.QEMU != nil {
		for j := range b.QEMU.VMs {
			b.QEMU.VMs[j].QMP = abs(b.QEMU.VMs[j].QMP)
			b.QEMU.VMs[j].QGA = abs(b.QEMU.VMs[j].QGA)
		}
	}
	switch s := b.builtin.(type) {
	case *proxmox.JSONConfig:
		s.TokenSecretFile, s.CAFile = abs(s.TokenSecretFile), abs(s.CAFile)
	case *virtualbox.JSONConfig:
		s.PasswordFile = abs(s.PasswordFile)
		if strings.Contains(s.VBoxManage, "/") {
			s.VBoxManage = abs(s.VBoxManage)
		}
	}
}

// validateBackends checks names, drivers and the values of the settings.
func (c *Config) validateBackends() error {
	seen := map[string]bool{}
	for i, b := range c.Backends {
		if !backendNameRE.MatchString(b.Name) {
			return fmt.Errorf("backends[%d].name: %q (want [a-z0-9][a-z0-9-], at most 32: it prefixes the VM ids)", i, b.Name)
		}
		if seen[b.Name] {
			return fmt.Errorf("backends[%d].name: %q defined twice", i, b.Name)
		}
		seen[b.Name] = true
		at := fmt.Sprintf("backends[%d].settings", i)
		var err error
		switch b.Driver {
		case DriverQEMU:
			err = validateQEMU(b.QEMU, at)
		case DriverProxmox:
			s, ok := b.builtin.(*proxmox.JSONConfig)
			if !ok {
				return fmt.Errorf("%s: not decoded (build a Config with Parse)", at)
			}
			err = validateProxmox(s, at)
		case DriverVirtualBox:
			s, ok := b.builtin.(*virtualbox.JSONConfig)
			if !ok {
				return fmt.Errorf("%s: not decoded (build a Config with Parse)", at)
			}
			err = validateVirtualBox(s, at)
		case DriverLibvirt:
			s, ok := b.builtin.(*libvirt.JSONConfig)
			if !ok {
				return fmt.Errorf("%s: not decoded (build a Config with Parse)", at)
			}
			err = validateLibvirt(s, at)
		default:
			if !driverNameRE.MatchString(b.Driver) || b.external == nil {
				return fmt.Errorf("backends[%d].driver: unknown driver %q", i, b.Driver)
			}
			if c.PluginDir == "" {
				return fmt.Errorf("backends[%d].driver: unknown driver %q: not built in (%s) and plugin_dir is not set",
					i, b.Driver, strings.Join(BuiltinDrivers, ", "))
			}
			if b.InProcess {
				return fmt.Errorf("backends[%d].in_process: external driver %q always runs as a plugin", i, b.Driver)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func validateDuration(s, at string) error {
	if s == "" {
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%s: %w", at, err)
	}
	if d <= 0 {
		return fmt.Errorf("%s: %q must be positive", at, s)
	}
	return nil
}

func validateQEMU(q *QEMUSettings, at string) error {
	if q == nil {
		return fmt.Errorf("%s: not decoded (build a Config with Parse)", at)
	}
	if !q.Lab && len(q.VMs) == 0 {
		return fmt.Errorf("%s: give vms, lab: true, or both", at)
	}
	vms := map[string]bool{}
	for j, vm := range q.VMs {
		if !vmNameRE.MatchString(vm.Name) {
			return fmt.Errorf("%s.vms[%d].name: %q is not a valid VM name", at, j, vm.Name)
		}
		if vms[vm.Name] {
			return fmt.Errorf("%s.vms[%d].name: %q defined twice", at, j, vm.Name)
		}
		vms[vm.Name] = true
		if vm.QMP == "" || vm.QGA == "" {
			return fmt.Errorf("%s.vms[%d]: qmp and qga sockets are required", at, j)
		}
	}
	if err := validateDuration(q.ExecTimeout, at+".exec_timeout"); err != nil {
		return err
	}
	return validateDuration(q.InfoTTL, at+".info_ttl")
}

func validateProxmox(s *proxmox.JSONConfig, at string) error {
	u, err := url.Parse(s.URL)
	switch {
	case s.URL == "":
		return fmt.Errorf("%s.url: required (https://host:8006)", at)
	case err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("%s.url: %q must be https://host[:port] without credentials, query or fragment", at, s.URL)
	case s.TokenID == "":
		return fmt.Errorf("%s.token_id: required (USER@REALM!TOKENID)", at)
	case !proxmoxTokenRE.MatchString(s.TokenID):
		return fmt.Errorf("%s.token_id: %q must be USER@REALM!TOKENID", at, s.TokenID)
	case s.TokenSecretFile == "":
		return fmt.Errorf("%s.token_secret_file: required (a file holding the API token's secret)", at)
	case s.InsecureSkipVerify && s.CAFile != "":
		return fmt.Errorf("%s: ca_file and insecure_skip_verify exclude each other", at)
	}
	return validateDuration(s.ExecTimeout, at+".exec_timeout")
}

func validateVirtualBox(s *virtualbox.JSONConfig, at string) error {
	switch {
	case s.Username == "":
		return fmt.Errorf("%s.username: required (the guest account commands run as)", at)
	case strings.HasPrefix(s.Username, "-") || strings.ContainsAny(s.Username, "\x00\r\n"):
		return fmt.Errorf("%s.username: %q must not begin with '-' or hold NUL or a line break", at, s.Username)
	case s.PasswordFile == "":
		return fmt.Errorf("%s.password_file: required (a file holding the guest account's password)", at)
	case s.GuestTempDir != "" && !strings.HasPrefix(s.GuestTempDir, "/"):
		return fmt.Errorf("%s.guest_temp_dir: %q is not an absolute guest path", at, s.GuestTempDir)
	}
	return validateDuration(s.ExecTimeout, at+".exec_timeout")
}

// validateLibvirt checks a libvirt backend's settings by the driver's own
// rules (libvirt.New checks them without connecting), one setting at a
// time so that the error names the setting. Every setting is optional: no
// settings mean every domain of the local system libvirtd.
func validateLibvirt(s *libvirt.JSONConfig, at string) error {
	for _, f := range []struct {
		name string
		set  bool
		cfg  libvirt.Config
	}{
		{"uri", s.URI != "", libvirt.Config{URI: s.URI}},
		{"name_glob", s.NameGlob != "", libvirt.Config{NameGlob: s.NameGlob}},
		{"metadata_uri", s.MetadataURI != "", libvirt.Config{MetadataURI: s.MetadataURI}},
	} {
		if !f.set {
			continue
		}
		d, err := libvirt.New(f.cfg)
		if err != nil {
			return fmt.Errorf("%s.%s: %w", at, f.name, err)
		}
		d.Close() // never connected: New does not dial
	}
	if err := validateDuration(s.ExecTimeout, at+".exec_timeout"); err != nil {
		return err
	}
	if err := validateDuration(s.InfoTTL, at+".info_ttl"); err != nil {
		return err
	}
	return validateDuration(s.DialTimeout, at+".dial_timeout")
}

// buildDriverConfigs sets every backend's DriverConfig. It runs after fill
// (paths resolved, state_dir known) and Validate.
func (c *Config) buildDriverConfigs() error {
	for i := range c.Backends {
		b := &c.Backends[i]
		var v any
		switch {
		case b.Driver == DriverQEMU && b.QEMU != nil:
			qc := pluginhost.QEMUConfig{}
			if b.QEMU.Lab {
				qc.LabDir = filepath.Join(c.StateDir, "lab")
			}
			for _, vm := range b.QEMU.VMs {
				qc.VMs = append(qc.VMs, pluginhost.QEMUVM{Name: vm.Name, QMPSocket: vm.QMP, QGASocket: vm.QGA})
			}
			// Validated by validateQEMU; empty means the driver's default.
			et, _ := time.ParseDuration(b.QEMU.ExecTimeout)
			ttl, _ := time.ParseDuration(b.QEMU.InfoTTL)
			qc.ExecTimeout, qc.InfoTTL = pluginhost.Duration(et), pluginhost.Duration(ttl)
			v = qc
		case b.builtin != nil:
			v = b.builtin
		case b.external != nil:
			b.DriverConfig = b.external
			continue
		default:
			return fmt.Errorf("backends[%d]: driver %q has no decoded settings", i, b.Driver)
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("backends[%d].settings: %w", i, err)
		}
		b.DriverConfig = raw
	}
	return nil
}

// checkNode checks a YAML node against type t, whose struct fields are
// named by their tagKey ("json" or "yaml") tags: unknown and duplicate
// keys, and values of the wrong kind, are errors naming the path and line.
func checkNode(n *yaml.Node, t reflect.Type, tagKey, at string) error {
	if n.Kind == yaml.AliasNode {
		return fmt.Errorf("%s: YAML aliases are not allowed in settings (line %d)", at, n.Line)
	}
	bad := func(want string) error {
		got := n.Tag
		if n.Kind == yaml.ScalarNode {
			got = fmt.Sprintf("%s %q", strings.TrimPrefix(n.Tag, "!!"), n.Value)
		} else if n.Kind == yaml.MappingNode {
			got = "a mapping"
		} else if n.Kind == yaml.SequenceNode {
			got = "a list"
		}
		return fmt.Errorf("%s: want %s, got %s (line %d)", at, want, got, n.Line)
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return bad("a mapping")
		}
		fields := map[string]reflect.StructField{}
		var names []string
		for j := range t.NumField() {
			f := t.Field(j)
			name, _, _ := strings.Cut(f.Tag.Get(tagKey), ",")
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			fields[name] = f
			names = append(names, name)
		}
		seen := map[string]bool{}
		for k := 0; k+1 < len(n.Content); k += 2 {
			key, val := n.Content[k], n.Content[k+1]
			if key.Kind != yaml.ScalarNode || key.Tag != "!!str" {
				return fmt.Errorf("%s: keys must be strings (line %d)", at, key.Line)
			}
			f, ok := fields[key.Value]
			if !ok {
				return fmt.Errorf("%s.%s: unknown setting (line %d; want one of %s)", at, key.Value, key.Line, strings.Join(names, ", "))
			}
			if seen[key.Value] {
				return fmt.Errorf("%s.%s: defined twice (line %d)", at, key.Value, key.Line)
			}
			seen[key.Value] = true
			if err := checkNode(val, f.Type, tagKey, at+"."+key.Value); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return bad("a list")
		}
		for j, e := range n.Content {
			if err := checkNode(e, t.Elem(), tagKey, fmt.Sprintf("%s[%d]", at, j)); err != nil {
				return err
			}
		}
		return nil
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			return bad("a string")
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			return bad("true or false")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			return bad("an integer")
		}
	default:
		return fmt.Errorf("%s: settings of type %s are not supported", at, t)
	}
	return nil
}

// nodeValue converts a YAML node to plain values json.Marshal accepts:
// mappings with string keys, lists, strings, numbers, booleans, null.
func nodeValue(n *yaml.Node, at string) (any, error) {
	switch n.Kind {
	case yaml.AliasNode:
		return nil, fmt.Errorf("%s: YAML aliases are not allowed in settings (line %d)", at, n.Line)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for k := 0; k+1 < len(n.Content); k += 2 {
			key, val := n.Content[k], n.Content[k+1]
			if key.Kind != yaml.ScalarNode || key.Tag != "!!str" {
				return nil, fmt.Errorf("%s: keys must be strings (line %d)", at, key.Line)
			}
			if _, dup := m[key.Value]; dup {
				return nil, fmt.Errorf("%s.%s: defined twice (line %d)", at, key.Value, key.Line)
			}
			v, err := nodeValue(val, at+"."+key.Value)
			if err != nil {
				return nil, err
			}
			m[key.Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		l := make([]any, len(n.Content))
		for j, e := range n.Content {
			v, err := nodeValue(e, fmt.Sprintf("%s[%d]", at, j))
			if err != nil {
				return nil, err
			}
			l[j] = v
		}
		return l, nil
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("%s: %w (line %d)", at, err, n.Line)
		}
		if f, ok := v.(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
			return nil, fmt.Errorf("%s: %v is not a JSON number (line %d)", at, f, n.Line)
		}
		switch v.(type) {
		case nil, bool, string, int, int64, uint64, float64:
			return v, nil
		}
		return nil, fmt.Errorf("%s: unsupported value %q (line %d)", at, n.Value, n.Line)
	}
	return nil, errors.New(at + ": unsupported YAML node")
}
