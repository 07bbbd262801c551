package config

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/vmgate/vmgate/hypervisor/registry"
)

// Template is what vm_create makes a VM from: a backend, what the backend
// clones (Source, in the backend driver's own terms) and what an agent may
// choose (the name's suffix, memory and CPUs within bounds).
//
//	templates:
//	  - name: small
//	    backend: lab
//	    source: {disk_mb: 64}          # the driver's template source
//	    name_prefix: small-            # VMs are named small-<suffix>
//	    memory_mb: {default: 256, min: 128, max: 512}
//	    cpus: {default: 1, max: 2}
//	    shared: false                  # true: every grant whose vms cover them sees them
//
// Every backend driver reads its own source: the QEMU lab boots the lab
// image with a fresh disk overlay; libvirt clones a domain onto a qcow2
// overlay of its disk; Proxmox clones a template VM (linked where the
// template allows it); VirtualBox makes a linked clone of a VM's snapshot.
type Template struct {
	// Name is what vm_create's template argument names: [a-z0-9][a-z0-9-]{0,31}.
	Name string `yaml:"name"`
	// Backend is the name of the backend (backends[].name) the VMs live on.
	Backend string `yaml:"backend"`
	// Source says what the backend makes the VM from (driver-specific).
	Source yaml.Node `yaml:"source"`
	// NamePrefix starts the name of every VM made from the template; the
	// rest is the call's name argument or a random suffix. Default: the
	// template's name and "-".
	NamePrefix *string `yaml:"name_prefix"`
	// MemoryMB and CPUs: the default an agent gets and the bounds it may
	// ask within. An omitted min or max is the default (not choosable).
	MemoryMB Range `yaml:"memory_mb"`
	CPUs     Range `yaml:"cpus"`
	// Shared makes the VMs made from the template visible to every grant
	// whose vms globs cover them (list_vms, and every tool). By default a
	// created VM exists only for the grant that made it (and operators):
	// "unknown VM" to every other. Only the creator may delete it, either way.
	Shared bool `yaml:"shared"`

	// SourceJSON is Source as JSON, what the driver receives; set by Parse.
	SourceJSON json.RawMessage `yaml:"-"`
}

// Range is a value an agent may choose within [Min, Max], Default when it
// does not. Parse fills omitted fields.
type Range struct {
	Default *int64 `yaml:"default"`
	Min     *int64 `yaml:"min"`
	Max     *int64 `yaml:"max"`
}

// The bounds of template values and names.
const (
	// DefaultTemplateMemoryMB and DefaultTemplateCPUs are a template's
	// defaults when it sets none.
	DefaultTemplateMemoryMB = 256
	DefaultTemplateCPUs     = 1
	minTemplateMemoryMB     = 16
	maxTemplateMemoryMB     = 1 << 20
	maxTemplateCPUs         = 256
	// MaxVMNameLen bounds a created VM's whole name (prefix and suffix): a
	// lab VM's name is at most 32 characters.
	MaxVMNameLen = 32
	// MaxTemplates bounds the templates of one config.
	MaxTemplates = 256
)

var (
	templateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	// namePrefixRE: a prefix of [a-z0-9-], not starting with '-' (every
	// backend accepts these names).
	namePrefixRE = regexp.MustCompile(`^([a-z0-9][a-z0-9-]*)?$`)
)

// Prefix is the template's name prefix (NamePrefix or the default).
func (t *Template) Prefix() string {
	if t.NamePrefix != nil {
		return *t.NamePrefix
	}
	return t.Name + "-"
}

// Value returns r's value for a call that asked for v (0: not asked), or
// why it is refused.
func (r Range) Value(v int64) (int64, error) {
	if v == 0 {
		return *r.Default, nil
	}
	if v < *r.Min || v > *r.Max {
		if *r.Min == *r.Max {
			return 0, fmt.Errorf("%d is not allowed: this template has %d only", v, *r.Min)
		}
		return 0, fmt.Errorf("%d is out of this template's range %d to %d", v, *r.Min, *r.Max)
	}
	return v, nil
}

// Template returns the named template.
func (c *Config) Template(name string) (*Template, bool) {
	for i := range c.Templates {
		if c.Templates[i].Name == name {
			return &c.Templates[i], true
		}
	}
	return nil, false
}

// templateLine is the YAML line of templates[i] or of one of its fields
// (path: keys below the template), 0 when unknown.
func (c *Config) templateLine(i int, path ...string) int {
	n := c.root
	if n == nil {
		return 0
	}
	n = mappingValue(n, "templates")
	if n == nil || n.Kind != yaml.SequenceNode || i >= len(n.Content) {
		return 0
	}
	n = n.Content[i]
	for _, k := range path {
		next := mappingValue(n, k)
		if next == nil {
			break
		}
		n = next
	}
	return n.Line
}

// mappingValue is the value of key in mapping n, nil when there is none.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for k := 0; k+1 < len(n.Content); k += 2 {
		if n.Content[k].Value == key {
			return n.Content[k+1]
		}
	}
	return nil
}

// validateTemplates checks every template and fills its defaults and
// SourceJSON. Errors name the field and its line.
func (c *Config) validateTemplates() error {
	if len(c.Templates) > MaxTemplates {
		return fmt.Errorf("templates: %d templates; at most %d", len(c.Templates), MaxTemplates)
	}
	seen := map[string]int{}
	for i := range c.Templates {
		t := &c.Templates[i]
		at := fmt.Sprintf("templates[%d]", i)
		fail := func(field, format string, args ...any) error {
			p := at
			if field != "" {
				p += "." + field
			}
			var path []string
			if field != "" {
				path = strings.Split(field, ".")
			}
			return fmt.Errorf("%s: %s (line %d)", p, fmt.Sprintf(format, args...), c.templateLine(i, path...))
		}
		if !templateNameRE.MatchString(t.Name) {
			return fail("name", "%q is not a valid template name ([a-z0-9][a-z0-9-]{0,31})", t.Name)
		}
		if j, dup := seen[t.Name]; dup {
			return fail("name", "%q is also templates[%d]", t.Name, j)
		}
		seen[t.Name] = i
		b := c.backend(t.Backend)
		if b == nil {
			return fail("backend", "no backend %q in backends", t.Backend)
		}
		if p := t.Prefix(); !namePrefixRE.MatchString(p) || len(p) > MaxVMNameLen-4 {
			return fail("name_prefix", "%q: want up to %d of [a-z0-9-], not starting with '-' (names are prefix and suffix, at most %d in all)", p, MaxVMNameLen-4, MaxVMNameLen)
		}
		if err := fillRange(&t.MemoryMB, DefaultTemplateMemoryMB, minTemplateMemoryMB, maxTemplateMemoryMB); err != "" {
			return fail("memory_mb", "%s", err)
		}
		if err := fillRange(&t.CPUs, DefaultTemplateCPUs, 1, maxTemplateCPUs); err != "" {
			return fail("cpus", "%s", err)
		}
		if field, err := checkCreateBounds(b, t); err != "" {
			return fail(field, "%s", err)
		}
		raw, err := templateSource(&t.Source, at+".source")
		if err != nil {
			return err
		}
		t.SourceJSON = raw
		if err := checkTemplateSource(b, raw); err != nil {
			return fail("source", "%v", err)
		}
	}
	return nil
}

// backend returns the backend named name, nil when there is none.
func (c *Config) backend(name string) *Backend {
	for i := range c.Backends {
		if c.Backends[i].Name == name {
			return &c.Backends[i]
		}
	}
	return nil
}

// fillRange fills r's omitted fields (default def, min and max the
// default) and checks lo ≤ min ≤ default ≤ max ≤ hi; it returns why not.
func fillRange(r *Range, def, lo, hi int64) string {
	if r.Default == nil {
		r.Default = &def
	}
	if r.Min == nil {
		r.Min = r.Default
	}
	if r.Max == nil {
		r.Max = r.Default
	}
	d, mn, mx := *r.Default, *r.Min, *r.Max
	switch {
	case mn < lo || mx > hi:
		return fmt.Sprintf("min %d and max %d must lie within %d to %d", mn, mx, lo, hi)
	case mn > d || d > mx:
		return fmt.Sprintf("want min %d ≤ default %d ≤ max %d", mn, d, mx)
	}
	return ""
}

// templateSource converts a template's source to JSON: a mapping, or
// nothing ({}).
func templateSource(n *yaml.Node, at string) (json.RawMessage, error) {
	if n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
		return json.RawMessage(`{}`), nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: want a mapping (line %d)", at, n.Line)
	}
	v, err := nodeValue(n, at)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%s: not expressible as JSON: %w", at, err)
	}
	return raw, nil
}

// checkTemplateSource checks a template's source for the backend's
// driver at load; the driver checks it again when it makes a VM.
func checkTemplateSource(b *Backend, raw json.RawMessage) error {
	if c, ok := b.Decoded.(registry.TemplateChecker); ok {
		if err := c.CheckTemplate(raw); err != nil {
			return fmt.Errorf("backend %q: %w", b.Name, err)
		}
	}
	return nil
}

// checkCreateBounds checks t's ranges against what b's driver can make
// (registry.CreateBounder); it returns the field and why not.
func checkCreateBounds(b *Backend, t *Template) (field, why string) {
	c, ok := b.Decoded.(registry.CreateBounder)
	if !ok {
		return "", ""
	}
	k := c.CreateBounds()
	because := ""
	if k.Why != "" {
		because = " (" + k.Why + ")"
	}
	switch {
	case k.MinMemoryMB > 0 && *t.MemoryMB.Min < k.MinMemoryMB:
		return "memory_mb", fmt.Sprintf("min %d MiB is below backend %q's minimum of %d MiB%s", *t.MemoryMB.Min, b.Name, k.MinMemoryMB, because)
	case k.MaxMemoryMB > 0 && *t.MemoryMB.Max > k.MaxMemoryMB:
		return "memory_mb", fmt.Sprintf("max %d MiB is above backend %q's maximum of %d MiB", *t.MemoryMB.Max, b.Name, k.MaxMemoryMB)
	case k.MaxCPUs > 0 && *t.CPUs.Max > k.MaxCPUs:
		return "cpus", fmt.Sprintf("max %d is above backend %q's maximum of %d", *t.CPUs.Max, b.Name, k.MaxCPUs)
	}
	return "", ""
}

// VMName is the name a VM made from t gets for a call that asked for
// suffix (random when empty), or why the suffix is refused.
func (t *Template) VMName(suffix, random string) (string, error) {
	s := suffix
	if s == "" {
		s = random
	}
	name := t.Prefix() + s
	switch {
	case !suffixRE.MatchString(s):
		return "", fmt.Errorf("name %q: want [a-z0-9][a-z0-9-]* (lowercase letters, digits and '-')", s)
	case len(name) > MaxVMNameLen:
		return "", fmt.Errorf("name %q: with this template's prefix %q the VM's name would be %d characters; at most %s", s, t.Prefix(), len(name), strconv.Itoa(MaxVMNameLen))
	}
	return name, nil
}

var suffixRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
