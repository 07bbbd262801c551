package server

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/audit/audittest"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server/mcptest"
)

func TestCatalogue(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	r := f.send(t, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if r.Result == nil {
		t.Fatalf("tools/list: no result: %+v", r.Error)
	}
	// The annotations of every tool, reviewed against what it can do: a
	// tool that can change a guest is destructive (vm_agent_exec runs any
	// command as root), idempotent when a repeat changes nothing more,
	// open-world when it reaches beyond the VM (a command reaches whatever
	// the guest's network does). A new tool needs its row: tools/list
	// fails this test without one.
	type want struct{ readOnly, destructive, idempotent, openWorld bool }
	wants := map[string]want{
		"list_vms":              {readOnly: true, idempotent: true},
		"vm_status":             {readOnly: true, idempotent: true},
		"list_processes":        {readOnly: true, idempotent: true},
		"list_sessions":         {readOnly: true, idempotent: true},
		"vm_agent_exec":         {destructive: true, openWorld: true},
		"vm_agent_exec_status":  {readOnly: true}, // the final result is returned once
		"create_session":        {},               // additive: a new work directory
		"kill_process":          {destructive: true},
		"destroy_session":       {destructive: true, idempotent: true},
		"vm_file_read":          {readOnly: true, idempotent: true},
		"vm_file_write":         {destructive: true}, // append twice appends twice
		"vm_dir_list":           {readOnly: true, idempotent: true},
		"vm_archive_read":       {readOnly: true, idempotent: true},
		"vm_archive_write":      {destructive: true}, // writes files into a guest directory
		"vm_power":              {destructive: true}, // reboot twice is two reboots
		"snapshot_list":         {readOnly: true, idempotent: true},
		"snapshot_create":       {destructive: true}, // a memory snapshot pauses the guest; each call adds one
		"snapshot_revert":       {destructive: true},
		"snapshot_delete":       {destructive: true},
		"vm_network":            {readOnly: true, idempotent: true},
		"vm_metrics":            {readOnly: true, idempotent: true},
		"restore_session_files": {destructive: true}, // moves files into a session's directory
		"vm_create":             {destructive: true}, // a new VM; two calls make two
		"vm_delete":             {destructive: true},
		"vm_screenshot":         {readOnly: true, idempotent: true},
		"vm_send_keys":          {destructive: true, openWorld: true}, // keys on a root console are a command
		"vm_console_read":       {readOnly: true, idempotent: true},
		"vm_console_write":      {destructive: true, openWorld: true}, // input to a serial shell or login
	}
	got := map[string]bool{}
	for _, tool := range r.Result.Tools {
		got[tool.Name] = true
		w, ok := wants[tool.Name]
		if !ok {
			t.Errorf("tools/list has unexpected tool %q", tool.Name)
			continue
		}
		a := tool.Annotations
		for _, c := range []struct {
			key  string
			want bool
		}{{"readOnlyHint", w.readOnly}, {"destructiveHint", w.destructive}, {"idempotentHint", w.idempotent}, {"openWorldHint", w.openWorld}} {
			if a[c.key] != c.want {
				t.Errorf("%s annotations[%s] = %v; want %v", tool.Name, c.key, a[c.key], c.want)
			}
		}
		s := tool.InputSchema
		if s["type"] != "object" || s["additionalProperties"] != false {
			t.Errorf("%s inputSchema type/additionalProperties = %v/%v; want object/false", tool.Name, s["type"], s["additionalProperties"])
		}
		if o := tool.OutputSchema; o["type"] != "object" || o["anyOf"] == nil {
			t.Errorf("%s outputSchema = %v; want an object schema (its result shapes or the error shape)", tool.Name, o)
		}
	}
	for name := range wants {
		if !got[name] {
			t.Errorf("tools/list lacks %q", name)
		}
	}
	kill := f.s.tools["kill_process"].MCPTool()
	schema := string(kill.RawInputSchema)
	for _, frag := range []string{`"minimum":1`, `"maximum":4194304`, `"enum":["TERM","KILL","INT","HUP","QUIT","USR1","USR2","STOP","CONT"]`, `"required":["vm","pid"]`} {
		if !strings.Contains(schema, frag) {
			t.Errorf("kill_process schema %s lacks %s", schema, frag)
		}
	}
	if p := string(f.s.tools["vm_power"].MCPTool().RawInputSchema); !strings.Contains(p, `"enum":["shutdown","reboot","reset","stop","start"]`) {
		t.Errorf("vm_power schema %s lacks the action enum", p)
	}
}

func TestHiddenToolsAreNotListed(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: `{"version":"1","default":"allow","hide":["vm_power"]}`})
	r := f.send(t, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if r.Result == nil || len(r.Result.Tools) == 0 {
		t.Fatalf("tools/list = %+v; want tools", r)
	}
	for _, tool := range r.Result.Tools {
		if tool.Name == "vm_power" {
			t.Errorf("tools/list lists hidden vm_power")
		}
	}
	if c := f.call(t, "vm_power", `{"vm":"lab/vm1","action":"stop"}`); !mcptest.HasTag(c, TagDenied) {
		t.Errorf("vm_power (hidden) = %q; want %s", c.Text(), TagDenied)
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("driver called %d times; want 0", n)
	}
}

func TestHostileInputs(t *testing.T) {
	huge := `{"vm":"lab/vm1","path":"/etc/` + strings.Repeat("a", 20<<20) + `"}`
	tests := []struct {
		name     string
		msg      string
		tag      string
		decision string // the audit decision; "" for none expected
	}{
		{"unknown tool", mcptest.ToolCall(1, "rm_rf", `{}`), TagInvalid, "invalid"},
		{"unknown VM", mcptest.ToolCall(1, "vm_status", `{"vm":"nosuch/vm1"}`), TagUnknownVM, "unknown_vm"},
		{"malformed VM id", mcptest.ToolCall(1, "vm_status", `{"vm":"vm1"}`), TagUnknownVM, "unknown_vm"},
		{"another grant's VM", mcptest.ToolCall(1, "vm_status", `{"vm":"other/vm1"}`), TagUnknownVM, "unknown_vm"},
		{"missing argument", mcptest.ToolCall(1, "vm_status", `{}`), TagInvalid, "invalid"},
		{"extra argument", mcptest.ToolCall(1, "vm_status", `{"vm":"lab/vm1","force":true}`), TagInvalid, "invalid"},
		{"wrong type", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":"42"}`), TagInvalid, "invalid"},
		{"null argument", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":null}`), TagInvalid, "invalid"},
		{"arguments not an object", mcptest.ToolCall(1, "vm_status", `["lab/vm1"]`), TagInvalid, "invalid"},
		{"duplicate key", mcptest.ToolCall(1, "vm_status", `{"vm":"lab/vm1","vm":"lab/vm2"}`), TagInvalid, "invalid"},
		{"case-variant key beside", mcptest.ToolCall(1, "vm_status", `{"vm":"lab/vm1","VM":"other/vm1"}`), TagInvalid, "invalid"},
		{"case-variant key instead", mcptest.ToolCall(1, "vm_status", `{"VM":"lab/vm1"}`), TagInvalid, "invalid"},
		{"case-variant method", `{"jsonrpc":"2.0","id":1,"METHOD":"tools/call","params":{"name":"vm_status","arguments":{"vm":"lab/vm1"}}}`, TagInvalid, "invalid"},
		{"duplicate name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"vm_status","name":"vm_power","arguments":{"vm":"lab/vm1"}}}`, TagInvalid, "invalid"},
		{"case-variant name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"Name":"vm_status","arguments":{"vm":"lab/vm1"}}}`, TagInvalid, "invalid"},
		{"20 MB argument", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"vm_file_read","arguments":` + huge + `}}`, TagInvalid, "invalid"},
		{"NUL in argv", mcptest.ToolCall(1, "vm_agent_exec", `{"vm":"lab/vm1","command":["ls","/tmp\u0000/etc"]}`), TagInvalid, "invalid"},
		{"NUL in path", mcptest.ToolCall(1, "vm_file_read", `{"vm":"lab/vm1","path":"/etc/passwd\u0000.txt"}`), TagInvalid, "invalid"},
		{"NUL in env", mcptest.ToolCall(1, "vm_agent_exec", `{"vm":"lab/vm1","command":["env"],"env":{"A":"x\u0000y"}}`), TagInvalid, "invalid"},
		{"bad env name", mcptest.ToolCall(1, "vm_agent_exec", `{"vm":"lab/vm1","command":["env"],"env":{"A=B":"x"}}`), TagInvalid, "invalid"},
		{"command and shell", mcptest.ToolCall(1, "vm_agent_exec", `{"vm":"lab/vm1","command":["ls"],"shell":"ls"}`), TagInvalid, "invalid"},
		{"neither command nor shell", mcptest.ToolCall(1, "vm_agent_exec", `{"vm":"lab/vm1"}`), TagInvalid, "invalid"},
		{"empty argv", mcptest.ToolCall(1, "vm_agent_exec", `{"vm":"lab/vm1","command":[]}`), TagInvalid, "invalid"},
		{"negative pid", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":-1}`), TagInvalid, "invalid"},
		{"pid 0", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":0}`), TagInvalid, "invalid"},
		{"huge pid", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":99999999999999999999999}`), TagInvalid, "invalid"},
		{"pid above pid_max", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":4194305}`), TagInvalid, "invalid"},
		{"pid 1e400", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":1e400}`), TagInvalid, "invalid"},
		{"fractional pid", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":2.5}`), TagInvalid, "invalid"},
		{"signal injection", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":42,"signal":"9; rm -rf /"}`), TagInvalid, "invalid"},
		{"signal lower case", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":42,"signal":"kill"}`), TagInvalid, "invalid"},
		{"power action unknown", mcptest.ToolCall(1, "vm_power", `{"vm":"lab/vm1","action":"explode"}`), TagInvalid, "invalid"},
		{"timeout above the maximum", mcptest.ToolCall(1, "vm_agent_exec", `{"vm":"lab/vm1","command":["ls"],"timeout_s":100000}`), TagInvalid, "invalid"},
		{"unknown params member", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"vm_status","arguments":{"vm":"lab/vm1"},"extra":1}}`, TagInvalid, "invalid"},
		{"invalid UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"vm_file_read\",\"arguments\":{\"vm\":\"lab/vm1\",\"path\":\"/\xff\"}}}", TagInvalid, "invalid"},
		{"kill_process needs the helper", mcptest.ToolCall(1, "kill_process", `{"vm":"lab/vm1","pid":1}`), TagBackend, "allow"},
		{"session tools need the helper", mcptest.ToolCall(1, "destroy_session", `{"vm":"lab/vm1","session":"s1"}`), TagBackend, "allow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{vms: []string{"lab/*"}})
			r := f.send(t, tt.msg)
			t.Logf("reply: %.160s", r.Text())
			if !mcptest.HasTag(r, tt.tag) {
				t.Errorf("reply text = %.200q (error %+v); want tag %s", r.Text(), r.Error, tt.tag)
			}
			if string(r.ID) != "1" {
				t.Errorf("reply id = %s; want 1", r.ID)
			}
			if n := f.calls.Load(); n != 0 {
				t.Errorf("driver called %d times; want 0", n)
			}
			recs := f.rec.Records()
			if len(recs) == 0 || recs[0].Kind != audit.KindDecision || recs[0].Decision != tt.decision {
				t.Fatalf("audit records = %+v; want a first decision record %q", recs, tt.decision)
			}
			if recs[0].Grant != "local" || recs[0].CallID == "" {
				t.Errorf("audit record grant/call = %q/%q; want local and a call id", recs[0].Grant, recs[0].CallID)
			}
		})
	}
}

func TestNonToolMessagesFailingStrictDecodingNeverReachMCP(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		code int
	}{
		{"not JSON", `{"jsonrpc":`, -32700},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`, -32600},
		{"duplicate method", `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"ping"}`, -32600},
		{"wrong version", `{"jsonrpc":"1.0","id":1,"method":"ping"}`, -32600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			r := f.send(t, tt.msg)
			if r.Error == nil || r.Error.Code != tt.code {
				t.Errorf("reply error = %+v; want code %d", r.Error, tt.code)
			}
		})
	}
}

func TestHandlersRefuseWithoutTicket(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := ConnContext(context.Background(), &Conn{Grant: f.s.grants["local"], Transport: "stdio"})
	resp := f.s.MCP().HandleMessage(ctx, []byte(mcptest.ToolCall(7, "vm_power", `{"vm":"lab/vm1","action":"stop"}`)))
	b, _ := jsonMarshal(resp)
	if !strings.Contains(string(b), TagDenied) || !strings.Contains(string(b), `"isError":true`) {
		t.Errorf("HandleMessage without the gate = %s; want an isError %s result", b, TagDenied)
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("driver called %d times; want 0", n)
	}
}

func TestAllowedCallReachesDriverAndIsAudited(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	r := f.call(t, "vm_agent_exec", `{"vm":"lab/vm1","command":["echo","hi"],"stdin":"secret","env":{"TOKEN":"s3cret"}}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_agent_exec = %q; want success", r.Text())
	}
	if got := r.Result.StructuredContent["stdout"]; got != "exited\n" {
		t.Errorf("structuredContent.stdout = %v; want %q", got, "exited\n")
	}
	recs := f.rec.Records()
	if len(recs) != 2 || recs[0].Kind != audit.KindDecision || recs[1].Kind != audit.KindOutcome || recs[0].CallID != recs[1].CallID {
		t.Fatalf("audit records = %+v; want a decision and an outcome with one call id", recs)
	}
	if recs[0].Decision != "allow" || recs[1].Outcome != "ok" || recs[0].VM != "lab/vm1" {
		t.Errorf("decision/outcome/vm = %q/%q/%q; want allow/ok/lab/vm1", recs[0].Decision, recs[1].Outcome, recs[0].VM)
	}
}

func TestExecWaitFalseIsBoundToGrant(t *testing.T) {
	f := newFixture(t, fixtureOpts{vms: nil})
	r := f.call(t, "vm_agent_exec", `{"vm":"other/vm1","command":["sleep","1"],"wait":false}`)
	id, _ := r.Result.StructuredContent["exec_id"].(string)
	if id == "" {
		t.Fatalf("vm_agent_exec wait:false = %q; want an exec_id", r.Text())
	}
	// Another grant that can see the VM does not know the id.
	o := f.sendAs(t, "other", mcptest.ToolCall(2, "vm_agent_exec_status", `{"vm":"other/vm1","exec_id":"`+id+`"}`))
	if !mcptest.HasTag(o, TagInvalid) {
		t.Errorf("status by another grant = %q; want %s", o.Text(), TagInvalid)
	}
	s := f.call(t, "vm_agent_exec_status", `{"vm":"other/vm1","exec_id":"`+id+`"}`)
	if s.Result == nil || s.Result.IsError || s.Result.StructuredContent["exited"] != true {
		t.Fatalf("status = %q; want exited", s.Text())
	}
	// An exited command's id is forgotten after its result was returned.
	if again := f.call(t, "vm_agent_exec_status", `{"vm":"other/vm1","exec_id":"`+id+`"}`); !mcptest.HasTag(again, TagInvalid) {
		t.Errorf("second status = %q; want %s", again.Text(), TagInvalid)
	}
}

const killLimited = `{"version":"1","default":"deny","tools":{"kill_process":{"limits":[{"counter":"kill_process_rate","window":"minute","max":10,"scope":"grant"}]}}}`

func TestRateLimit(t *testing.T) {
	f := newSessFixture(t, haveBins(), killLimited)
	// Refused by the guest's guard before any side effect: refunded, so
	// they cost no budget.
	for range 3 {
		if r := f.as(t, "alice", "kill_process", `{"vm":"lab/vm1","pid":1}`); !mcptest.HasTag(r, TagInvalid) {
			t.Fatalf("kill pid 1 = %q; want %s", r.Text(), TagInvalid)
		}
	}
	for i := range 10 {
		f.advance(time.Second)
		r := f.as(t, "alice", "kill_process", `{"vm":"lab/vm1","pid":4242}`)
		if r.Result == nil || r.Result.IsError {
			t.Fatalf("kill %d = %q; want success", i+1, r.Text())
		}
	}
	r := f.as(t, "alice", "kill_process", `{"vm":"lab/vm1","pid":4242}`)
	if !mcptest.HasTag(r, TagRateLimited) {
		t.Fatalf("11th kill = %q; want %s", r.Text(), TagRateLimited)
	}
	// The first kill was at +1 s and the clock is at +10 s: 51 s to go.
	if m := regexp.MustCompile(`retry in (\d+) s`).FindStringSubmatch(r.Text()); m == nil || m[1] != "51" {
		t.Errorf("11th kill text = %q; want retry in 51 s", r.Text())
	}
	f.advance(52 * time.Second)
	if r := f.as(t, "alice", "kill_process", `{"vm":"lab/vm1","pid":4242}`); r.Result == nil || r.Result.IsError {
		t.Errorf("kill after the window moved = %q; want success", r.Text())
	}
	// Not in the policy: denied by default.
	if r := f.as(t, "alice", "vm_status", `{"vm":"lab/vm1"}`); !mcptest.HasTag(r, TagDenied) {
		t.Errorf("vm_status under default deny = %q; want %s", r.Text(), TagDenied)
	}
}

func TestApprovalRoundTrip(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: `{"version":"1","default":"deny","tools":{"vm_power":{"action":"approve","approval":{"ttl":"15m"}}}}`})
	args := `{"vm":"lab/vm1","action":"shutdown"}`
	r := f.call(t, "vm_power", args)
	if !mcptest.HasTag(r, TagApproval) {
		t.Fatalf("first call = %q; want %s", r.Text(), TagApproval)
	}
	id, _ := r.Result.StructuredContent["approval_id"].(string)
	if id == "" || !strings.Contains(r.Text(), id) {
		t.Fatalf("first call = %q, approval_id %q; want the id in the text", r.Text(), id)
	}
	// A retry while pending gets the same approval.
	if again := f.call(t, "vm_power", args); again.Result.StructuredContent["approval_id"] != id {
		t.Errorf("retry while pending: approval_id = %v; want %s", again.Result.StructuredContent["approval_id"], id)
	}
	if f.calls.Load() != 0 {
		t.Fatalf("driver called before approval")
	}
	if _, err := f.s.Approvals().Grant(context.Background(), id, "alice", "ok"); err != nil {
		t.Fatalf("Approvals().Grant(%s): %v", id, err)
	}
	// Different arguments are not covered by the approval.
	if other := f.call(t, "vm_power", `{"vm":"lab/vm1","action":"reset"}`); !mcptest.HasTag(other, TagApproval) || other.Result.StructuredContent["approval_id"] == id {
		t.Errorf("different args = %q; want a new approval", other.Text())
	}
	if ok := f.call(t, "vm_power", args); ok.Result == nil || ok.Result.IsError {
		t.Fatalf("identical retry after grant = %q; want success", ok.Text())
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("driver calls = %d; want 1", n)
	}
	second := f.call(t, "vm_power", args)
	if !mcptest.HasTag(second, TagApproval) || second.Result.StructuredContent["approval_id"] == id {
		t.Errorf("second retry = %q; want a new approval", second.Text())
	}
	if _, err := f.s.Approvals().Grant(context.Background(), id, "alice", ""); !errors.Is(err, store.ErrNotPending) {
		t.Errorf("granting a consumed approval: err = %v; want ErrNotPending", err)
	}
}

func TestShadowModeAllowsAndAudits(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: `{"version":"1","default":"deny","tools":{"vm_power":{"action":"deny","mode":"shadow"}}}`})
	r := f.call(t, "vm_power", `{"vm":"lab/vm1","action":"shutdown"}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("shadowed write = %q; want success", r.Text())
	}
	recs := f.rec.Records()
	if len(recs) == 0 || !recs[0].Shadow || recs[0].Decision != "deny" {
		t.Errorf("audit = %+v; want a shadow deny decision", recs)
	}
}

// failingStore is a store whose methods can be made to fail.
type failingStore struct {
	store.Store
	ReserveErr error
}

func (s *failingStore) ReserveAll(ctx context.Context, id string, now time.Time, cs []policy.Counter) error {
	if s.ReserveErr != nil {
		return s.ReserveErr
	}
	return s.Store.ReserveAll(ctx, id, now, cs)
}

func TestFailClosed(t *testing.T) {
	tests := []struct {
		name  string
		store store.Store
		rec   *audittest.Recorder
	}{
		{"store unavailable", &failingStore{Store: memory.New(), ReserveErr: store.ErrUnavailable}, nil},
		{"audit append fails", nil, &audittest.Recorder{AppendErr: func(audit.Record) error { return errors.New("disk full") }}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{policy: killLimited, store: tt.store, rec: tt.rec})
			r := f.call(t, "kill_process", `{"vm":"lab/vm1","pid":4242}`)
			if !mcptest.HasTag(r, TagDenied) {
				t.Errorf("kill = %q; want %s", r.Text(), TagDenied)
			}
			if n := f.calls.Load(); n != 0 {
				t.Errorf("driver called %d times; want 0", n)
			}
		})
	}
}

func TestListVMsHonoursVisibility(t *testing.T) {
	f := newFixture(t, fixtureOpts{vms: []string{"lab/vm1"}})
	r := f.call(t, "list_vms", `{}`)
	vms, _ := r.Result.StructuredContent["vms"].([]any)
	if len(vms) != 1 || vms[0].(map[string]any)["id"] != "lab/vm1" {
		t.Errorf("list_vms = %v; want only lab/vm1", r.Result.StructuredContent)
	}
}

// TestGateStepsOrder pins the order of the gate's steps: the flow of
// docs/design.md (arguments are valid before a policy sees them; counters are
// reserved only for a call that is allowed and approved; the decision
// record is written last, before dispatch).
func TestGateStepsOrder(t *testing.T) {
	var got []string
	for _, st := range gateSteps {
		got = append(got, st.name)
	}
	want := []string{"decode", "validate", "resolve", "decide", "approve", "reserve", "record"}
	if !slices.Equal(got, want) {
		t.Errorf("gateSteps = %v; want %v", got, want)
	}
}
