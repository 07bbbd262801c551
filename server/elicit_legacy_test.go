package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/audit/audittest"
	"github.com/vmgate/vmgate/server/mcptest"
)

// legacyApprovalPolicy asks the client before vm_power, gives the user one
// second to answer and counts calls, so a denial shows as a refund.
const legacyApprovalPolicy = `{"version":"1","default":"allow","tools":{"vm_power":{"action":"approve","approval":{"channel":"client","ttl":"1s"},
 "limits":[{"counter":"power","window":"minute","max":100,"scope":"grant"}]}}}`

const initElicit = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{}},"clientInfo":{"name":"test","version":"1"}}}`

// elicitPeer drives ServeStdio through pipes, one JSON-RPC line at a time.
type elicitPeer struct {
	t     *testing.T
	in    *io.PipeWriter
	lines chan map[string]any
}

func startElicitPeer(t *testing.T, f *fixture, init string) *elicitPeer {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- serveStdio(ctx, f.s, "local", inR, outW)
		outW.Close()
	}()
	c := &elicitPeer{t: t, in: inW, lines: make(chan map[string]any, 16)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m = map[string]any{"unparsable": sc.Text()}
			}
			c.lines <- m
		}
	}()
	t.Cleanup(func() {
		inW.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ServeStdio = %v; want nil", err)
		}
		for range c.lines {
		}
	})
	c.send(init)
	if m := c.next(5 * time.Second); m["id"] != float64(1) || m["result"] == nil {
		t.Fatalf("initialize reply = %v; want a result", m)
	}
	c.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return c
}

func (c *elicitPeer) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		c.t.Fatalf("write %q: %v", line, err)
	}
}

// next returns the next message from the server, or nil after wait.
func (c *elicitPeer) next(wait time.Duration) map[string]any {
	c.t.Helper()
	select {
	case m := <-c.lines:
		return m
	case <-time.After(wait):
		return nil
	}
}

const powerCall = `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"vm_power","arguments":{"vm":"lab/vm1","action":"shutdown"}}}`

// callRecords are the audit records of one call, by kind.
func callRecords(recs []audit.Record, tool string) (decisions []audit.Record, outcome *audit.Record) {
	for i, r := range recs {
		if r.Tool != tool {
			continue
		}
		if r.Kind == audit.KindOutcome {
			outcome = &recs[i]
			continue
		}
		decisions = append(decisions, r)
	}
	return decisions, outcome
}

// settledRecords is callRecords once the outcome record of tool is there
// (at most 5 s): over HTTP the client may read the response before the
// gate has settled the call.
func settledRecords(r *audittest.Recorder, tool string) (decisions []audit.Record, outcome *audit.Record) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		decisions, outcome = callRecords(r.Records(), tool)
		if outcome != nil || time.Now().After(deadline) {
			return decisions, outcome
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLegacyClientApprovalStdio(t *testing.T) {
	rawID := func(req map[string]any) string { b, _ := json.Marshal(req["id"]); return string(b) }
	respond := func(result string) func(map[string]any) string {
		return func(req map[string]any) string {
			return `{"jsonrpc":"2.0","id":` + rawID(req) + `,"result":` + result + `}`
		}
	}
	tests := []struct {
		name       string
		init       string
		answer     func(req map[string]any) string // nil: never answer
		wantAsked  bool
		wantRun    bool
		wantReason string // of the second decision record
	}{
		{"accept approve", initElicit, respond(`{"action":"accept","content":{"approve":true}}`), true, true, "approved by the client's user through elicitation/create"},
		{"decline", initElicit, respond(`{"action":"decline"}`), true, false, "client approval: decline"},
		{"cancel", initElicit, respond(`{"action":"cancel"}`), true, false, "client approval: cancel"},
		{"accept without approve", initElicit, respond(`{"action":"accept","content":{"approve":false}}`), true, false, "client approval: accept"},
		{"approve as a string", initElicit, respond(`{"action":"accept","content":{"approve":"true"}}`), true, false, "client approval: accept"},
		{"accept without content", initElicit, respond(`{"action":"accept"}`), true, false, "client approval: accept"},
		{"garbage result", initElicit, respond(`{"hello":"world"}`), true, false, "client approval: elicitation/create: stdio: malformed result: no action"},
		{"result not an object", initElicit, respond(`"accept"`), true, false, "client approval: elicitation/create: stdio: malformed result: no action"},
		{"duplicate keys", initElicit, func(req map[string]any) string {
			return `{"jsonrpc":"2.0","id":` + rawID(req) + `,"result":{"action":"decline","action":"accept","content":{"approve":true}}}`
		}, true, false, "client approval: elicitation/create: stdio: malformed response: malformed JSON at byte 62: duplicate key \"action\""},
		{"error response", initElicit, func(req map[string]any) string {
			return `{"jsonrpc":"2.0","id":` + rawID(req) + `,"error":{"code":-32601,"message":"no"}}`
		}, true, false, "client approval: elicitation/create: stdio: the client answered with an error"},
		{"neither result nor error", initElicit, func(req map[string]any) string {
			return `{"jsonrpc":"2.0","id":` + rawID(req) + `}`
		}, true, false, "client approval: elicitation/create: stdio: malformed response: neither result nor error"},
		{"error not an object", initElicit, func(req map[string]any) string {
			return `{"jsonrpc":"2.0","id":` + rawID(req) + `,"error":"no"}`
		}, true, false, "client approval: elicitation/create: stdio: malformed response"},
		{"never", initElicit, nil, true, false, "client approval: no answer in time"},
		{"no capability", mcptest.InitMsg, nil, false, false, "client approval: the client has no elicitation capability"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{policy: legacyApprovalPolicy})
			c := startElicitPeer(t, f, tt.init)
			c.send(fmt.Sprintf(powerCall, 2))
			m := c.next(5 * time.Second)
			asked := m != nil && m["method"] == "elicitation/create"
			if asked != tt.wantAsked {
				t.Fatalf("first message = %v; want an elicitation/create request: %v", m, tt.wantAsked)
			}
			if asked {
				params, _ := m["params"].(map[string]any)
				if msg, _ := params["message"].(string); !strings.Contains(msg, "vm_power on lab/vm1") || params["requestedSchema"] == nil {
					t.Errorf("elicitation params = %v; want a message naming vm_power on lab/vm1 and a schema", params)
				}
				if n := f.calls.Load(); n != 0 {
					t.Errorf("driver calls before the answer = %d; want 0", n)
				}
				if tt.answer != nil {
					c.send(tt.answer(m))
				}
				m = c.next(5 * time.Second)
			}
			res, _ := m["result"].(map[string]any)
			if m["id"] != float64(2) || res == nil {
				t.Fatalf("reply = %v; want the result of call 2", m)
			}
			isErr, _ := res["isError"].(bool)
			text := fmt.Sprint(res["content"])
			if tt.wantRun == isErr || !tt.wantRun && !strings.Contains(text, TagDenied) {
				t.Errorf("result = %v; want run=%v (else %s)", res, tt.wantRun, TagDenied)
			}
			if n, want := f.calls.Load(), map[bool]int64{true: 1, false: 0}[tt.wantRun]; n != want {
				t.Errorf("driver calls = %d; want %d", n, want)
			}
			decisions, outcome := callRecords(f.rec.Records(), "vm_power")
			if len(decisions) != 2 || decisions[0].Decision != "approve" || decisions[0].ApprovalID != "client" {
				t.Fatalf("decision records = %+v; want approve (asking) then the answer", decisions)
			}
			wantDecision := map[bool]string{true: "allow", false: "deny"}[tt.wantRun]
			if d := decisions[1]; d.Decision != wantDecision || !strings.HasPrefix(d.Reason, tt.wantReason) || d.CallID != decisions[0].CallID {
				t.Errorf("answer record = %s %q (call %s); want %s %q… (call %s)", d.Decision, d.Reason, d.CallID, wantDecision, tt.wantReason, decisions[0].CallID)
			}
			if outcome == nil || outcome.Refunded == tt.wantRun {
				t.Errorf("outcome record = %+v; want refunded=%v", outcome, !tt.wantRun)
			}
		})
	}
}

// TestLegacyClientApprovalSingleUse: an approval lets exactly one call
// run; the identical call is asked again, and the answer to a request
// that is no longer pending does not approve anything.
func TestLegacyClientApprovalSingleUse(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: legacyApprovalPolicy})
	c := startElicitPeer(t, f, initElicit)
	c.send(fmt.Sprintf(powerCall, 2))
	req := c.next(5 * time.Second)
	id, _ := json.Marshal(req["id"])
	approve := `{"jsonrpc":"2.0","id":` + string(id) + `,"result":{"action":"accept","content":{"approve":true}}}`
	c.send(approve)
	if m := c.next(5 * time.Second); m["id"] != float64(2) {
		t.Fatalf("reply = %v; want the result of call 2", m)
	}
	c.send(fmt.Sprintf(powerCall, 3))
	req2 := c.next(5 * time.Second)
	if req2["method"] != "elicitation/create" || fmt.Sprint(req2["id"]) == fmt.Sprint(req["id"]) {
		t.Fatalf("second call's first message = %v; want a new elicitation/create (not id %v)", req2, req["id"])
	}
	c.send(approve) // the old answer again: not for this request
	m := c.next(5 * time.Second)
	res, _ := m["result"].(map[string]any)
	if m["id"] != float64(3) || res["isError"] != true {
		t.Fatalf("reply = %v; want call 3 denied after no answer", m)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("driver calls = %d; want 1", n)
	}
}

// elicitFunc is an mcp-go client's elicitation handler.
type elicitFunc func(context.Context, mcp.ElicitationRequest) (*mcp.ElicitationResult, error)

func (f elicitFunc) Elicit(ctx context.Context, r mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	return f(ctx, r)
}

func TestLegacyClientApprovalHTTP(t *testing.T) {
	answer := func(action string, content any) elicitFunc {
		return func(context.Context, mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
			return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseAction(action), Content: content}}, nil
		}
	}
	tests := []struct {
		name       string
		handler    elicitFunc // nil: the client declares no elicitation
		wantRun    bool
		wantReason string
	}{
		{"accept approve", answer("accept", map[string]any{"approve": true}), true, "approved by the client's user"},
		{"decline", answer("decline", nil), false, "client approval: decline"},
		{"cancel", answer("cancel", nil), false, "client approval: cancel"},
		{"accept without approve", answer("accept", map[string]any{"approve": false}), false, "client approval: accept"},
		{"client error", func(context.Context, mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
			return nil, errors.New("user interface broke")
		}, false, "client approval: elicitation/create"},
		{"never", func(ctx context.Context, _ mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, false, "client approval: no answer in time"},
		{"no capability", nil, false, "client approval: the client has no elicitation capability"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{policy: legacyApprovalPolicy})
			ts := httptest.NewServer(httpHandler(f.s))
			defer ts.Close()
			tr, err := transport.NewStreamableHTTP(ts.URL+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer local-token"}))
			if err != nil {
				t.Fatalf("NewStreamableHTTP: %v", err)
			}
			var asked atomic.Int32
			var opts []mcpclient.ClientOption
			if tt.handler != nil {
				opts = append(opts, mcpclient.WithElicitationHandler(elicitFunc(func(ctx context.Context, r mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
					asked.Add(1)
					if !strings.Contains(r.Params.Message, "vm_power on lab/vm1") {
						t.Errorf("elicitation message = %q; want it to name vm_power on lab/vm1", r.Params.Message)
					}
					return tt.handler(ctx, r)
				})))
			}
			c := mcpclient.NewClient(tr, opts...)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := c.Start(ctx); err != nil {
				t.Fatalf("Start: %v", err)
			}
			init := mcp.InitializeRequest{}
			init.Params.ProtocolVersion = "2025-06-18"
			init.Params.ClientInfo = mcp.Implementation{Name: "test", Version: "1"}
			if _, err := c.Initialize(ctx, init); err != nil {
				t.Fatalf("Initialize: %v", err)
			}
			req := mcp.CallToolRequest{}
			req.Params.Name = "vm_power"
			req.Params.Arguments = map[string]any{"vm": "lab/vm1", "action": "shutdown"}
			res, err := c.CallTool(ctx, req)
			if err != nil {
				t.Fatalf("CallTool: %v", err)
			}
			text := ""
			if len(res.Content) > 0 {
				if tc, ok := mcp.AsTextContent(res.Content[0]); ok {
					text = tc.Text
				}
			}
			if res.IsError == tt.wantRun || !tt.wantRun && !strings.HasPrefix(text, TagDenied) {
				t.Errorf("CallTool = %q (isError %v); want run=%v (else %s)", text, res.IsError, tt.wantRun, TagDenied)
			}
			if n, want := asked.Load(), map[bool]int32{true: 1, false: 0}[tt.handler != nil]; n != want {
				t.Errorf("client asked %d times; want %d", n, want)
			}
			if n, want := f.calls.Load(), map[bool]int64{true: 1, false: 0}[tt.wantRun]; n != want {
				t.Errorf("driver calls = %d; want %d", n, want)
			}
			decisions, outcome := settledRecords(f.rec, "vm_power")
			wantDecision := map[bool]string{true: "allow", false: "deny"}[tt.wantRun]
			if len(decisions) != 2 || decisions[0].Decision != "approve" || decisions[1].Decision != wantDecision ||
				!strings.HasPrefix(decisions[1].Reason, tt.wantReason) || decisions[1].Transport != "http" {
				t.Errorf("decision records = %+v; want approve then %s %q…", decisions, wantDecision, tt.wantReason)
			}
			if outcome == nil || outcome.Refunded == tt.wantRun {
				t.Errorf("outcome record = %+v; want refunded=%v", outcome, !tt.wantRun)
			}
		})
	}
}

// TestLegacyClientApprovalInputEnds: a client whose input ends while it is
// asked is denied at once, not after the approval's ttl.
func TestLegacyClientApprovalInputEnds(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: strings.Replace(legacyApprovalPolicy, `"ttl":"1s"`, `"ttl":"5m"`, 1)})
	c := startElicitPeer(t, f, initElicit)
	c.send(fmt.Sprintf(powerCall, 2))
	if m := c.next(5 * time.Second); m["method"] != "elicitation/create" {
		t.Fatalf("first message = %v; want elicitation/create", m)
	}
	c.in.Close()
	m := c.next(5 * time.Second)
	res, _ := m["result"].(map[string]any)
	if m["id"] != float64(2) || res["isError"] != true || !strings.Contains(fmt.Sprint(res["content"]), TagDenied) {
		t.Fatalf("reply = %v; want call 2 denied", m)
	}
	decisions, _ := callRecords(f.rec.Records(), "vm_power")
	if len(decisions) != 2 || !strings.Contains(decisions[1].Reason, "input ended") {
		t.Errorf("decision records = %+v; want a denial saying the input ended", decisions)
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("driver calls = %d; want 0", n)
	}
}
