// Package registry is where hypervisor drivers describe themselves, the way
// Caddy's modules do: each driver package registers, from its init
// function, its name, its settings type (which validates itself) and its
// constructor. The config loader, the plugin host and the binary's plugin
// command find drivers here by name and import none of them; the binary
// links the built-in drivers in with blank imports in one place
// (cmd/vmgate/drivers.go).
//
// A driver's settings are one Go struct with json tags, read with the same
// rules in both places they come from: the "settings" of a backend in
// vmgate.yaml (package config checks the YAML against the struct's shape,
// with line numbers, then decodes it with Decode) and the JSON the plugin
// host sends a plugin through Configure (New). Decode is strict: unknown
// fields, duplicate keys, wrong types and trailing data are errors, and
// durations are Duration, the one way driver settings spell a duration.
// Validate then checks the values, without side effects; its errors name
// the setting (FieldError), so the config loader can point at its line.
//
// Register is meant for init functions and panics on misuse; everything
// else is safe for concurrent use once the program's init functions ran.
package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/strictjson"
)

// Settings are one driver's settings: a pointer to a struct whose fields
// carry json tags.
type Settings interface {
	// Validate checks every value, without side effects (no file is read,
	// nothing is dialled). An error about one setting is a *FieldError.
	Validate() error
}

// Resolver is an optional capability of Settings read from vmgate.yaml:
// Resolve completes them before they are validated, making host paths
// relative to the config file absolute and filling in what depends on the
// server's state directory. The plugin gets the settings resolved.
type Resolver interface {
	Resolve(env Env)
}

// TemplateChecker is an optional capability of Settings: CheckTemplate
// says, when the config is loaded and without side effects, why a backend
// with these settings cannot make VMs from a template whose source (the
// template's source mapping as JSON) is source. The driver checks the
// source again when it makes a VM.
type TemplateChecker interface {
	CheckTemplate(source json.RawMessage) error
}

// CreateBounder is an optional capability of Settings: CreateBounds are
// the memory and CPU counts a backend with these settings can make VMs
// with. The config loader refuses a template whose range leaves them, so
// that no vm_create fails on them after its quota was reserved.
type CreateBounder interface {
	CreateBounds() hypervisor.CreateBounds
}

// Env is what Resolve may use.
type Env struct {
	// Abs makes a host path absolute against the config file's directory;
	// an empty path stays empty.
	Abs func(path string) string
	// StateDir is the server's state directory.
	StateDir string
}

// Driver is one registered driver.
type Driver struct {
	name        string
	newSettings func() Settings
	build       func(context.Context, Settings) (hypervisor.Driver, error)
}

// Name is the driver's name, as backends in vmgate.yaml spell it.
func (d Driver) Name() string { return d.name }

// Settings returns new zero settings of the driver's type.
func (d Driver) Settings() Settings { return d.newSettings() }

// Decode decodes config (JSON) strictly into new settings: unknown fields,
// trailing data and values of the wrong type are errors wrapping
// hypervisor.ErrInvalidArgument. An empty config gives zero settings. The
// settings are not validated: New and the config loader do that.
func (d Driver) Decode(config []byte) (Settings, error) {
	s := d.newSettings()
	if err := decodeStrict(config, s); err != nil {
		return nil, err
	}
	return s, nil
}

// New decodes config, validates it and builds the driver. Errors wrap
// hypervisor.ErrInvalidArgument when the settings are refused, and start
// with the driver's name ("qemu: config: ...").
func (d Driver) New(ctx context.Context, config []byte) (hypervisor.Driver, error) {
	s, err := d.Decode(config)
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", d.name, err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("%s: config: %w", d.name, Invalid(err))
	}
	drv, err := d.build(ctx, s)
	if err != nil {
		return nil, err
	}
	if v := reflect.ValueOf(drv); drv == nil || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, fmt.Errorf("%s: constructor returned no driver", d.name)
	}
	return drv, nil
}

var (
	mu      sync.RWMutex // mu guards drivers
	drivers = map[string]Driver{}
	// nameRE is the rule for driver names (the plugin host's, too).
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
)

// ValidName reports whether name is a well-formed driver name: 1-32 of
// [a-z0-9_-], beginning with a letter or digit.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Register adds a driver: its name, its settings type (*S, found from
// build's signature) and build, which makes the driver (any type D
// implementing hypervisor.Driver, typically the package's *Driver) from
// settings that passed Validate, and must check whatever Validate cannot
// (files, programs) before any other side effect. It panics on a bad or
// taken name: call it from an init function.
//
//	func init() {
//		registry.Register("qemu", func(_ context.Context, s *Settings) (*Driver, error) { return New(s.config()) })
//	}
func Register[S any, P interface {
	*S
	Settings
}, D hypervisor.Driver](name string, build func(context.Context, P) (D, error)) {
	if !ValidName(name) {
		panic(fmt.Sprintf("registry: bad driver name %q", name))
	}
	if build == nil {
		panic("registry: driver " + name + " has no constructor")
	}
	d := Driver{
		name:        name,
		newSettings: func() Settings { return P(new(S)) },
		build: func(ctx context.Context, s Settings) (hypervisor.Driver, error) {
			p, ok := s.(P)
			if !ok {
				return nil, fmt.Errorf("%s: settings of type %T, want %T", name, s, p)
			}
			drv, err := build(ctx, p)
			if err != nil {
				return nil, err // a nil interface, never a typed nil inside one
			}
			return drv, nil
		},
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := drivers[name]; dup {
		panic("registry: driver " + name + " registered twice")
	}
	drivers[name] = d
}

// Lookup returns the driver registered as name.
func Lookup(name string) (Driver, bool) {
	mu.RLock()
	defer mu.RUnlock()
	d, ok := drivers[name]
	return d, ok
}

// New builds the driver registered as name from its JSON settings (see
// Driver.New). An unknown name wraps hypervisor.ErrInvalidArgument.
func New(ctx context.Context, name string, config []byte) (hypervisor.Driver, error) {
	d, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("registry: %w: no driver %q is registered", hypervisor.ErrInvalidArgument, name)
	}
	return d.New(ctx, config)
}

// Names lists the registered drivers, sorted.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	names := make([]string, 0, len(drivers))
	for n := range drivers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// decodeStrict decodes config into v: one JSON object, read first by the
// one strict lexer (internal/strictjson: no key twice or in two cases, at
// any depth; valid UTF-8; bounded nesting), then decoded with unknown
// fields and trailing data refused. Errors wrap
// hypervisor.ErrInvalidArgument.
func decodeStrict(config []byte, v any) error {
	trimmed := bytes.TrimSpace(config)
	if len(trimmed) == 0 {
		return nil
	}
	if trimmed[0] != '{' {
		return fmt.Errorf("%w: want a JSON object", hypervisor.ErrInvalidArgument)
	}
	if err := checkStrict(trimmed); err != nil {
		return fmt.Errorf("%w: %w", hypervisor.ErrInvalidArgument, err)
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", hypervisor.ErrInvalidArgument, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: trailing data after the settings object", hypervisor.ErrInvalidArgument)
	}
	return nil
}

// strictError is the lexer's refusal err, inside the object or array at
// path of data, as decodeStrict reports it.
func strictError(data []byte, path string, err error) error {
	var se *strictjson.SyntaxError
	if !errors.As(err, &se) {
		return err
	}
	if strings.HasPrefix(se.Msg, "unexpected end of input") {
		return io.ErrUnexpectedEOF
	}
	if strings.HasPrefix(se.Msg, "duplicate key") {
		// The key starts at the refusal's offset: name it by its path.
		if k, kerr := json.NewDecoder(bytes.NewReader(data[se.Off:])).Token(); kerr == nil {
			if key, ok := k.(string); ok {
				if path != "" {
					key = path + "." + key
				}
				return fmt.Errorf("%s: defined twice", key)
			}
		}
	}
	if path == "" {
		return errors.New(se.Msg)
	}
	return fmt.Errorf("%s: %s", path, se.Msg)
}

// checkStrict reads the one JSON object data starts with through the
// strict lexer (what follows it is decodeStrict's to refuse), and names
// where a refusal happened: a key given twice by its path
// ("items[0].id: defined twice"), anything else by the path of the object
// or array it is in; an object cut short is io.ErrUnexpectedEOF.
func checkStrict(data []byte) error {
	var l strictjson.Lexer
	l.Reset(data)
	type frame struct {
		path  string
		array bool
		n     int // the array's next index
	}
	var stack []frame
	key := ""
	for {
		t, err := l.Next()
		if err != nil {
			path := ""
			if len(stack) > 0 {
				path = stack[len(stack)-1].path
			}
			return strictError(data, path, err)
		}
		switch t.Kind {
		case strictjson.Key:
			key = t.Text
			continue
		case strictjson.EndObject, strictjson.EndArray:
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return nil
			}
			continue
		}
		at := ""
		if len(stack) > 0 {
			top := &stack[len(stack)-1]
			switch {
			case top.array:
				at = fmt.Sprintf("%s[%d]", top.path, top.n)
				top.n++
			case top.path == "":
				at = key
			default:
				at = top.path + "." + key
			}
		}
		if t.Kind == strictjson.BeginObject || t.Kind == strictjson.BeginArray {
			stack = append(stack, frame{path: at, array: t.Kind == strictjson.BeginArray})
		}
	}
}
