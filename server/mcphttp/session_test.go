package mcphttp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

// httpStatus sends one request and returns its status (a GET stream is
// closed as soon as its headers arrive).
func httpStatus(t *testing.T, method, url, token, session, body string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(mcptest.Request(ctx, method, url, token, session, body))
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	if method != http.MethodGet {
		io.Copy(io.Discard, resp.Body)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Session ids are the server's: a forged one, another grant's, one that
// was terminated or idled out are all unknown (404) on POST, GET and
// DELETE, and nothing reaches the driver through them.
func TestHTTPSessionIDsAreIssuedAndBoundToTheirGrant(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	ts := httptest.NewServer(New(f.S, Options{}))
	defer ts.Close()
	url := ts.URL + "/mcp"
	_, mine := mcptest.Post(t, url, "local-token", "", mcptest.InitMsg)
	_, theirs := mcptest.Post(t, url, "other-token", "", mcptest.InitMsg)
	if mine == "" || theirs == "" || mine == theirs {
		t.Fatalf("session ids %q and %q; want two distinct ids", mine, theirs)
	}
	call := mcptest.ToolCall(2, "list_vms", `{}`) // both grants may call it: the gate lets it through to the session check
	if r, _ := mcptest.Post(t, url, "local-token", mine, call); r.Result == nil || r.Result.IsError {
		t.Fatalf("list_vms in my own session = %q (%+v); want a result", r.Text(), r.Error)
	}
	before := f.Calls.Load()
	forged := "mcp-session-00000000-0000-0000-0000-000000000000"
	tests := []struct {
		name, method, token, session string
		want                         int
	}{
		{"forged well-formed id", http.MethodPost, "local-token", forged, http.StatusNotFound},
		{"malformed id", http.MethodPost, "local-token", "../../etc/passwd", http.StatusNotFound},
		{"another grant's id", http.MethodPost, "local-token", theirs, http.StatusNotFound},
		{"my id with another grant's token", http.MethodPost, "other-token", mine, http.StatusNotFound},
		{"GET with a forged id", http.MethodGet, "local-token", forged, http.StatusNotFound},
		{"GET with another grant's id", http.MethodGet, "other-token", mine, http.StatusNotFound},
		{"GET without an id", http.MethodGet, "local-token", "", http.StatusBadRequest},
		{"DELETE of another grant's id", http.MethodDelete, "other-token", mine, http.StatusNotFound},
		{"DELETE of a forged id", http.MethodDelete, "local-token", forged, http.StatusNotFound},
	}
	for _, tt := range tests {
		body := call
		if tt.method != http.MethodPost {
			body = ""
		}
		if got := httpStatus(t, tt.method, url, tt.token, tt.session, body); got != tt.want {
			t.Errorf("%s: %s = %d; want %d", tt.name, tt.method, got, tt.want)
		}
	}
	if n := f.Calls.Load() - before; n != 0 {
		t.Errorf("the driver was called %d times through refused sessions; want 0", n)
	}
	// The refusals left the sessions alone.
	if got := httpStatus(t, http.MethodGet, url, "local-token", mine, ""); got != http.StatusOK {
		t.Errorf("GET in my own session = %d; want 200", got)
	}
	if r, _ := mcptest.Post(t, url, "other-token", theirs, mcptest.ToolCall(3, "vm_status", `{"vm":"other/vm1"}`)); r.Result == nil || r.Result.IsError {
		t.Errorf("vm_status in the other grant's own session = %q; want a result", r.Text())
	}
	// Terminated: unknown from then on.
	if got := httpStatus(t, http.MethodDelete, url, "local-token", mine, ""); got != http.StatusOK {
		t.Errorf("DELETE of my own session = %d; want 200", got)
	}
	if got := httpStatus(t, http.MethodPost, url, "local-token", mine, call); got != http.StatusNotFound {
		t.Errorf("POST after DELETE = %d; want 404", got)
	}
	// Idled out: unknown too.
	f.Advance(DefaultSessionIdle + time.Second)
	if got := httpStatus(t, http.MethodPost, url, "other-token", theirs, call); got != http.StatusNotFound {
		t.Errorf("POST in a session idle for %v = %d; want 404", DefaultSessionIdle+time.Second, got)
	}
}
