package ui_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/tools"
	"github.com/vmgate/vmgate/server/ui"
)

// noApprovals is an approval store without approvals.
type noApprovals struct{}

func (noApprovals) List(context.Context) ([]store.Approval, error) { return nil, nil }
func (noApprovals) Grant(context.Context, string, string, string) (store.Approval, error) {
	return store.Approval{}, errors.New("no approvals")
}
func (noApprovals) Deny(context.Context, string, string, string) (store.Approval, error) {
	return store.Approval{}, errors.New("no approvals")
}

// hostileShell is an argument a client sent that must reach the page as
// text, never as markup.
const hostileShell = `<script>alert(1)</script>`

// newLogPage serves /ui over an audit log that holds these calls: grant
// agent ran vm_agent_exec (a hostile shell and a secret stdin) and
// list_vms, and vm_dir_list ten days ago; grant other was denied vm_power.
// agent's policy allows every tool; it never used vm_power.
func newLogPage(t *testing.T) *fixture {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	log, err := audit.Open(path, audit.Options{Fsync: audit.FsyncInterval})
	if err != nil {
		t.Fatalf("audit.Open: %v", err)
	}
	now := time.Now()
	recs := []audit.Record{
		{Time: now.Add(-10 * 24 * time.Hour), Kind: audit.KindDecision, CallID: "call-old", Grant: "agent", Tool: "vm_dir_list", VM: "lab/vm1", Decision: "allow", Args: map[string]any{"vm": "lab/vm1", "path": "/etc"}},
		{Time: now.Add(-3 * time.Hour), Kind: audit.KindDecision, CallID: "call-exec", Grant: "agent", Tool: "vm_agent_exec", VM: "lab/vm1", Decision: "allow",
			Args: map[string]any{"vm": "lab/vm1", "shell": hostileShell, "stdin": "secret-stdin-value", "session": "s1"}},
		{Time: now.Add(-3*time.Hour + time.Second), Kind: audit.KindOutcome, CallID: "call-exec", Grant: "agent", Tool: "vm_agent_exec", VM: "lab/vm1", Outcome: "ok", DurationMS: 12},
		{Time: now.Add(-2 * time.Hour), Kind: audit.KindDecision, CallID: "call-list", Grant: "agent", Tool: "list_vms", Decision: "allow"},
		{Time: now.Add(-2*time.Hour + time.Second), Kind: audit.KindOutcome, CallID: "call-list", Grant: "agent", Tool: "list_vms", Outcome: "ok", DurationMS: 3},
		{Time: now.Add(-time.Hour), Kind: audit.KindDecision, CallID: "call-power", Grant: "other", Tool: "vm_power", VM: "lab/vm2", Decision: "deny", Rule: "default", Args: map[string]any{"vm": "lab/vm2", "action": "stop"}},
	}
	for _, r := range recs {
		if _, err := log.Append(t.Context(), r); err != nil {
			t.Fatalf("Append(%s) = %v", r.CallID, err)
		}
	}
	if err := log.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	policies := map[string]*policy.Engine{}
	for g, doc := range map[string]string{"agent": `{"version":"1","default":"allow"}`, "other": `{"version":"1","default":"deny"}`} {
		if policies[g], err = policy.Parse(g+".json", []byte(doc)); err != nil {
			t.Fatalf("policy.Parse(%s): %v", g, err)
		}
	}
	page, err := ui.New(ui.Config{
		Approvals: noApprovals{}, AuditPath: path, TokenSHA256: sha(operatorToken), OperatorName: operatorName,
		Tighten: &ui.Tighten{
			Grants: []string{"agent", "other"}, Policy: func(g string) *policy.Engine { return policies[g] },
			Defaults: tools.ArgsWithDefaults, Catalogue: tools.Names(),
		},
	})
	if err != nil {
		t.Fatalf("ui.New: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle(ui.Prefix+"/", page)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return &fixture{url: ts.URL, page: page, auditPath: path}
}

func TestCallsFilters(t *testing.T) {
	f := newLogPage(t)
	c := client(t)
	login(t, f, c, operatorToken)
	all := []string{"call-old", "call-exec", "call-list", "call-power"}
	tests := []struct {
		query  string
		status int
		want   []string // the calls shown; every other one of all must not be
	}{
		{"", 200, []string{"call-exec", "call-list", "call-power"}},
		{"?since=", 200, all},
		{"?grant=other", 200, []string{"call-power"}},
		{"?tool=list_vms", 200, []string{"call-list"}},
		{"?vm=lab/vm1&since=", 200, []string{"call-old", "call-exec"}},
		{"?decision=deny", 200, []string{"call-power"}},
		{"?outcome=ok", 200, []string{"call-exec", "call-list"}},
		{"?session=s1", 200, []string{"call-exec"}},
		{"?kind=outcome&grant=agent", 200, []string{"call-exec", "call-list"}},
		{"?text=alert", 200, []string{"call-exec"}},
		{"?text=secret-stdin", 200, nil}, // stdin is kept only as a digest
		{"?since=150m", 200, []string{"call-list", "call-power"}},
		{"?until=150m", 200, []string{"call-exec"}},
		{"?since=yesterdayish", 400, nil},
		{"?kind=bogus", 400, nil},
	}
	for _, tt := range tests {
		resp, body := get(t, c, f.url+"/ui/calls"+tt.query, nil)
		if resp.StatusCode != tt.status {
			t.Errorf("GET /ui/calls%s = %d; want %d\n%s", tt.query, resp.StatusCode, tt.status, body)
			continue
		}
		for _, id := range all {
			shown := strings.Contains(body, "<code>"+id+"</code>")
			want := strings.Contains(strings.Join(tt.want, " "), id)
			if shown != want {
				t.Errorf("GET /ui/calls%s shows %s: %v; want %v", tt.query, id, shown, want)
			}
		}
		if tt.status == 200 && len(tt.want) == 0 && !strings.Contains(body, "No record matches") {
			t.Errorf("GET /ui/calls%s does not say that no record matches", tt.query)
		}
	}
}

func TestCallsNewestFirst(t *testing.T) {
	f := newLogPage(t)
	c := client(t)
	login(t, f, c, operatorToken)
	_, body := get(t, c, f.url+"/ui/calls?kind=decision", nil)
	p, l, e := strings.Index(body, "call-power"), strings.Index(body, "call-list"), strings.Index(body, "call-exec")
	if p < 0 || !(p < l && l < e) {
		t.Errorf("GET /ui/calls?kind=decision shows call-power at %d, call-list at %d, call-exec at %d; want newest first", p, l, e)
	}
}

func TestCallsEscapeArguments(t *testing.T) {
	f := newLogPage(t)
	c := client(t)
	login(t, f, c, operatorToken)
	_, body := get(t, c, f.url+"/ui/calls?tool=vm_agent_exec&kind=decision", nil)
	if strings.Contains(body, hostileShell) {
		t.Errorf("GET /ui/calls holds the argument %s unescaped", hostileShell)
	}
	if want := "&lt;script&gt;alert(1)&lt;/script&gt;"; !strings.Contains(body, want) {
		t.Errorf("GET /ui/calls lacks the escaped argument %s:\n%s", want, body)
	}
	if strings.Contains(body, "secret-stdin-value") {
		t.Errorf("GET /ui/calls shows stdin; the log keeps only its digest")
	}
}

func TestCallsAndTighteningNeedTheOperator(t *testing.T) {
	f := newLogPage(t)
	tests := []struct {
		name string
		path string
		hdr  map[string]string
	}{
		{"no session: calls", "/ui/calls", nil},
		{"no session: tightening", "/ui/tighten", nil},
		{"a grant's bearer token", "/ui/calls", map[string]string{"Authorization": "Bearer " + agentToken}},
		{"the operator token as a bearer token", "/ui/tighten?grant=agent", map[string]string{"Authorization": "Bearer " + operatorToken}},
		{"a forged session cookie", "/ui/calls", map[string]string{"Cookie": ui.SessionCookie + "=forged"}},
	}
	for _, tt := range tests {
		resp, body := get(t, client(t), f.url+tt.path, tt.hdr)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/login" {
			t.Errorf("%s: GET %s = %d to %q; want 303 to /ui/login", tt.name, tt.path, resp.StatusCode, resp.Header.Get("Location"))
		}
		if strings.Contains(body, "call-exec") || strings.Contains(body, "vm_power") {
			t.Errorf("%s: GET %s shows the log", tt.name, tt.path)
		}
	}
}

func TestTighteningShowsTheDiff(t *testing.T) {
	f := newLogPage(t)
	c := client(t)
	login(t, f, c, operatorToken)
	tests := []struct {
		query  string
		status int
		want   []string
		not    []string
	}{
		// agent never used vm_power: the suggestion denies it, in the
		// words of `vmgate policy diff`.
		{"?grant=agent", 200, []string{"Grant agent", "vm_power\n  - OLD allows it (not listed; the default is allow); NEW denies every call (not listed; the default is deny)", "Suggested policy", "vm_agent_exec"}, []string{"Grant other"}},
		{"", 200, []string{"Grant agent", "Grant other", "no call of this grant ran in the period"}, nil},
		// ten days back, vm_dir_list is evidence too: no line denies it.
		{"?grant=agent&since=30d", 200, []string{"vm_power\n  - OLD allows it"}, []string{"vm_dir_list\n  - OLD allows it"}},
		{"?grant=agent", 200, []string{"vm_dir_list\n  - OLD allows it"}, nil},
		{"?grant=nobody", 400, []string{"no grant"}, nil},
		{"?since=soon", 400, []string{"want a duration"}, nil},
	}
	for _, tt := range tests {
		resp, body := get(t, c, f.url+"/ui/tighten"+tt.query, nil)
		if resp.StatusCode != tt.status {
			t.Errorf("GET /ui/tighten%s = %d; want %d\n%s", tt.query, resp.StatusCode, tt.status, body)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(body, w) {
				t.Errorf("GET /ui/tighten%s lacks %q:\n%s", tt.query, w, body)
			}
		}
		for _, w := range tt.not {
			if strings.Contains(body, w) {
				t.Errorf("GET /ui/tighten%s holds %q", tt.query, w)
			}
		}
	}
}

func TestNavigationLinksThePages(t *testing.T) {
	f := newLogPage(t)
	c := client(t)
	login(t, f, c, operatorToken)
	for _, p := range []string{"/ui/", "/ui/calls", "/ui/tighten"} {
		_, body := get(t, c, f.url+p, nil)
		for _, link := range []string{`href="/ui/calls"`, `href="/ui/tighten"`} {
			if !strings.Contains(body, link) {
				t.Errorf("GET %s lacks the link %s", p, link)
			}
		}
	}
}
