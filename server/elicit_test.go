package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

const clientApprovalPolicy = `{"version":"1","default":"allow","tools":{"vm_power":{"action":"approve","approval":{"channel":"client","ttl":"2m"}}}}`

const modernMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}`

// elicitReply is a tools/call reply with the multi-round-trip fields.
type elicitReply struct {
	Result struct {
		ResultType    string `json:"resultType"`
		IsError       bool   `json:"isError"`
		RequestState  string `json:"requestState"`
		InputRequests map[string]struct {
			Method string         `json:"method"`
			Params map[string]any `json:"params"`
		} `json:"inputRequests"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"result"`
}

func (r elicitReply) Text() string {
	if len(r.Result.Content) == 0 {
		return ""
	}
	return r.Result.Content[0].Text
}

func sendRaw(t *testing.T, f *fixture, grant, params string) elicitReply {
	t.Helper()
	raw := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{` + params + `}}`
	out := f.s.Handle(context.Background(), &Conn{Grant: f.s.grants[grant], Transport: "stdio"}, []byte(raw))
	var r elicitReply
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("reply %.300q: %v", out, err)
	}
	return r
}

func powerParams(action, extra string) string {
	p := fmt.Sprintf(`"name":"vm_power","arguments":{"vm":"lab/vm1","action":%q}`, action)
	if extra != "" {
		p += "," + extra
	}
	return p
}

func answer(state, response string) string {
	return fmt.Sprintf(`%s,"requestState":%q,"inputResponses":{"approval":%s}`, modernMeta, state, response)
}

const approveYes = `{"action":"accept","content":{"approve":true}}`

// ask makes the first call and returns the request state it got.
func ask(t *testing.T, f *fixture, action string) string {
	t.Helper()
	r := sendRaw(t, f, "local", powerParams(action, modernMeta))
	if r.Result.ResultType != "input_required" || r.Result.RequestState == "" {
		t.Fatalf("first call = %+v; want input_required with a request state", r.Result)
	}
	in, ok := r.Result.InputRequests["approval"]
	if !ok || in.Method != "elicitation/create" || !strings.Contains(fmt.Sprint(in.Params["message"]), "vm_power") {
		t.Fatalf("input requests = %+v; want an elicitation/create naming vm_power", r.Result.InputRequests)
	}
	return r.Result.RequestState
}

func TestClientApprovalAccepted(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: clientApprovalPolicy})
	state := ask(t, f, "shutdown")
	if n := f.calls.Load(); n != 0 {
		t.Fatalf("driver calls before the answer = %d; want 0", n)
	}
	r := sendRaw(t, f, "local", powerParams("shutdown", answer(state, approveYes)))
	if r.Result.IsError || r.Result.ResultType == "input_required" {
		t.Fatalf("approved retry = %q (%+v); want success", r.Text(), r.Result)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("driver calls after the approved retry = %d; want 1", n)
	}
	// The same state again: single use.
	r = sendRaw(t, f, "local", powerParams("shutdown", answer(state, approveYes)))
	if !r.Result.IsError || !strings.HasPrefix(r.Text(), TagDenied+" ") {
		t.Errorf("replayed state = %q; want %s", r.Text(), TagDenied)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("driver calls after the replay = %d; want 1", n)
	}
	var asked, approved bool
	for _, rec := range f.rec.Records() {
		asked = asked || rec.Decision == "approve" && rec.Reason == "asked the client's user"
		approved = approved || rec.Decision == "approve" && rec.ApprovalID == "client"
	}
	if !asked || !approved {
		t.Errorf("audit: asked=%v approved=%v; want both recorded", asked, approved)
	}
}

func TestClientApprovalRefused(t *testing.T) {
	tamper := func(s string) string {
		b := []byte(s)
		i := strings.IndexByte(s, '.') - 2
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	tests := []struct {
		name    string
		params  func(t *testing.T, f *fixture) string
		wantTag string
	}{
		{"legacy client", func(t *testing.T, f *fixture) string { return powerParams("shutdown", "") }, TagDenied},
		{"no elicitation capability", func(t *testing.T, f *fixture) string {
			return powerParams("shutdown", `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`)
		}, TagDenied},
		{"decline", func(t *testing.T, f *fixture) string {
			return powerParams("shutdown", answer(ask(t, f, "shutdown"), `{"action":"decline"}`))
		}, TagDenied},
		{"cancel", func(t *testing.T, f *fixture) string {
			return powerParams("shutdown", answer(ask(t, f, "shutdown"), `{"action":"cancel"}`))
		}, TagDenied},
		{"accept without approve", func(t *testing.T, f *fixture) string {
			return powerParams("shutdown", answer(ask(t, f, "shutdown"), `{"action":"accept","content":{"approve":false}}`))
		}, TagDenied},
		{"approve as string", func(t *testing.T, f *fixture) string {
			return powerParams("shutdown", answer(ask(t, f, "shutdown"), `{"action":"accept","content":{"approve":"true"}}`))
		}, TagDenied},
		{"no answer", func(t *testing.T, f *fixture) string {
			return powerParams("shutdown", fmt.Sprintf(`%s,"requestState":%q`, modernMeta, ask(t, f, "shutdown")))
		}, TagDenied},
		{"state of other arguments", func(t *testing.T, f *fixture) string {
			return powerParams("stop", answer(ask(t, f, "shutdown"), approveYes))
		}, TagDenied},
		{"tampered state", func(t *testing.T, f *fixture) string {
			return powerParams("shutdown", answer(tamper(ask(t, f, "shutdown")), approveYes))
		}, TagDenied},
		{"forged state", func(t *testing.T, f *fixture) string {
			return powerParams("shutdown", answer(`eyJnIjoibG9jYWwifQ.AAAA`, approveYes))
		}, TagDenied},
		{"expired state", func(t *testing.T, f *fixture) string {
			s := ask(t, f, "shutdown")
			f.advance(3 * time.Minute)
			return powerParams("shutdown", answer(s, approveYes))
		}, TagDenied},
		{"round trip on a tool without client approval", func(t *testing.T, f *fixture) string {
			return `"name":"vm_status","arguments":{"vm":"lab/vm1"},` + answer(ask(t, f, "shutdown"), approveYes)
		}, TagInvalid},
		{"unknown param next to a round trip", func(t *testing.T, f *fixture) string {
			return powerParams("shutdown", answer(ask(t, f, "shutdown"), approveYes)+`,"approved":true`)
		}, TagInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{policy: clientApprovalPolicy})
			r := sendRaw(t, f, "local", tt.params(t, f))
			if !r.Result.IsError || !strings.HasPrefix(r.Text(), tt.wantTag+" ") {
				t.Errorf("call = %q (%+v); want %s", r.Text(), r.Result, tt.wantTag)
			}
			if n := f.calls.Load(); n != 0 {
				t.Errorf("driver calls = %d; want 0", n)
			}
		})
	}
}

// TestClientApprovalOtherGrant: a state issued to one grant does not work
// for another, even with a policy that asks the client too.
func TestClientApprovalStateBoundToGrant(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: clientApprovalPolicy})
	state := ask(t, f, "shutdown")
	if _, err := f.s.elicitStates.open(state, "other", "vm_power", argsDigest("vm_power", map[string]any{"vm": "lab/vm1", "action": "shutdown"}), time.Unix(0, f.now.Load())); err == nil {
		t.Errorf("openState for grant other succeeded; want ErrBadRequestState")
	}
	if _, err := f.s.elicitStates.open(state, "local", "vm_power", argsDigest("vm_power", map[string]any{"vm": "lab/vm1", "action": "shutdown"}), time.Unix(0, f.now.Load())); err != nil {
		t.Errorf("openState for its own call = %v; want nil", err)
	}
}

// clientExecPolicy asks the client's user before every command.
const clientExecPolicy = `{"version":"1","default":"allow","tools":{"vm_agent_exec":{"action":"approve","approval":{"channel":"client","ttl":"2m"}}}}`

// clientExecArgs is the arguments of a command whose shell is shell.
func clientExecArgs(shell string) string {
	b, _ := json.Marshal(map[string]any{"vm": "lab/vm1", "shell": shell, "stdin": "first line\nsecond line", "env": map[string]string{"MODE": "rotate"}})
	return string(b)
}

// askedMessage makes a call whose arguments are args and returns the
// message of the approval the client's user is asked, over the 2026-07-28
// round trip and over elicitation/create (a client older than it).
func askedMessage(t *testing.T, args string) (modern, legacy string) {
	t.Helper()
	f := newFixture(t, fixtureOpts{policy: clientExecPolicy})
	r := sendRaw(t, f, "local", `"name":"vm_agent_exec","arguments":`+args+`,`+modernMeta)
	in, ok := r.Result.InputRequests["approval"]
	if r.Result.ResultType != "input_required" || !ok {
		t.Fatalf("first call = %q (%+v); want input_required", r.Text(), r.Result)
	}
	modern, _ = in.Params["message"].(string)

	c := startElicitPeer(t, newFixture(t, fixtureOpts{policy: clientExecPolicy}), initElicit)
	c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"vm_agent_exec","arguments":` + args + `}}`)
	m := c.next(5 * time.Second)
	if m == nil || m["method"] != "elicitation/create" {
		t.Fatalf("first message = %v; want elicitation/create", m)
	}
	params, _ := m["params"].(map[string]any)
	legacy, _ = params["message"].(string)
	return modern, legacy
}

// Issue 29, finding 6: the client's user sees every argument in full, with
// the operator's escapes, and nothing that can hide a part of a value: a
// tail behind a run of spaces, line breaks, control characters,
// bidirectional and zero-width characters, odd spaces.
func TestClientApprovalShowsEveryArgument(t *testing.T) {
	pad := strings.Repeat(" ", 420)
	tests := []struct {
		name, shell string
		want        []string // in the message
	}{
		{"a tail behind 420 spaces", "echo 'routine log rotation'" + pad + "&& echo TAIL > /data/x",
			[]string{"echo 'routine log rotation'⟦420 spaces⟧&& echo TAIL > /data/x"}},
		{"a line that forges an argument", "true\n- shell (text, 4 bytes): true",
			[]string{`true\n- shell (text, 4 bytes): true`}},
		{"a carriage return and terminal escapes", "echo ok\r\x1b[2Krm -rf /data",
			[]string{`echo ok\x0d\x1b[2Krm -rf /data`}},
		{"bidi and zero-width", "echo safe # \u202e atad/ fr- mr\u200b",
			[]string{`echo safe # \u{202e} atad/ fr- mr\u{200b}`}},
		{"odd spaces and tabs", "echo a\u00a0b\u3000c\td",
			[]string{`echo a\u{00a0}b\u{3000}c\td`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			modern, legacy := askedMessage(t, clientExecArgs(tt.shell))
			for road, msg := range map[string]string{"2026-07-28": modern, "elicitation/create": legacy} {
				want := append(tt.want, "vm_agent_exec on lab/vm1",
					`first line\nsecond line`, // stdin in full, not its digest
					"- env.MODE (text, 6 bytes): rotate")
				for _, w := range want {
					if !strings.Contains(msg, w) {
						t.Errorf("%s: message %q; want it to show %q", road, msg, w)
					}
				}
				if strings.Contains(msg, "sha256:") || strings.Contains(msg, "   ") || strings.ContainsAny(msg, "\r\x1b\u202e\u200b\u00a0\u3000\t") {
					t.Errorf("%s: message %q holds a digest, a run of spaces or a character that hides", road, msg)
				}
				if lines := strings.Count(msg, "\n- "); lines != 4 {
					t.Errorf("%s: message has %d argument lines; want 4 (shell, stdin, vm, env.MODE)\n%s", road, lines, msg)
				}
			}
		})
	}
}

// Arguments that do not fit in full in the approval request are not asked
// about: the call is refused before anything runs, on both roads, and the
// refusal says to use the operator channel.
func TestClientApprovalRefusesWhatDoesNotFit(t *testing.T) {
	tests := []struct {
		name, shell string
	}{
		{"long", "echo " + strings.Repeat("a", maxApprovalMessage)},
		{"short, but long once shown", strings.Repeat("\u202e", maxApprovalMessage/4)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{policy: clientExecPolicy})
			args := clientExecArgs(tt.shell)
			r := sendRaw(t, f, "local", `"name":"vm_agent_exec","arguments":`+args+`,`+modernMeta)
			legacy := f.send(t, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"vm_agent_exec","arguments":`+args+`}}`)
			for road, text := range map[string]string{"2026-07-28": r.Text(), "elicitation/create": legacy.Text()} {
				if !strings.HasPrefix(text, TagDenied+" ") || !strings.Contains(text, `approval channel "operator"`) || !strings.Contains(text, "nothing ran") {
					t.Errorf("%s: call = %q; want %s saying to use the operator channel", road, text, TagDenied)
				}
			}
			if r.Result.ResultType == "input_required" {
				t.Errorf("the client was asked: %+v", r.Result)
			}
			if n := f.calls.Load(); n != 0 {
				t.Errorf("driver calls = %d; want 0", n)
			}
			refused := 0
			for _, rec := range f.rec.Records() {
				if rec.Decision == "deny" && strings.Contains(rec.Reason, "too long to show in full") {
					refused++
				}
			}
			if refused != 2 {
				t.Errorf("%d audit records say the arguments were too long; want 2", refused)
			}
		})
	}
}
