package policy

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"
)

// TestReadmeConditionOps: README's table of condition operators lists every
// op exactly once, and each example is a valid condition that holds for a
// call it describes and not for one it does not.
func TestReadmeConditionOps(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| [^|]+ \\| `(\\{.*\\})` \\|$")
	examples := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		if _, dup := examples[m[1]]; dup {
			t.Errorf("README lists op %s twice", m[1])
		}
		examples[m[1]] = m[2]
	}
	// For each op, arguments (and vm) for which README's example holds, and
	// ones for which it does not.
	calls := map[string][2]Call{
		"eq":       {{VM: "lab/vm1", Args: map[string]any{"signal": "TERM"}}, {VM: "lab/vm1", Args: map[string]any{"signal": "KILL"}}},
		"neq":      {{VM: "lab/vm1"}, {VM: "lab/prod"}},
		"in":       {{VM: "lab/vm1", Args: map[string]any{"signal": "INT"}}, {VM: "lab/vm1", Args: map[string]any{"signal": "KILL"}}},
		"not_in":   {{VM: "lab/vm1", Args: map[string]any{"action": "shutdown"}}, {VM: "lab/vm1", Args: map[string]any{"action": "reset"}}},
		"lt":       {{VM: "lab/vm1", Args: map[string]any{"timeout_s": 30.0}}, {VM: "lab/vm1", Args: map[string]any{"timeout_s": 60.0}}},
		"lte":      {{VM: "lab/vm1", Args: map[string]any{"limits": map[string]any{"memory_mb": 512.0}}}, {VM: "lab/vm1", Args: map[string]any{"limits": map[string]any{"memory_mb": 513.0}}}},
		"gt":       {{VM: "lab/vm1", Args: map[string]any{"pid": 1001.0}}, {VM: "lab/vm1", Args: map[string]any{"pid": 1000.0}}},
		"gte":      {{VM: "lab/vm1", Args: map[string]any{"max_bytes": 1048576.0}}, {VM: "lab/vm1", Args: map[string]any{"max_bytes": 10.0}}},
		"regex":    {{VM: "lab/vm1", Args: map[string]any{"path": "/tmp/x"}}, {VM: "lab/vm1", Args: map[string]any{"path": "/tmp/a/b"}}},
		"glob":     {{VM: "lab/vm1"}, {VM: "pve/101"}},
		"not_glob": {{VM: "lab/vm1", Args: map[string]any{"path": "/tmp/x"}}, {VM: "lab/vm1", Args: map[string]any{"path": "/etc/passwd"}}},
		"not_regex": {{VM: "lab/vm1", Args: map[string]any{"session": "0a1b2c3d4e5f60718293a4b5c6d7e8f9"}},
			{VM: "lab/vm1", Args: map[string]any{"session": "../../etc"}}},
		"contains": {{VM: "lab/vm1", Args: map[string]any{"command": []any{"rm", "-rf", "/x"}}}, {VM: "lab/vm1", Args: map[string]any{"command": []any{"ls", "-l"}}}},
		"exists":   {{VM: "lab/vm1", Args: map[string]any{"session": "s1"}}, {VM: "lab/vm1", Args: map[string]any{}}},
	}
	for name := range opNames {
		ex, ok := examples[name]
		if !ok {
			t.Errorf("README's table of condition ops has no row for %s", name)
			continue
		}
		var c map[string]any
		if err := json.Unmarshal([]byte(ex), &c); err != nil || c["op"] != name {
			t.Errorf("README's example for %s = %s (%v); want a condition with op %s", name, ex, err, name)
			continue
		}
		e, err := Parse("readme.json", []byte(`{"version":"1","default":"deny","tools":{"t":{"require":[`+ex+`]}}}`))
		if err != nil {
			t.Errorf("README's example for %s does not parse: %v", name, err)
			continue
		}
		for i, want := range []Verdict{Allow, Deny} {
			call := calls[name][i]
			call.Grant, call.Tool = "g", "t"
			if d := e.Decide(call); d.Verdict != want {
				t.Errorf("README's %s example %s with vm %s args %v: Decide = %v; want %v", name, ex, call.VM, call.Args, d.Verdict, want)
			}
		}
	}
	for name := range examples {
		if _, ok := opNames[name]; !ok {
			t.Errorf("README's table of condition ops lists %s, which is no op", name)
		}
	}
}
