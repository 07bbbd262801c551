package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const initMsg = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}`

func TestHTTPAuth(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.s.httpOpts.AllowedOrigins = []string{"http://localhost:6274"}
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	tests := []struct {
		name   string
		url    string
		header map[string][]string
		want   int
	}{
		{"no token", "/mcp", nil, http.StatusUnauthorized},
		{"wrong token", "/mcp", map[string][]string{"Authorization": {"Bearer nope"}}, http.StatusUnauthorized},
		{"not bearer", "/mcp", map[string][]string{"Authorization": {"Basic bG9jYWwtdG9rZW4="}}, http.StatusUnauthorized},
		{"two Authorization headers", "/mcp", map[string][]string{"Authorization": {"Bearer local-token", "Bearer other-token"}}, http.StatusBadRequest},
		{"token in the query", "/mcp?access_token=local-token", nil, http.StatusBadRequest},
		{"foreign Origin", "/mcp", map[string][]string{"Authorization": {"Bearer local-token"}, "Origin": {"http://evil.example"}}, http.StatusForbidden},
		{"foreign Host", "/mcp", map[string][]string{"Authorization": {"Bearer local-token"}, "Host": {"evil.example"}}, http.StatusForbidden},
		{"good token", "/mcp", map[string][]string{"Authorization": {"Bearer local-token"}}, http.StatusOK},
		{"good token, allowed Origin", "/mcp", map[string][]string{"Authorization": {"Bearer local-token"}, "Origin": {"http://localhost:6274"}}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := initStatus(t, ts.URL+tt.url, tt.header); got != tt.want {
				t.Errorf("status = %d; want %d", got, tt.want)
			}
		})
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("driver called %d times; want 0", n)
	}
}

// initStatus posts initialize to url with hdr ("Host" sets the Host) and
// returns the status.
func initStatus(t *testing.T, url string, hdr map[string][]string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(initMsg))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, vs := range hdr {
		if k == "Host" {
			req.Host = vs[0]
			continue
		}
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// post sends one JSON-RPC message over HTTP and returns the reply and the session id.
func post(t *testing.T, url, token, session, msg string) (rpcReply, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(msg))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %.80s: status %d: %s", msg, resp.StatusCode, body)
	}
	// An SSE reply carries the message in a data: line.
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for _, line := range strings.Split(string(body), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				body = []byte(d)
			}
		}
	}
	var r rpcReply
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("reply %.200q: %v", body, err)
	}
	return r, resp.Header.Get("Mcp-Session-Id")
}

func TestHTTPCallsGoThroughTheGate(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	url := ts.URL + "/mcp"
	_, sid := post(t, url, "other-token", "", initMsg)
	// Grant "other" sees only other/*.
	r, _ := post(t, url, "other-token", sid, toolCall(2, "list_vms", `{}`))
	vms, _ := r.Result.StructuredContent["vms"].([]any)
	if r.Result == nil || r.Result.IsError || len(vms) != 2 || vms[0].(map[string]any)["id"] != "other/vm1" {
		t.Fatalf("list_vms as other = %+v; want other/vm1 and other/vm2", r.Result)
	}
	r, _ = post(t, url, "other-token", sid, toolCall(3, "vm_status", `{"vm":"lab/vm1"}`))
	if !hasTag(r, TagUnknownVM) {
		t.Errorf("vm_status of lab/vm1 as other = %q; want %s", r.text(), TagUnknownVM)
	}
	r, _ = post(t, url, "other-token", sid, toolCall(4, "kill_process", `{"vm":"other/vm1","pid":1,"pid":2}`))
	if !hasTag(r, TagInvalid) {
		t.Errorf("duplicate pid over HTTP = %q; want %s", r.text(), TagInvalid)
	}
	recs := f.rec.records()
	if len(recs) < 3 || recs[len(recs)-1].Transport != "http" || recs[len(recs)-1].Grant != "other" {
		t.Errorf("audit records = %+v; want http records of grant other", recs)
	}
}

func TestServeStdio(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: `{"version":"1","default":"allow","hide":["vm_power"]}`})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- f.s.ServeStdio(context.Background(), inR, outW); outW.Close() }()
	replies := bufio.NewScanner(outR)
	replies.Buffer(nil, 1<<20)
	exchange := func(msg string) rpcReply {
		t.Helper()
		if _, err := io.WriteString(inW, msg+"\n"); err != nil {
			t.Fatalf("write: %v", err)
		}
		if !replies.Scan() {
			t.Fatalf("no reply to %.80s: %v", msg, replies.Err())
		}
		var r rpcReply
		if err := json.Unmarshal(replies.Bytes(), &r); err != nil {
			t.Fatalf("reply %q: %v", replies.Bytes(), err)
		}
		return r
	}
	if r := exchange(initMsg); r.Result == nil {
		t.Fatalf("initialize = %+v", r.Error)
	}
	io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
	r := exchange(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if r.Result == nil || len(r.Result.Tools) != 20 {
		t.Errorf("tools/list has %d tools; want 20 (vm_power hidden)", len(r.Result.Tools))
	}
	if r := exchange(toolCall(3, "vm_status", `{"vm":"lab/vm1"}`)); r.Result == nil || r.Result.IsError || r.Result.StructuredContent["state"] != "running" {
		t.Errorf("vm_status = %q; want running", r.text())
	}
	if r := exchange(toolCall(4, "vm_status", `{"vm":"lab/vm1","vm":"lab/vm2"}`)); !hasTag(r, TagInvalid) {
		t.Errorf("duplicate key over stdio = %q; want %s", r.text(), TagInvalid)
	}
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ServeStdio = %v; want nil at EOF", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeStdio did not return at EOF")
	}
}
