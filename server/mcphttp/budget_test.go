package mcphttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

// Every request of a grant counts against its budget, initialize
// included; beyond it, a tools/call gets a [RATE LIMITED] tool result and
// anything else a JSON-RPC error, with 429 and Retry-After, and nothing
// reaches the gate, the audit log or the driver. Another grant keeps its
// own budget; the window slides.
func TestHTTPRequestBudget(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	grantOf(t, f, "other").RequestsPerMinute = 100
	h, url := sessionServer(t, f, Options{RequestsPerMinute: 4})
	sid := initialize(t, url, "local-token") // 1
	if st, _ := pingStatus(t, url, "local-token", sid); st != http.StatusOK {
		t.Fatalf("ping within the budget = %d; want 200", st)
	}
	mcptest.Post(t, url, "local-token", sid, mcptest.ToolCall(2, "list_vms", `{}`)) // 3
	if st, _ := pingStatus(t, url, "local-token", sid); st != http.StatusOK {
		t.Fatalf("4th request = %d; want 200", st)
	}
	recs, calls := len(f.Rec.Records()), f.Calls.Load()
	hdr := map[string]string{"Authorization": "Bearer local-token", "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}

	st, rh, body := rawHTTP(t, http.MethodPost, url, hdr, `{"jsonrpc":"2.0","id":"p1","method":"ping"}`)
	var rpc struct {
		ID    string `json:"id"`
		Error struct {
			Code    int            `json:"code"`
			Message string         `json:"message"`
			Data    map[string]any `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &rpc); err != nil || st != http.StatusTooManyRequests || rpc.ID != "p1" ||
		rpc.Error.Code != codeRateLimited || !strings.HasPrefix(rpc.Error.Message, catalog.TagRateLimited+" ") || rpc.Error.Data["retry_after_s"] == nil {
		t.Errorf("ping over the budget = %d %q (%v); want 429 and a JSON-RPC error %d %s with retry_after_s, id p1", st, body, err, codeRateLimited, catalog.TagRateLimited)
	}
	if secs, err := strconv.Atoi(rh.Get("Retry-After")); err != nil || secs < 1 || secs > 60 {
		t.Errorf("Retry-After = %q; want 1..60 seconds", rh.Get("Retry-After"))
	}

	st, _, body = rawHTTP(t, http.MethodPost, url, hdr, mcptest.ToolCall(7, "vm_status", `{"vm":"lab/vm1"}`))
	var res mcptest.Reply
	if err := json.Unmarshal([]byte(body), &res); err != nil || st != http.StatusOK || res.Result == nil || !res.Result.IsError ||
		!strings.HasPrefix(res.Text(), catalog.TagRateLimited+" ") || !strings.Contains(res.Text(), "retry in ") || string(res.ID) != "7" {
		t.Errorf("tools/call over the budget = %d %q; want 200 with a %s tool error saying when to retry, id 7", st, body, catalog.TagRateLimited)
	}

	if st, _, body := rawHTTP(t, http.MethodPost, url, map[string]string{"Authorization": "Bearer local-token"}, mcptest.InitMsg); st != http.StatusTooManyRequests {
		t.Errorf("initialize over the budget = %d %q; want 429", st, body)
	}
	if st, _, _ := rawHTTP(t, http.MethodDelete, url, hdr, ""); st != http.StatusTooManyRequests {
		t.Errorf("DELETE over the budget = %d; want 429", st)
	}
	if got := h.SessionStats().Live; got != 1 {
		t.Errorf("%d live sessions; want 1 (the refused initialize made none)", got)
	}
	if n, c := len(f.Rec.Records())-recs, f.Calls.Load()-calls; n != 0 || c != 0 {
		t.Errorf("refused requests wrote %d audit records and made %d driver calls; want none", n, c)
	}

	// Another grant has its own budget.
	other := initialize(t, url, "other-token")
	if st, _ := pingStatus(t, url, "other-token", other); st != http.StatusOK {
		t.Errorf("other grant's ping = %d; want 200", st)
	}
	// The window slides: a minute after the first requests, room again.
	f.Advance(time.Minute + time.Second)
	if st, body := pingStatus(t, url, "local-token", sid); st != http.StatusOK {
		t.Errorf("ping a minute later = %d %q; want 200", st, body)
	}
}

func TestRequestBudgetWindowIsExact(t *testing.T) {
	b := newRequestBudget()
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		if _, ok, _, _ := b.take("g", 3, t0.Add(time.Duration(i)*time.Second)); !ok {
			t.Fatalf("take %d within the budget refused", i)
		}
	}
	tests := []struct {
		at        time.Duration
		ok        bool
		wantRetry time.Duration
	}{
		{10 * time.Second, false, 50 * time.Second},
		{time.Minute - time.Nanosecond, false, time.Nanosecond},
		{time.Minute, true, 0},                                              // the first left the window
		{time.Minute + 500*time.Millisecond, false, 500 * time.Millisecond}, // the second leaves at 61 s
		{time.Minute + time.Second, true, 0},
	}
	for _, tt := range tests {
		retry, ok, _, _ := b.take("g", 3, t0.Add(tt.at))
		if ok != tt.ok || retry != tt.wantRetry {
			t.Errorf("take(at %v) = %v, %v; want %v, %v", tt.at, retry, ok, tt.wantRetry, tt.ok)
		}
	}
}
