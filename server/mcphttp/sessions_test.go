package mcphttp

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

// rawHTTP sends one request and returns its status, headers and body.
func rawHTTP(t *testing.T, method, url string, hdr map[string]string, body string) (int, http.Header, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// sessionServer serves f's HTTP handler with the given session limits.
func sessionServer(t *testing.T, f *servertest.Fixture, o Options) (*Handler, string) {
	t.Helper()
	h := New(f.S, o)
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return h, ts.URL + "/mcp"
}

func initialize(t *testing.T, url, token string) string {
	t.Helper()
	_, sid := mcptest.Post(t, url, token, "", mcptest.InitMsg)
	if sid == "" {
		t.Fatalf("initialize as %s gave no Mcp-Session-Id", token)
	}
	return sid
}

// pingStatus pings in session sid and returns the status and body.
func pingStatus(t *testing.T, url, token, sid string) (int, string) {
	t.Helper()
	st, _, body := rawHTTP(t, http.MethodPost, url, map[string]string{
		"Authorization": "Bearer " + token, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18",
	}, `{"jsonrpc":"2.0","id":9,"method":"ping"}`)
	return st, body
}

func wantLive(t *testing.T, url, token string, live, gone []string) {
	t.Helper()
	for _, sid := range live {
		if st, body := pingStatus(t, url, token, sid); st != http.StatusOK {
			t.Errorf("ping in live session %s = %d %q; want 200", sid, st, body)
		}
	}
	for _, sid := range gone {
		st, body := pingStatus(t, url, token, sid)
		if st != http.StatusNotFound || !strings.Contains(body, "initialize again") {
			t.Errorf("ping in dropped session %s = %d %q; want 404 saying to initialize again", sid, st, body)
		}
	}
}

// A grant's sessions beyond its cap evict its least recently used ones;
// using a session makes it recent.
func TestHTTPSessionsPerGrantCapEvictsLeastRecentlyUsed(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	h, url := sessionServer(t, f, Options{Sessions: SessionLimits{MaxPerGrant: 3, MaxTotal: 10}})
	a, b, c := initialize(t, url, "local-token"), initialize(t, url, "local-token"), initialize(t, url, "local-token")
	wantLive(t, url, "local-token", []string{a}, nil) // a is now the most recent
	d := initialize(t, url, "local-token")            // evicts b
	e := initialize(t, url, "local-token")            // evicts c
	wantLive(t, url, "local-token", []string{a, d, e}, []string{b, c})
	st := h.SessionStats()
	if st.Live != 3 || st.ByGrant["local"] != 3 || st.Evicted != 2 {
		t.Errorf("SessionStats() = %+v; want 3 live (all local), 2 evicted", st)
	}
}

// At the total cap, the grant holding the most sessions pays: another
// grant's sessions survive a flood.
func TestHTTPSessionsTotalCapEvictsFromTheBiggestGrant(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	h, url := sessionServer(t, f, Options{Sessions: SessionLimits{MaxPerGrant: 4, MaxTotal: 5}})
	o1, o2 := initialize(t, url, "other-token"), initialize(t, url, "other-token")
	var mine []string
	for range 20 {
		mine = append(mine, initialize(t, url, "local-token"))
	}
	wantLive(t, url, "other-token", []string{o1, o2}, nil)
	wantLive(t, url, "local-token", mine[len(mine)-3:], mine[:len(mine)-3])
	// Now "other" initializes at the total cap: "local" holds the most.
	o3 := initialize(t, url, "other-token")
	wantLive(t, url, "other-token", []string{o1, o2, o3}, nil)
	wantLive(t, url, "local-token", mine[len(mine)-2:], mine[:len(mine)-2])
	if st := h.SessionStats(); st.Live != 5 || st.ByGrant["local"] != 2 || st.ByGrant["other"] != 3 {
		t.Errorf("SessionStats() = %+v; want 5 live: local 2, other 3", st)
	}
}

// A session idle for longer than the limit is gone (and swept by the next
// initialize even if nobody uses it again); an open GET stream keeps its
// session alive, and dropping the session ends the stream.
func TestHTTPSessionsIdleAndStreams(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	h, url := sessionServer(t, f, Options{Sessions: SessionLimits{MaxPerGrant: 2, MaxTotal: 10, Idle: time.Minute}})
	idle := initialize(t, url, "local-token")
	streaming := initialize(t, url, "local-token")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer local-token")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", streaming)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET stream = %v, %v; want 200", resp, err)
	}
	defer resp.Body.Close()
	f.Advance(2 * time.Minute)
	other := initialize(t, url, "other-token") // sweeps
	if st := h.SessionStats(); st.Live != 2 || st.Expired != 1 {
		t.Errorf("SessionStats() after the idle time = %+v; want 2 live (the streaming one and other's), 1 expired", st)
	}
	wantLive(t, url, "local-token", []string{streaming}, []string{idle})
	wantLive(t, url, "other-token", []string{other}, nil)
	// Two new sessions of "local" (cap 2) evict the streaming one: its
	// stream ends.
	initialize(t, url, "local-token")
	initialize(t, url, "local-token")
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, bufio.NewReader(resp.Body))
		ended <- err
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the GET stream of an evicted session is still open 10 s later")
	}
	wantLive(t, url, "local-token", nil, []string{streaming})
}

// A 2026-07-28 client needs no session: it calls without initialize and
// leaves nothing in the registry.
func TestHTTPStatelessClientsNeedNoSession(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	h, url := sessionServer(t, f, Options{})
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`
	for i := range 50 {
		body := `{"jsonrpc":"2.0","id":` + strconv.Itoa(i+1) + `,"method":"tools/call","params":{"name":"list_vms","arguments":{},` + meta + `}}`
		st, _, got := rawHTTP(t, http.MethodPost, url, map[string]string{
			"Authorization": "Bearer local-token", "Mcp-Protocol-Version": "2026-07-28",
			"Mcp-Method": "tools/call", "Mcp-Name": "list_vms",
		}, body)
		if st != http.StatusOK || !strings.Contains(got, `"vms"`) || strings.Contains(got, `"isError":true`) {
			t.Fatalf("stateless list_vms = %d %.300s; want 200 with the VMs", st, got)
		}
	}
	if st := h.SessionStats(); st.Live != 0 {
		t.Errorf("SessionStats() after 50 stateless calls = %+v; want no session", st)
	}
}

// A legacy call without a session goes through the gate (refused and
// audited when malformed) and runs nowhere; one in a session this handler
// does not hold is refused before the gate.
func TestHTTPSessionRequired(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	_, url := sessionServer(t, f, Options{})
	hdr := map[string]string{"Authorization": "Bearer local-token"}
	st, _, body := rawHTTP(t, http.MethodPost, url, hdr, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"vm_status","arguments":{"vm":"lab/vm1","vm":"lab/vm2"}}}`)
	if st != http.StatusOK || !strings.Contains(body, catalog.TagInvalid) {
		t.Errorf("malformed tools/call without a session = %d %q; want the gate's %s", st, body, catalog.TagInvalid)
	}
	st, _, body = rawHTTP(t, http.MethodPost, url, hdr, mcptest.ToolCall(2, "vm_status", `{"vm":"lab/vm1"}`))
	if st != http.StatusNotFound {
		t.Errorf("tools/call without a session = %d %q; want 404", st, body)
	}
	n := len(f.Rec.Records())
	hdr["Mcp-Session-Id"] = "mcp-session-NOTMINE"
	st, _, body = rawHTTP(t, http.MethodPost, url, hdr, mcptest.ToolCall(3, "vm_status", `{"vm":"lab/vm1"}`))
	if st != http.StatusNotFound || !strings.Contains(body, "initialize again") {
		t.Errorf("tools/call in an unknown session = %d %q; want 404 saying to initialize again", st, body)
	}
	if got := len(f.Rec.Records()) - n; got != 0 {
		t.Errorf("%d audit records for a call in an unknown session; want 0 (refused before the gate)", got)
	}
	if c := f.Calls.Load(); c != 0 {
		t.Errorf("%d driver calls; want 0", c)
	}
}
