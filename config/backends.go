package config

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/vmgate/vmgate/hypervisor/registry"
)

// DriverQEMU is the driver of the default backend ("lab").
const DriverQEMU = "qemu"

// BackendNameRule says what ValidBackendName accepts, for messages.
const BackendNameRule = "[a-z0-9][a-z0-9-], at most 32"

// ValidBackendName reports whether s is a backend name: a lowercase letter
// or digit, then at most 31 of them or '-'. A backend's name is the prefix
// of its VM ids ("lab/vm1"): the config, the server and the gate's VM-id
// rule all ask here, so there is one rule for it.
func ValidBackendName(s string) bool {
	if s == "" || len(s) > 32 || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Backend is one hypervisor backend: a driver and its settings.
type Backend struct {
	// Name is the VM-id prefix of the backend's VMs: [a-z0-9][a-z0-9-]{0,31}.
	Name string `yaml:"name"`
	// Driver is a built-in driver (one registered with hypervisor/registry,
	// see IsBuiltin) or NAME of an external plugin vmgate-plugin-NAME in
	// plugin_dir.
	Driver string `yaml:"driver"`
	// InProcess runs a built-in driver inside the server rather than as a
	// plugin process (debugging). External drivers always run as plugins.
	InProcess bool `yaml:"in_process"`
	// Settings are the raw driver settings, checked strictly against a
	// built-in driver's settings type at load time; an external driver
	// checks its own when launched.
	Settings yaml.Node `yaml:"settings"`

	// Decoded holds the settings of a built-in driver as its registry
	// entry decoded them (nil for an external driver); set by Parse and
	// Default.
	Decoded registry.Settings `yaml:"-"`
	// DriverConfig is the JSON configuration the driver gets through the
	// plugin host (pluginhost.Spec.Config); set by Parse and Default.
	DriverConfig json.RawMessage `yaml:"-"`

	// external holds the settings of an external driver as JSON.
	external json.RawMessage
}

// IsBuiltin reports whether driver is compiled into vmgate (registered
// with hypervisor/registry).
func IsBuiltin(driver string) bool {
	_, ok := registry.Lookup(driver)
	return ok
}

// builtinNames lists the built-in drivers for messages.
func builtinNames() string {
	if names := registry.Names(); len(names) > 0 {
		return strings.Join(names, ", ")
	}
	return "none"
}

// decodeSettings checks b.Settings against b.Driver's settings type (every
// key known, every value of the right type, with the YAML line of the
// first that is not) and keeps the decoded value. i is b's index, for the
// error paths.
func (b *Backend) decodeSettings(i int) error {
	at := fmt.Sprintf("backends[%d].settings", i)
	node := &b.Settings
	empty := node.Kind == 0 || (node.Kind == yaml.ScalarNode && node.Tag == "!!null")
	if !empty && node.Kind != yaml.MappingNode {
		return fmt.Errorf("%s: want a mapping (line %d)", at, node.Line)
	}
	drv, builtin := registry.Lookup(b.Driver)
	if !builtin && !registry.ValidName(b.Driver) {
		return fmt.Errorf("backends[%d].driver: %q is neither a built-in driver (%s) nor a plugin name ([a-z0-9][a-z0-9_-]{0,31})",
			i, b.Driver, builtinNames())
	}
	raw := []byte(`{}`)
	if !empty {
		if builtin {
			if err := checkNode(node, reflect.TypeOf(drv.Settings()).Elem(), at); err != nil {
				return err
			}
		}
		v, err := nodeValue(node, at)
		if err != nil {
			return err
		}
		if raw, err = json.Marshal(v); err != nil {
			return fmt.Errorf("%s: not expressible as JSON: %w", at, err)
		}
	}
	if !builtin {
		b.external = raw
		return nil
	}
	s, err := drv.Decode(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", at, err)
	}
	b.Decoded = s
	return nil
}

// resolve completes a built-in driver's settings: host paths made absolute
// against the config file's directory, the state directory filled in.
func (b *Backend) resolve(abs func(string) string, stateDir string) {
	if r, ok := b.Decoded.(registry.Resolver); ok {
		r.Resolve(registry.Env{Abs: abs, StateDir: stateDir})
	}
}

// validateBackends checks names, drivers and the values of the settings.
func (c *Config) validateBackends() error {
	seen := map[string]bool{}
	for i, b := range c.Backends {
		if !ValidBackendName(b.Name) {
			return fmt.Errorf("backends[%d].name: %q (want %s: it prefixes the VM ids)", i, b.Name, BackendNameRule)
		}
		if seen[b.Name] {
			return fmt.Errorf("backends[%d].name: %q defined twice", i, b.Name)
		}
		seen[b.Name] = true
		at := fmt.Sprintf("backends[%d].settings", i)
		if IsBuiltin(b.Driver) {
			if b.Decoded == nil {
				return fmt.Errorf("%s: not decoded (build a Config with Parse)", at)
			}
			if err := b.Decoded.Validate(); err != nil {
				return settingsError(&b.Settings, at, err)
			}
			continue
		}
		switch {
		case !registry.ValidName(b.Driver) || b.external == nil:
			return fmt.Errorf("backends[%d].driver: unknown driver %q", i, b.Driver)
		case c.PluginDir == "":
			return fmt.Errorf("backends[%d].driver: unknown driver %q: not built in (%s) and plugin_dir is not set",
				i, b.Driver, builtinNames())
		case b.InProcess:
			return fmt.Errorf("backends[%d].in_process: external driver %q always runs as a plugin", i, b.Driver)
		}
	}
	return nil
}

// settingsError names the setting a Validate error is about by its path
// under at and, when the settings give it, its YAML line.
func settingsError(settings *yaml.Node, at string, err error) error {
	var fe *registry.FieldError
	if !errors.As(err, &fe) {
		return fmt.Errorf("%s: %w", at, err)
	}
	path := at
	switch {
	case fe.Field == "":
	case strings.HasPrefix(fe.Field, "["):
		path += fe.Field
	default:
		path += "." + fe.Field
	}
	if line := lineOf(settings, fe.Field); line > 0 {
		return fmt.Errorf("%s: %w (line %d)", path, fe.Err, line)
	}
	return fmt.Errorf("%s: %w", path, fe.Err)
}

// fieldStep is one step of a field path: a mapping key, or a list index
// when key is empty.
type fieldStep struct {
	key   string
	index int
}

// splitField splits "vms[1].name" into vms, [1], name.
func splitField(field string) []fieldStep {
	var steps []fieldStep
	for _, part := range strings.Split(field, ".") {
		key, rest, _ := strings.Cut(part, "[")
		if key != "" {
			steps = append(steps, fieldStep{key: key})
		}
		for rest != "" {
			num, after, _ := strings.Cut(rest, "]")
			n, err := strconv.Atoi(num)
			if err != nil {
				return steps
			}
			steps = append(steps, fieldStep{index: n})
			_, rest, _ = strings.Cut(after, "[")
		}
	}
	return steps
}

// lineOf is the YAML line of the setting at field in n (its value's line),
// or of the deepest part of the path the settings give (a missing key is
// reported at its mapping); 0 when n is empty.
func lineOf(n *yaml.Node, field string) int {
	line := n.Line
	for _, st := range splitField(field) {
		var next *yaml.Node
		switch {
		case st.key != "" && n.Kind == yaml.MappingNode:
			for k := 0; k+1 < len(n.Content); k += 2 {
				if n.Content[k].Value == st.key {
					next = n.Content[k+1]
				}
			}
		case st.key == "" && n.Kind == yaml.SequenceNode && st.index < len(n.Content):
			next = n.Content[st.index]
		}
		if next == nil {
			break
		}
		n, line = next, next.Line
	}
	return line
}

// buildDriverConfigs sets every backend's DriverConfig. It runs after fill
// (paths resolved, state_dir known) and Validate.
func (c *Config) buildDriverConfigs() error {
	for i := range c.Backends {
		b := &c.Backends[i]
		switch {
		case b.Decoded != nil:
			raw, err := json.Marshal(b.Decoded)
			if err != nil {
				return fmt.Errorf("backends[%d].settings: %w", i, err)
			}
			b.DriverConfig = raw
		case b.external != nil:
			b.DriverConfig = b.external
		default:
			return fmt.Errorf("backends[%d]: driver %q has no decoded settings", i, b.Driver)
		}
	}
	return nil
}

// textUnmarshaler is the type of settings read from a string by their own
// parser (registry.Duration).
var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// checkNode checks a YAML node against type t, whose struct fields are
// named by their json tags: unknown and duplicate keys, and values of the
// wrong kind, are errors naming the path and line. A value of a type that
// parses itself from text (a duration) is parsed here, for its line.
func checkNode(n *yaml.Node, t reflect.Type, at string) error {
	if n.Kind == yaml.AliasNode {
		return fmt.Errorf("%s: YAML aliases are not allowed in settings (line %d)", at, n.Line)
	}
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			return wrongNode(n, at, "a string")
		}
		if err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
			return fmt.Errorf("%s: %w (line %d)", at, err, n.Line)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		return checkMapping(n, t, at)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return wrongNode(n, at, "a list")
		}
		for j, e := range n.Content {
			if err := checkNode(e, t.Elem(), fmt.Sprintf("%s[%d]", at, j)); err != nil {
				return err
			}
		}
		return nil
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			return wrongNode(n, at, "a string")
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			return wrongNode(n, at, "true or false")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			return wrongNode(n, at, "an integer")
		}
	default:
		return fmt.Errorf("%s: settings of type %s are not supported", at, t)
	}
	return nil
}

// wrongNode says that n, at at, is not what was wanted.
func wrongNode(n *yaml.Node, at, want string) error {
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

// checkMapping checks a mapping against struct type t: every key one of
// t's fields, once, with a value checkNode accepts.
func checkMapping(n *yaml.Node, t reflect.Type, at string) error {
	if n.Kind != yaml.MappingNode {
		return wrongNode(n, at, "a mapping")
	}
	fields := map[string]reflect.StructField{}
	var names []string
	for j := range t.NumField() {
		f := t.Field(j)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
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
		if err := checkNode(val, f.Type, at+"."+key.Value); err != nil {
			return err
		}
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
