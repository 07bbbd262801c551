package mcphttp

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

// openStream opens the GET stream of session sid and returns the data of
// its events, in order, as they come.
func openStream(t *testing.T, url, token, sid string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req := mcptest.Request(ctx, http.MethodGet, url, token, sid, "")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET stream = %v, %v; want 200", resp, err)
	}
	data := make(chan string, 64)
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				data <- d
			}
		}
	}()
	return data
}

// Over streamable HTTP, to a session's GET stream: notifications arrive
// at the level the session set and not below; tools/list_changed follows
// a reload that changes the grant's tools and not one that does not; a
// parked call's notification carries no file content; another grant's
// session hears nothing of it.
func TestHTTPLoggingAndToolsListChanged(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	_, url := sessionServer(t, f, Options{})
	sid := initialize(t, url, "local-token")
	otherSid := initialize(t, url, "other-token")
	for _, s := range []struct{ token, sid string }{{"local-token", sid}, {"other-token", otherSid}} {
		if r, _ := mcptest.Post(t, url, s.token, s.sid, `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"notice"}}`); r.Error != nil {
			t.Fatalf("logging/setLevel = %+v; want {}", r.Error)
		}
	}
	stream := openStream(t, url, "local-token", sid)
	otherStream := openStream(t, url, "other-token", otherSid)

	f.SetPolicy(t, "local", `{"version":"1","default":"allow","tools":{"vm_status":{"action":"allow","reason":"a"}}}`) // info: below notice
	f.SetPolicy(t, "local", `{"version":"1","default":"allow","hide":["vm_power"],"tools":{"vm_file_write":{"action":"approve"}}}`)
	for i, want := range []string{"notifications/message notice policy_reloaded", "notifications/tools/list_changed"} {
		if got, _ := mcptest.NextNote(t, stream); got != want {
			t.Fatalf("notification %d = %q; want %q (nothing of the info-level reload before it)", i, got, want)
		}
	}
	f.SetPolicy(t, "local", `{"version":"1","default":"allow","hide":["vm_power"],"tools":{"vm_file_write":{"action":"approve","reason":"b"}}}`) // info, tools unchanged

	const content = "file-s3cret-http"
	r, _ := mcptest.Post(t, url, "local-token", sid, mcptest.ToolCall(3, "vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"`+content+`"}`))
	if !mcptest.HasTag(r, catalog.TagApproval) {
		t.Fatalf("vm_file_write = %q; want %s", r.Text(), catalog.TagApproval)
	}
	got, raw := mcptest.NextNote(t, stream)
	if want := "notifications/message notice approval_pending"; got != want {
		t.Fatalf("after an unchanged reload and a parked call: %q; want %q (no list_changed)", got, want)
	}
	if strings.Contains(raw, content) || !strings.Contains(raw, `"content":"sha256:`) {
		t.Errorf("approval_pending = %s; want the content as its digest only", raw)
	}
	// The other grant's stream stays silent: a notice of its own reload
	// comes first.
	f.SetPolicy(t, "other", `{"version":"1","default":"allow","hide":["vm_power"]}`)
	if got, _ := mcptest.NextNote(t, otherStream); got != "notifications/message notice policy_reloaded" {
		t.Errorf("grant other's first notification = %q; want its own reload, nothing of grant local's", got)
	}
}
