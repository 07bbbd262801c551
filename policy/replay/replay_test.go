package replay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
)

var t0 = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

// rec is a decision record at t0+secs; outcome adds its outcome record.
type rec struct {
	secs     float64
	id, tool string
	decision string
	shadow   bool
	outcome  string // "" none, "ok", "refunded"
	args     map[string]any
	approval string
	transp   string
}

func writeLog(t *testing.T, recs []rec) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(path, audit.Options{Fsync: audit.FsyncInterval})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		at := t0.Add(time.Duration(r.secs * float64(time.Second)))
		tr := r.transp
		if tr == "" {
			tr = "stdio"
		}
		d := audit.Record{Time: at, Kind: audit.KindDecision, CallID: r.id, Grant: "g", Transport: tr, Tool: r.tool, VM: "lab/vm1",
			Decision: r.decision, Shadow: r.shadow, Args: r.args, ApprovalID: r.approval}
		if _, err := l.Append(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		if r.outcome != "" {
			o := audit.Record{Time: at.Add(time.Millisecond), Kind: audit.KindOutcome, CallID: r.id, Grant: "g", Transport: tr, Tool: r.tool,
				VM: "lab/vm1", Outcome: "ok", Refunded: r.outcome == "refunded"}
			if _, err := l.Append(context.Background(), o); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func defaults(tool string, args map[string]any) map[string]any {
	if tool != "kill_process" {
		return args
	}
	out := map[string]any{"signal": "TERM"}
	for k, v := range args {
		out[k] = v
	}
	return out
}

// TestReplayDecisions: every kind of change a candidate can make, limits
// on the recorded times, refunds, and what is not replayed.
func TestReplayDecisions(t *testing.T) {
	candidate := `{"version":"1","default":"deny","tools":{
	  "list_vms":{},
	  "kill_process":{"require":[{"path":"args.signal","op":"in","value":["TERM"]}]},
	  "vm_agent_exec":{"limits":[{"counter":"x","window":"minute","max":2,"scope":"grant"}]},
	  "destroy_session":{"action":"approve"},
	  "vm_power":{"action":"approve"},
	  "vm_file_write":{"mode":"shadow","action":"deny"}}}`
	exec := map[string]any{"vm": "lab/vm1", "command": []any{"true"}}
	path := writeLog(t, []rec{
		{secs: 0, id: "list", tool: "list_vms", decision: "allow", outcome: "ok"},                                                // same
		{secs: 1, id: "kill-default", tool: "kill_process", decision: "allow", outcome: "ok", args: map[string]any{"pid": 5.0}},  // TERM by default: same
		{secs: 2, id: "kill-hup", tool: "kill_process", decision: "allow", outcome: "ok", args: map[string]any{"signal": "HUP"}}, // allow → deny
		{secs: 3, id: "status", tool: "vm_status", decision: "deny"},                                                             // deny → deny (not listed): same
		{secs: 4, id: "read", tool: "vm_file_read", decision: "deny", shadow: true, outcome: "ok"},                               // shadow deny → deny: stopped
		{secs: 5, id: "write", tool: "vm_file_write", decision: "allow", outcome: "ok"},                                          // allow → deny (shadow): still runs
		{secs: 10, id: "exec1", tool: "vm_agent_exec", decision: "allow", outcome: "ok", args: exec},                             // 1st in the window
		{secs: 11, id: "exec2", tool: "vm_agent_exec", decision: "allow", outcome: "refunded", args: exec},                       // refunded
		{secs: 12, id: "exec3", tool: "vm_agent_exec", decision: "allow", outcome: "ok", args: exec},                             // 2nd
		{secs: 13, id: "exec4", tool: "vm_agent_exec", decision: "allow", outcome: "ok", args: exec},                             // 3rd in a minute: rate_limited
		{secs: 70.5, id: "exec5", tool: "vm_agent_exec", decision: "rate_limited", args: exec},                                   // window moved on: started
		{secs: 80, id: "destroy", tool: "destroy_session", decision: "approve", approval: "A1", outcome: "ok"},                   // approved: same
		{secs: 81, id: "power", tool: "vm_power", decision: "allow", outcome: "ok"},                                              // allow → approve: stopped
		{secs: 82, id: "power-denied", tool: "vm_power", decision: "deny", approval: "A2"},                                       // the operator denied: approve, same
		{secs: 83, id: "bad", tool: "vm_status", decision: "invalid"},                                                            // not replayed
		{secs: 84, id: "approval-A1", tool: "destroy_session", decision: "approval_granted", approval: "A1", transp: "operator"}, // not replayed
		{secs: 85, id: "ghost", tool: "vm_power", decision: "unknown_vm"},                                                        // not replayed
	})
	eng, err := policy.Parse("candidate.json", []byte(candidate))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := Replay(context.Background(), f, eng, Options{Defaults: defaults})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range res.Changes {
		got = append(got, fmt.Sprintf("%s: %s → %s (%v → %v)", c.CallID, c.Recorded, c.Candidate, c.Recorded.Through, c.Candidate.Through))
	}
	want := []string{
		"kill-hup: allow → deny (true → false)",
		"read: deny (shadow) → deny (true → false)",
		"write: allow → deny (shadow) (true → true)",
		"exec4: allow → rate_limited (true → false)",
		"exec5: rate_limited → allow (false → true)",
		"power: allow → approve (true → false)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("changes =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if res.Replayed != 14 || res.Stopped != 4 || res.Started != 1 {
		t.Errorf("replayed %d, stopped %d, started %d; want 14, 4, 1", res.Replayed, res.Stopped, res.Started)
	}
	wantSkipped := map[string]int{"an operator's record (approval, undo)": 1, "refused before the policy decided (invalid)": 1, "refused before the policy decided (unknown_vm)": 1}
	if fmt.Sprint(res.Skipped) != fmt.Sprint(wantSkipped) {
		t.Errorf("skipped = %v; want %v", res.Skipped, wantSkipped)
	}
	if c := res.Changes[0]; c.Rule != "/tools/kill_process/require/0" || !strings.Contains(c.Reason, `args.signal in ["TERM"]`) {
		t.Errorf("kill-hup change: rule %q, reason %q; want the candidate's require and why", c.Rule, c.Reason)
	}
}
