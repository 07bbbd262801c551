package policy

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSnapshotBefore: the block asks for a snapshot with its retention,
// only when its conditions hold, and only on the tools that can take one.
func TestSnapshotBefore(t *testing.T) {
	doc := `{"version":"1","default":"deny","tools":{
	  "vm_power": {"action":"approve","snapshot_before": true},
	  "destroy_session": {"snapshot_before": {"retention":"2h"}},
	  "vm_agent_exec": {"snapshot_before": {"retention":"10m","if":[{"path":"args.command","op":"contains","value":"apt-get"}]}},
	  "vm_status": {}
	}}`
	e, err := Parse("p.json", []byte(doc))
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	tests := []struct {
		tool    string
		args    map[string]any
		want    time.Duration // 0: no snapshot
		wantPtr string
	}{
		{"vm_power", map[string]any{"action": "stop"}, DefaultSnapshotRetention, "/tools/vm_power/snapshot_before"},
		{"destroy_session", map[string]any{"session": "x"}, 2 * time.Hour, "/tools/destroy_session/snapshot_before"},
		{"vm_agent_exec", map[string]any{"command": []any{"apt-get", "remove", "x"}}, 10 * time.Minute, "/tools/vm_agent_exec/snapshot_before"},
		{"vm_agent_exec", map[string]any{"command": []any{"ls"}}, 0, ""},
		{"vm_status", nil, 0, ""},
	}
	for _, tt := range tests {
		d := e.Decide(Call{Grant: "g", Tool: tt.tool, VM: "lab/vm1", Args: tt.args})
		var got time.Duration
		ptr := ""
		if d.Snapshot != nil {
			got, ptr = d.Snapshot.Retention, d.Snapshot.Rule
		}
		if got != tt.want || ptr != tt.wantPtr {
			t.Errorf("Decide(%s, %v).Snapshot = %v %q; want %v %q", tt.tool, tt.args, got, ptr, tt.want, tt.wantPtr)
		}
	}
	_, steps := e.Explain(Call{Grant: "g", Tool: "vm_agent_exec", VM: "lab/vm1", Args: map[string]any{"command": []any{"ls"}}})
	found := false
	for _, s := range steps {
		found = found || s.Name == "snapshot_before" && s.Result == "skip"
	}
	if !found {
		t.Errorf("Explain steps = %+v; want a skipped snapshot_before step", steps)
	}
}

func TestSnapshotBeforeErrors(t *testing.T) {
	tests := []struct{ block, want string }{
		{`"vm_status": {"snapshot_before": true}`, "snapshot_before belongs on vm_power"},
		{`"vm_power": {"snapshot_before": {"retention":"1s"}}`, "out of range"},
		{`"vm_power": {"snapshot_before": {"retention":"900h"}}`, "out of range"},
		{`"vm_power": {"snapshot_before": {"retention":"soon"}}`, "bad duration"},
		{`"vm_power": {"snapshot_before": {"keep":"1h"}}`, "keep"},
		{`"vm_power": {"snapshot_before": "yes"}`, "want an object"},
		{`"vm_power": {"keep_files": "1h"}`, "keep_files belongs on destroy_session"},
		{`"destroy_session": {"keep_files": "48h"}`, "out of range"},
		{`"destroy_session": {"keep_files": 3600}`, "want a string"},
	}
	for _, tt := range tests {
		_, err := Parse("p.json", []byte(`{"version":"1","default":"deny","tools":{`+tt.block+`}}`))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%s) = %v; want an error containing %q", tt.block, err, tt.want)
		}
	}
	e, err := Parse("p.json", []byte(`{"version":"1","default":"allow","tools":{"vm_power":{"snapshot_before": false}}}`))
	if err != nil {
		t.Fatalf("Parse(snapshot_before false) = %v", err)
	}
	if d := e.Decide(Call{Grant: "g", Tool: "vm_power", VM: "lab/vm1"}); d.Snapshot != nil {
		t.Errorf("Decide with snapshot_before false: Snapshot = %+v; want nil", d.Snapshot)
	}
}

func TestKeepFiles(t *testing.T) {
	e, err := Parse("p.json", []byte(`{"version":"1","default":"allow","tools":{"destroy_session":{"action":"approve","keep_files":"2h"}}}`))
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	if d := e.Decide(Call{Grant: "g", Tool: "destroy_session", VM: "lab/vm1"}); d.KeepFiles != 2*time.Hour || d.Verdict != Approve {
		t.Errorf("Decide(destroy_session) = %v, keep %v; want approve, 2h", d.Verdict, d.KeepFiles)
	}
}

// TestSnapshotRules: the top-level block bounds every snapshot-taking
// tool's calls, the others knob sits on revert and delete only, and tools
// that have nothing to do with snapshots get no rules.
func TestSnapshotRules(t *testing.T) {
	doc := `{"version":"1","default":"allow",
  "snapshots": {"max_count": 3, "max_mb": 512},
  "tools":{
    "snapshot_revert": {"snapshots": {"others": true}},
    "snapshot_delete": {"snapshots": {"others": false}},
    "vm_power": {"snapshot_before": true}
  }}`
	e, err := Parse("p.json", []byte(doc))
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	bounds := SnapshotRules{MaxCount: 3, MaxBytes: 512 << 20, Rule: "/snapshots"}
	others := bounds
	others.Others, others.OthersRule = true, "/tools/snapshot_revert/snapshots/others"
	tests := []struct {
		tool string
		want SnapshotRules
	}{
		{"snapshot_create", bounds},
		{"snapshot_list", bounds},
		{"snapshot_revert", others},
		{"snapshot_delete", bounds},
		{"vm_power", bounds},
		{"vm_agent_exec", bounds}, // unlisted under default allow: still bounded
		{"destroy_session", bounds},
		{"vm_status", SnapshotRules{}},
		{"vm_file_write", SnapshotRules{}},
	}
	for _, tt := range tests {
		d := e.Decide(Call{Grant: "g", Tool: tt.tool, VM: "lab/vm1", Args: map[string]any{"action": "stop"}})
		if d.Snapshots != tt.want {
			t.Errorf("Decide(%s).Snapshots = %+v; want %+v", tt.tool, d.Snapshots, tt.want)
		}
	}
	plain, err := Parse("p.json", []byte(`{"version":"1","default":"allow","tools":{"snapshot_delete":{}}}`))
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	if d := plain.Decide(Call{Grant: "g", Tool: "snapshot_delete", VM: "lab/vm1"}); d.Snapshots != (SnapshotRules{}) {
		t.Errorf("Decide(snapshot_delete) without blocks: Snapshots = %+v; want no bounds and no others", d.Snapshots)
	}
}

// TestSnapshotRulesErrors: bad snapshots blocks are errors with their line
// and column.
func TestSnapshotRulesErrors(t *testing.T) {
	tests := []struct{ doc, want string }{
		{`{"version":"1","default":"deny",
  "snapshots": {"max_count": 0}}`, `p.json:2:30: snapshots.max_count: max_count 0 is out of range (want 1 to 10000`},
		{`{"version":"1","default":"deny",
  "snapshots": {"max_mb": 1.5}}`, `p.json:2:27: snapshots.max_mb: want an integer, got 1.5`},
		{`{"version":"1","default":"deny",
  "snapshots": {"max_mb": -1}}`, `p.json:2:27: snapshots.max_mb: max_mb -1 is out of range`},
		{`{"version":"1","default":"deny",
  "snapshots": {"others": true}}`, `p.json:2:17: snapshots.others: others belongs in the snapshots block of snapshot_revert or snapshot_delete`},
		{`{"version":"1","default":"deny",
  "snapshots": {"Max_count": 2}}`, `p.json:2:17: snapshots.Max_count: unknown field "Max_count" (field names are case-sensitive: did you mean "max_count"?)`},
		{`{"version":"1","default":"deny",
  "snapshots": [3]}`, `p.json:2:16: snapshots: want an object, got array`},
		{`{"version":"1","default":"deny","tools":{
  "snapshot_create": {"snapshots": {"others": true}}}}`, `p.json:2:36: tools.snapshot_create.snapshots: a snapshots block belongs on snapshot_revert, snapshot_delete (others)`},
		{`{"version":"1","default":"deny","tools":{
  "snapshot_revert": {"snapshots": {"others": "yes"}}}}`, `p.json:2:47: tools.snapshot_revert.snapshots.others: want true or false, got string`},
		{`{"version":"1","default":"deny","tools":{
  "snapshot_delete": {"snapshots": {"max_count": 2}}}}`, `p.json:2:37: tools.snapshot_delete.snapshots.max_count: unknown field "max_count" (known: others)`},
	}
	for _, tt := range tests {
		_, err := Parse("p.json", []byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%s) = %v; want an error containing %q", tt.doc, err, tt.want)
		}
	}
}

// TestReadmeSnapshotsExample: README's policy with a snapshots block
// parses and bounds as the text says.
func TestReadmeSnapshotsExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```json\n(\\{[^`]*\"snapshots\": \\{\"max_count\"[^`]*)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README has no policy with a top-level snapshots block")
	}
	e, err := Parse("readme.json", m[1])
	if err != nil {
		t.Fatalf("README's snapshots example does not parse: %v", err)
	}
	d := e.Decide(Call{Grant: "g", Tool: "snapshot_revert", VM: "lab/vm1"})
	if d.Verdict != Allow || d.Snapshots.MaxCount != 4 || d.Snapshots.MaxBytes != 2048<<20 || !d.Snapshots.Others {
		t.Errorf("README's example: Decide(snapshot_revert) = %v, %+v; want allowed, 4 snapshots, 2048 MiB, others", d.Verdict, d.Snapshots)
	}
}
