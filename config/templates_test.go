package config

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/policy"
)

const templatesBackends = grantsDoc + `backends:
  - name: lab
    driver: qemu
    settings: {lab: true}
  - name: virt
    driver: libvirt
  - name: fixed
    driver: qemu
    settings: {vms: [{name: a, qmp: q, qga: g}]}
`

func TestTemplates(t *testing.T) {
	doc := templatesBackends + `templates:
  - name: small
    backend: lab
  - name: big
    backend: lab
    source: {disk_mb: 128, cmdline: {CGROUP2: "0"}}
    name_prefix: ""
    memory_mb: {default: 512, min: 256, max: 2048}
    cpus: {max: 4}
  - name: clone
    backend: virt
    source:
      domain: base
    name_prefix: agent-
    shared: true
`
	c, err := Parse([]byte(doc), t.TempDir(), "")
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	type want struct {
		prefix             string
		mem, memLo, memHi  int64
		cpus, cpuLo, cpuHi int64
		source             map[string]any
	}
	for name, w := range map[string]want{
		"small": {"small-", 256, 256, 256, 1, 1, 1, map[string]any{}},
		"big":   {"", 512, 256, 2048, 1, 1, 4, map[string]any{"disk_mb": float64(128), "cmdline": map[string]any{"CGROUP2": "0"}}},
		"clone": {"agent-", 256, 256, 256, 1, 1, 1, map[string]any{"domain": "base"}},
	} {
		tp, ok := c.Template(name)
		if !ok {
			t.Fatalf("Template(%q) missing", name)
		}
		got := want{tp.Prefix(), *tp.MemoryMB.Default, *tp.MemoryMB.Min, *tp.MemoryMB.Max, *tp.CPUs.Default, *tp.CPUs.Min, *tp.CPUs.Max, nil}
		if err := json.Unmarshal(tp.SourceJSON, &got.source); err != nil {
			t.Fatalf("Template(%q).SourceJSON = %s: %v", name, tp.SourceJSON, err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("Template(%q) = %+v; want %+v", name, got, w)
		}
	}
	for name, shared := range map[string]bool{"small": false, "big": false, "clone": true} {
		if tp, _ := c.Template(name); tp.Shared != shared {
			t.Errorf("Template(%q).Shared = %v; want %v", name, tp.Shared, shared)
		}
	}
	if _, ok := c.Template("nope"); ok {
		t.Errorf("Template(nope) found; want none")
	}
}

func TestTemplatesBad(t *testing.T) {
	tmpl := func(body string) string {
		return templatesBackends + "templates:\n  - name: ok\n    backend: lab\n" + body
	}
	tests := []struct{ name, doc, want string }{
		{"bad name", tmpl("  - name: Big\n    backend: lab\n"), `templates[1].name: "Big" is not a valid template name ([a-z0-9][a-z0-9-]{0,31}) (line 15)`},
		{"name twice", tmpl("  - name: ok\n    backend: lab\n"), `templates[1].name: "ok" is also templates[0] (line 15)`},
		{"unknown backend", tmpl("  - name: b\n    backend: pve\n"), `templates[1].backend: no backend "pve" in backends (line 16)`},
		{"qemu without lab", tmpl("  - name: b\n    backend: fixed\n"), `templates[1].source: backend "fixed": makes VMs in its lab directory: give it lab: true (line 15)`},
		{"prefix with capitals", tmpl("  - name: b\n    backend: lab\n    name_prefix: Agent-\n"), `templates[1].name_prefix: "Agent-": want up to 28 of [a-z0-9-]`},
		{"prefix starting with dash", tmpl("  - name: b\n    backend: lab\n    name_prefix: -x\n"), `templates[1].name_prefix: "-x"`},
		{"prefix too long", tmpl("  - name: b\n    backend: lab\n    name_prefix: " + strings.Repeat("a", 29) + "\n"), `templates[1].name_prefix:`},
		{"memory below range", tmpl("  - name: b\n    backend: lab\n    memory_mb: {default: 8}\n"), `templates[1].memory_mb: min 8 and max 8 must lie within 16 to 1048576 (line 17)`},
		// issue 32, item 14: below what the backend can boot, every
		// vm_create would fail after reserving its quota.
		{"memory below the lab's minimum", tmpl("  - name: b\n    backend: lab\n    memory_mb: {default: 256, min: 64, max: 512}\n"),
			`templates[1].memory_mb: min 64 MiB is below backend "lab"'s minimum of 96 MiB (the lab image needs`},
		{"memory above the lab's maximum", tmpl("  - name: b\n    backend: lab\n    memory_mb: {max: 131072}\n"),
			`templates[1].memory_mb: max 131072 MiB is above backend "lab"'s maximum of 65536 MiB`},
		{"cpus above the lab's maximum", tmpl("  - name: b\n    backend: lab\n    cpus: {max: 65}\n"),
			`templates[1].cpus: max 65 is above backend "lab"'s maximum of 64`},
		{"default outside range", tmpl("  - name: b\n    backend: lab\n    memory_mb: {default: 1024, max: 512}\n"), `templates[1].memory_mb: want min 1024 ≤ default 1024 ≤ max 512 (line 17)`},
		{"cpus zero", tmpl("  - name: b\n    backend: lab\n    cpus: {default: 0}\n"), `templates[1].cpus: min 0 and max 0 must lie within 1 to 256`},
		{"cpus as text", tmpl("  - name: b\n    backend: lab\n    cpus: {max: many}\n"), `many`},
		{"unknown field", tmpl("  - name: b\n    backend: lab\n    memory: 5\n"), `field memory not found`},
		{"shared not a boolean", tmpl("  - name: b\n    backend: lab\n    shared: everyone\n"), `everyone`},
		{"source a list", tmpl("  - name: b\n    backend: lab\n    source: [a]\n"), `templates[1].source: want a mapping (line 17)`},
		{"source alias", tmpl("  - name: b\n    backend: lab\n    source: {a: &x 1, b: *x}\n"), `templates[1].source.b: YAML aliases are not allowed`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc), t.TempDir(), "")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%s) = %v; want an error containing %q", tt.name, err, tt.want)
			}
		})
	}
}

func TestDefaultTemplate(t *testing.T) {
	c := Default("/state")
	tp, ok := c.Template("lab")
	if !ok || tp.Backend != "lab" || *tp.MemoryMB.Default != 256 || *tp.MemoryMB.Max != 1024 || *tp.CPUs.Max != 2 {
		t.Fatalf("Default().Template(lab) = %+v, %v; want the lab template (256 MiB up to 1024, up to 2 CPUs)", tp, ok)
	}
	if string(tp.SourceJSON) != "{}" {
		t.Errorf("default template source = %s; want {}", tp.SourceJSON)
	}
}

func TestTemplateChoices(t *testing.T) {
	c := Default("/state")
	tp, _ := c.Template("lab")
	for _, tc := range []struct {
		ask, want int64
		err       string
	}{{0, 256, ""}, {128, 128, ""}, {1024, 1024, ""}, {127, 0, "127 is out of this template's range 128 to 1024"}, {4096, 0, "out of"}} {
		got, err := tp.MemoryMB.Value(tc.ask)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("MemoryMB.Value(%d) = %d, %v; want %d, %q", tc.ask, got, err, tc.want, tc.err)
		}
	}
	small := &Template{Name: "s", CPUs: Range{Default: ptr[int64](1), Min: ptr[int64](1), Max: ptr[int64](1)}}
	if _, err := small.CPUs.Value(2); err == nil || !strings.Contains(err.Error(), "this template has 1 only") {
		t.Errorf("CPUs.Value(2) on a fixed template = %v; want a refusal naming the only value", err)
	}
	for _, tc := range []struct{ suffix, random, want, err string }{
		{"", "x7k2m9", "lab-x7k2m9", ""},
		{"web-1", "r", "lab-web-1", ""},
		{"Web", "r", "", "want [a-z0-9][a-z0-9-]*"},
		{"-x", "r", "", "want"},
		{"../x", "r", "", "want"},
		{"a b", "r", "", "want"},
		{strings.Repeat("a", 29), "r", "", "would be 33 characters; at most 32"},
		{strings.Repeat("a", 28), "r", "lab-" + strings.Repeat("a", 28), ""},
	} {
		got, err := tp.VMName(tc.suffix, tc.random)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("VMName(%q, %q) = %q, %v; want %q, %q", tc.suffix, tc.random, got, err, tc.want, tc.err)
		}
	}
}

// TestDefaultPolicyVMs: the built-in policy lets a grant create VMs within
// quotas (2 alive, 2048 MiB, 8 on the server) and a lease of at most 2 h,
// and delete them.
func TestDefaultPolicyVMs(t *testing.T) {
	e, err := policy.Parse("default_policy.json", DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	d := e.Decide(policy.Call{Grant: "local", Tool: "vm_create", Args: map[string]any{"template": "lab", "memory_mb": int64(256)}})
	if d.Verdict != policy.Allow {
		t.Fatalf("vm_create: %v (%s); want allow", d.Verdict, d.Reason)
	}
	got := map[string][2]int64{}
	for _, q := range d.Quotas {
		got[q.Name] = [2]int64{q.Max, q.Weight}
	}
	want := map[string][2]int64{"vms_per_grant": {2, 1}, "vm_memory_per_grant": {2048, 256}, "vms_on_server": {8, 1}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("vm_create quotas = %v; want %v", got, want)
	}
	if d.Lease == nil || d.Lease.Max.Hours() != 2 || d.Lease.Default.Minutes() != 30 {
		t.Errorf("vm_create lease = %+v; want 30m by default, 2h at most", d.Lease)
	}
	if d := e.Decide(policy.Call{Grant: "local", Tool: "vm_delete", VM: "lab/x"}); d.Verdict != policy.Allow {
		t.Errorf("vm_delete: %v; want allow", d.Verdict)
	}
}
