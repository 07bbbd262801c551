package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/plugins/qemu"
	"github.com/vmgate/vmgate/policy"
)

const good = `
state_dir: state
store: {type: bolt}
audit: {fsync: interval}
grants:
  - name: alice
    token_sha256: 2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b
    policy: alice.json
    vms: ["lab/*"]
backends:
  - name: lab
    driver: qemu
    settings:
      lab: true
      vms: [{name: extra, qmp: q.sock, qga: g.sock}]
http: {addr: "127.0.0.1:8707", allowed_origins: ["http://localhost:6274"]}
limits: {max_output_bytes: 65536, max_timeout_s: 120}
`

func TestParseGood(t *testing.T) {
	dir := t.TempDir()
	c, err := Parse([]byte(good), dir, "")
	if err != nil {
		t.Fatalf("Parse(good) = %v", err)
	}
	if c.StateDir != filepath.Join(dir, "state") || c.Store.Path != filepath.Join(dir, "state", "store.db") {
		t.Errorf("state_dir/store.path = %q/%q; want them under %s", c.StateDir, c.Store.Path, dir)
	}
	if c.Audit.Path != filepath.Join(dir, "state", "audit.log") || c.Audit.Fsync != FsyncInterval {
		t.Errorf("audit = %+v; want path under state and fsync interval", c.Audit)
	}
	if q, ok := c.Backends[0].Decoded.(*qemu.Settings); !ok || !q.Lab || q.LabDir != filepath.Join(dir, "state", "lab") ||
		len(q.VMs) != 1 || q.VMs[0].QMP != filepath.Join(dir, "q.sock") {
		t.Errorf("backends[0].Decoded = %+v; want qemu settings: the lab under the state dir and one VM with a resolved socket", c.Backends[0].Decoded)
	}
	if c.Grants[0].Policy != filepath.Join(dir, "alice.json") {
		t.Errorf("grants[0].policy = %q; want it resolved against the config dir", c.Grants[0].Policy)
	}
}

func TestParseBad(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"unknown key", "state_dir: s\ngrants: [{name: a, policy: builtin:default}]\nbogus: 1\n", "bogus"},
		{"duplicate key", "state_dir: s\nstate_dir: t\ngrants: [{name: a, policy: builtin:default}]\n", "already defined"},
		{"wrong type", "state_dir: s\ngrants: [{name: a, policy: builtin:default}]\nlimits: {max_timeout_s: lots}\n", "lots"},
		{"no grants", "state_dir: s\n", "at least one grant"},
		{"grant without policy", "state_dir: s\ngrants: [{name: a}]\n", "policy: required"},
		{"bad token hash", "state_dir: s\ngrants: [{name: a, policy: p, token_sha256: secret}]\n", "64 lowercase hex"},
		{"duplicate grant", "state_dir: s\ngrants: [{name: a, policy: p}, {name: a, policy: p}]\n", "defined twice"},
		{"bad glob", "state_dir: s\ngrants: [{name: a, policy: p, vms: ['lab/[']}]\n", "bad glob"},
		{"unknown store", "state_dir: s\nstore: {type: sqlite}\ngrants: [{name: a, policy: p}]\n", "unknown store"},
		{"redis without url", "state_dir: s\nstore: {type: redis}\ngrants: [{name: a, policy: p}]\n", "store.url"},
		{"bad fsync", "state_dir: s\naudit: {fsync: never}\ngrants: [{name: a, policy: p}]\n", "audit.fsync"},
		{"unknown driver", "state_dir: s\ngrants: [{name: a, policy: p}]\nbackends: [{name: x, driver: vbox}]\n", "unknown driver"},
		{"unknown setting", "state_dir: s\ngrants: [{name: a, policy: p}]\nbackends: [{name: x, driver: qemu, settings: {lab: true, labs: true}}]\n", "labs"},
		{"bad backend name", "state_dir: s\ngrants: [{name: a, policy: p}]\nbackends: [{name: 'a/b', driver: qemu, settings: {lab: true}}]\n", "backends[0].name"},
		{"vm without sockets", "state_dir: s\ngrants: [{name: a, policy: p}]\nbackends: [{name: x, driver: qemu, settings: {vms: [{name: v}]}}]\n", "backends[0].settings.vms[0].qmp: required (the VM's QMP socket) (line 3)"},
		{"tls half", "state_dir: s\ngrants: [{name: a, policy: p}]\nhttp: {tls_cert: c}\n", "go together"},
		{"negative limit", "state_dir: s\ngrants: [{name: a, policy: p}]\nlimits: {max_output_bytes: -1}\n", "out of range"},
		{"two documents", "state_dir: s\ngrants: [{name: a, policy: p}]\n---\nstate_dir: t\n", "more than one"},
		{"empty", "", "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc), t.TempDir(), "")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) = %v; want an error containing %q", tt.doc, err, tt.want)
			}
		})
	}
}

func TestDefault(t *testing.T) {
	dir := t.TempDir()
	c := Default(dir)
	if err := c.Validate(); err != nil {
		t.Fatalf("Default(%s).Validate() = %v", dir, err)
	}
	if c.Store.Type != StoreBolt || c.Store.Path != filepath.Join(dir, "store.db") || c.Audit.Path != filepath.Join(dir, "audit.log") {
		t.Errorf("Default store/audit = %+v/%+v; want bolt and audit under %s", c.Store, c.Audit, dir)
	}
	if q, ok := c.Backends[0].Decoded.(*qemu.Settings); len(c.Backends) != 1 || c.Backends[0].Name != "lab" || !ok || !q.Lab {
		t.Errorf("Default backends = %+v; want the lab", c.Backends)
	}
	name, data, err := c.Grants[0].PolicyDocument()
	if err != nil {
		t.Fatalf("PolicyDocument() = %v", err)
	}
	eng, err := policy.Parse(name, data)
	if err != nil {
		t.Fatalf("the built-in policy does not parse: %v", err)
	}
	tests := []struct {
		tool string
		want policy.Verdict
	}{
		{"list_vms", policy.Allow}, {"vm_file_read", policy.Allow}, {"vm_agent_exec", policy.Allow},
		{"kill_process", policy.Allow}, {"destroy_session", policy.Approve}, {"vm_power", policy.Approve},
		{"vm_file_write", policy.Deny}, {"no_such_tool", policy.Deny},
	}
	for _, tt := range tests {
		d := eng.Decide(policy.Call{Grant: "local", Tool: tt.tool, VM: "lab/vm1", Args: map[string]any{}})
		if d.Verdict != tt.want {
			t.Errorf("Decide(%s) = %v; want %v", tt.tool, d.Verdict, tt.want)
		}
		if (tt.tool == "kill_process" || tt.tool == "vm_agent_exec") && len(d.Counters) < 2 {
			t.Errorf("Decide(%s).Counters = %v; want its own limit and all_calls", tt.tool, d.Counters)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), ""); err == nil || !os.IsNotExist(errorsUnwrapAll(err)) {
		t.Errorf("Load(missing) = %v; want a not-exist error", err)
	}
}

func errorsUnwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}
