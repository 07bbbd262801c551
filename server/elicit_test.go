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

func (r elicitReply) text() string {
	if len(r.Result.Content) == 0 {
		return ""
	}
	return r.Result.Content[0].Text
}

func sendRaw(t *testing.T, f *fixture, grant, params string) elicitReply {
	t.Helper()
	raw := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{` + params + `}}`
	out := f.s.handle(context.Background(), &conn{grant: f.s.grants[grant], transport: "stdio"}, []byte(raw))
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
	state := ask(t, f, "reboot")
	if n := f.calls.Load(); n != 0 {
		t.Fatalf("driver calls before the answer = %d; want 0", n)
	}
	r := sendRaw(t, f, "local", powerParams("reboot", answer(state, approveYes)))
	if r.Result.IsError || r.Result.ResultType == "input_required" {
		t.Fatalf("approved retry = %q (%+v); want success", r.text(), r.Result)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("driver calls after the approved retry = %d; want 1", n)
	}
	// The same state again: single use.
	r = sendRaw(t, f, "local", powerParams("reboot", answer(state, approveYes)))
	if !r.Result.IsError || !strings.HasPrefix(r.text(), TagDenied+" ") {
		t.Errorf("replayed state = %q; want %s", r.text(), TagDenied)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("driver calls after the replay = %d; want 1", n)
	}
	var asked, approved bool
	for _, rec := range f.rec.records() {
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
		{"legacy client", func(t *testing.T, f *fixture) string { return powerParams("reboot", "") }, TagDenied},
		{"no elicitation capability", func(t *testing.T, f *fixture) string {
			return powerParams("reboot", `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`)
		}, TagDenied},
		{"decline", func(t *testing.T, f *fixture) string {
			return powerParams("reboot", answer(ask(t, f, "reboot"), `{"action":"decline"}`))
		}, TagDenied},
		{"cancel", func(t *testing.T, f *fixture) string {
			return powerParams("reboot", answer(ask(t, f, "reboot"), `{"action":"cancel"}`))
		}, TagDenied},
		{"accept without approve", func(t *testing.T, f *fixture) string {
			return powerParams("reboot", answer(ask(t, f, "reboot"), `{"action":"accept","content":{"approve":false}}`))
		}, TagDenied},
		{"approve as string", func(t *testing.T, f *fixture) string {
			return powerParams("reboot", answer(ask(t, f, "reboot"), `{"action":"accept","content":{"approve":"true"}}`))
		}, TagDenied},
		{"no answer", func(t *testing.T, f *fixture) string {
			return powerParams("reboot", fmt.Sprintf(`%s,"requestState":%q`, modernMeta, ask(t, f, "reboot")))
		}, TagDenied},
		{"state of other arguments", func(t *testing.T, f *fixture) string {
			return powerParams("stop", answer(ask(t, f, "reboot"), approveYes))
		}, TagDenied},
		{"tampered state", func(t *testing.T, f *fixture) string {
			return powerParams("reboot", answer(tamper(ask(t, f, "reboot")), approveYes))
		}, TagDenied},
		{"forged state", func(t *testing.T, f *fixture) string {
			return powerParams("reboot", answer(`eyJnIjoibG9jYWwifQ.AAAA`, approveYes))
		}, TagDenied},
		{"expired state", func(t *testing.T, f *fixture) string {
			s := ask(t, f, "reboot")
			f.advance(3 * time.Minute)
			return powerParams("reboot", answer(s, approveYes))
		}, TagDenied},
		{"round trip on a tool without client approval", func(t *testing.T, f *fixture) string {
			return `"name":"vm_status","arguments":{"vm":"lab/vm1"},` + answer(ask(t, f, "reboot"), approveYes)
		}, TagInvalid},
		{"unknown param next to a round trip", func(t *testing.T, f *fixture) string {
			return powerParams("reboot", answer(ask(t, f, "reboot"), approveYes)+`,"approved":true`)
		}, TagInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{policy: clientApprovalPolicy})
			r := sendRaw(t, f, "local", tt.params(t, f))
			if !r.Result.IsError || !strings.HasPrefix(r.text(), tt.wantTag+" ") {
				t.Errorf("call = %q (%+v); want %s", r.text(), r.Result, tt.wantTag)
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
	state := ask(t, f, "reboot")
	if _, err := openState(state, "other", "vm_power", argsDigest("vm_power", map[string]any{"vm": "lab/vm1", "action": "reboot"}), time.Unix(0, f.now.Load())); err == nil {
		t.Errorf("openState for grant other succeeded; want ErrBadRequestState")
	}
	if _, err := openState(state, "local", "vm_power", argsDigest("vm_power", map[string]any{"vm": "lab/vm1", "action": "reboot"}), time.Unix(0, f.now.Load())); err != nil {
		t.Errorf("openState for its own call = %v; want nil", err)
	}
}
