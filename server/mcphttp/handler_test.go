package mcphttp

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

func TestHTTPAuth(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	ts := httptest.NewServer(New(f.S, Options{AllowedOrigins: []string{"http://localhost:6274"}}))
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
			if got := mcptest.InitStatus(t, ts.URL+tt.url, tt.header); got != tt.want {
				t.Errorf("status = %d; want %d", got, tt.want)
			}
		})
	}
	if n := f.Calls.Load(); n != 0 {
		t.Errorf("driver called %d times; want 0", n)
	}
}

func TestHTTPCallsGoThroughTheGate(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	ts := httptest.NewServer(New(f.S, Options{}))
	defer ts.Close()
	url := ts.URL + "/mcp"
	_, sid := mcptest.Post(t, url, "other-token", "", mcptest.InitMsg)
	// Grant "other" sees only other/*.
	r, _ := mcptest.Post(t, url, "other-token", sid, mcptest.ToolCall(2, "list_vms", `{}`))
	vms, _ := r.Result.StructuredContent["vms"].([]any)
	if r.Result == nil || r.Result.IsError || len(vms) != 2 || vms[0].(map[string]any)["id"] != "other/vm1" {
		t.Fatalf("list_vms as other = %+v; want other/vm1 and other/vm2", r.Result)
	}
	r, _ = mcptest.Post(t, url, "other-token", sid, mcptest.ToolCall(3, "vm_status", `{"vm":"lab/vm1"}`))
	if !mcptest.HasTag(r, catalog.TagUnknownVM) {
		t.Errorf("vm_status of lab/vm1 as other = %q; want %s", r.Text(), catalog.TagUnknownVM)
	}
	r, _ = mcptest.Post(t, url, "other-token", sid, mcptest.ToolCall(4, "kill_process", `{"vm":"other/vm1","pid":1,"pid":2}`))
	if !mcptest.HasTag(r, catalog.TagInvalid) {
		t.Errorf("duplicate pid over HTTP = %q; want %s", r.Text(), catalog.TagInvalid)
	}
	recs := f.Rec.Records()
	if len(recs) < 3 || recs[len(recs)-1].Transport != "http" || recs[len(recs)-1].Grant != "other" {
		t.Errorf("audit records = %+v; want http records of grant other", recs)
	}
}

// grantOf is the fixture's grant name, whose config a test changes before
// anything is served.
func grantOf(t testing.TB, f *servertest.Fixture, name string) *server.Grant {
	t.Helper()
	g, ok := f.S.Grant(name)
	if !ok {
		t.Fatalf("no grant %q", name)
	}
	return g
}
