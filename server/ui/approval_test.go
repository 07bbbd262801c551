package ui_test

import (
	"context"
	"html"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/ui"
)

// fakeApprovals serves a fixed list; its decisions are function fields.
type fakeApprovals struct {
	list      []store.Approval
	GrantFunc func(id string) (store.Approval, error)
}

func (f *fakeApprovals) List(context.Context) ([]store.Approval, error) { return f.list, nil }
func (f *fakeApprovals) Grant(_ context.Context, id, _, _ string) (store.Approval, error) {
	return f.GrantFunc(id)
}
func (f *fakeApprovals) Deny(_ context.Context, id, _, _ string) (store.Approval, error) {
	return f.GrantFunc(id)
}

// The page shows every argument the call will run with: stdin with its
// hidden characters escaped, env values, binary content as a hex dump; the
// list shows the first bytes and links to the page of the approval, which
// shows all of them.
func TestApprovalPagesShowTheArguments(t *testing.T) {
	now := time.Now()
	long := strings.Repeat("B", 5000) + "END-OF-STDIN"
	fa := &fakeApprovals{list: []store.Approval{
		{ID: "APPROVALONE", Grant: "agent", Tool: "vm_agent_exec", VM: "lab/vm1", State: store.ApprovalPending,
			Created: now, Expires: now.Add(time.Hour), TTL: time.Hour, Digest: "d",
			Args:     `{"command":["sh"],"stdin":"sha256:00,len:60","vm":"lab/vm1"}`,
			FullArgs: `{"command":["sh"],"env":{"TOKEN":"$(cat /etc/shadow)"},"stdin":"echo innocent\n\u001b[1A\u001b[2K\u202erm -rf /tmp/important <b>x</b>\n","vm":"lab/vm1"}`},
		{ID: "APPROVALTWO", Grant: "agent", Tool: "vm_file_write", VM: "lab/vm1", State: store.ApprovalPending,
			Created: now, Expires: now.Add(time.Hour), TTL: time.Hour, Digest: "e",
			FullArgs: `{"content_base64":"f0VMRgIBAQA=","path":"/usr/local/bin/x","vm":"lab/vm1"}`},
		{ID: "APPROVALLONG", Grant: "agent", Tool: "vm_agent_exec", VM: "lab/vm1", State: store.ApprovalPending,
			Created: now, Expires: now.Add(time.Hour), TTL: time.Hour, Digest: "f",
			FullArgs: `{"command":["cat"],"stdin":"` + long + `","vm":"lab/vm1"}`},
		{ID: "APPROVALKEYS", Grant: "agent", Tool: "vm_console_write", VM: "lab/vm1", State: store.ApprovalPending,
			Created: now, Expires: now.Add(time.Hour), TTL: time.Hour, Digest: "g",
			Args:     `{"text":"sha256:00,len:40","vm":"lab/vm1"}`,
			FullArgs: `{"text":"passwd root\n\u001b[2Ksecret-console-text\r\n","vm":"lab/vm1"}`},
	}}
	page, err := ui.New(ui.Config{Approvals: fa, AuditPath: filepath.Join(t.TempDir(), "audit.log"), TokenSHA256: sha(operatorToken)})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(page)
	defer ts.Close()
	f := &fixture{url: ts.URL}
	c := client(t)
	if code, _ := login(t, f, c, operatorToken); code != http.StatusOK {
		t.Fatalf("login = %d", code)
	}
	_, body := get(t, c, ts.URL+"/ui/pending", nil)
	for _, want := range []string{
		"echo innocent\n" + `\x1b[1A\x1b[2K\u{202e}rm -rf /tmp/important &lt;b&gt;x&lt;/b&gt;`,
		"3 hidden characters shown as",
		"<code>env.TOKEN</code>", "$(cat /etc/shadow)",
		"binary, hex dump, 8 bytes", "7f 45 4c 46 02 01 01 00", "|.ELF....|",
		"5012 bytes, first 1024 shown",
		`href="/ui/approval?id=APPROVALLONG">show all arguments`,
		"passwd root\n" + `\x1b[2Ksecret-console-text\x0d`,
	} {
		if !strings.Contains(html.UnescapeString(body), html.UnescapeString(want)) {
			t.Errorf("GET /ui/pending lacks %q", want)
		}
	}
	if strings.ContainsRune(body, 0x1b) || strings.ContainsRune(body, '\u202e') || strings.Contains(body, "<b>x</b>") || strings.Contains(body, "END-OF-STDIN") {
		t.Errorf("GET /ui/pending shows a raw control or bidi character, raw markup, or more than the preview")
	}
	resp, body := get(t, c, ts.URL+"/ui/approval?id=APPROVALLONG", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "END-OF-STDIN") || !strings.Contains(body, `name="action" value="approve"`) {
		t.Errorf("GET /ui/approval?id=APPROVALLONG = %d; want all of stdin and the decision form", resp.StatusCode)
	}
	for _, tt := range []struct {
		q    string
		want int
	}{{"id=NOPE", http.StatusNotFound}, {"id=" + strings.Repeat("x", 200), http.StatusBadRequest}, {"id=a%0ab", http.StatusBadRequest}} {
		if resp, _ := get(t, c, ts.URL+"/ui/approval?"+tt.q, nil); resp.StatusCode != tt.want {
			t.Errorf("GET /ui/approval?%s = %d; want %d", tt.q, resp.StatusCode, tt.want)
		}
	}
	if resp, _ := get(t, client(t), ts.URL+"/ui/approval?id=APPROVALLONG", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET /ui/approval without a session = %d; want 303 to the login form", resp.StatusCode)
	}
}
