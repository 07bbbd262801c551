package server

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/mcptest"
)

// fakeSession is an MCP session as a transport registers it: its queue
// is a channel of size n the test reads without waiting (a notification
// is in it once the event's function returned, or never).
type fakeSession struct {
	id    string
	ch    chan mcp.JSONRPCNotification
	mu    sync.Mutex
	level mcp.LoggingLevel
}

func (s *fakeSession) SessionID() string                                   { return s.id }
func (s *fakeSession) NotificationChannel() chan<- mcp.JSONRPCNotification { return s.ch }
func (s *fakeSession) Initialize()                                         {}
func (s *fakeSession) Initialized() bool                                   { return true }
func (s *fakeSession) SetLogLevel(l mcp.LoggingLevel)                      { s.mu.Lock(); s.level = l; s.mu.Unlock() }
func (s *fakeSession) GetLogLevel() mcp.LoggingLevel {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.level
}

// attachFake registers a session of grant at level with a queue of n.
func attachFake(t *testing.T, f *fixture, grant, id string, level mcp.LoggingLevel, n int) *fakeSession {
	t.Helper()
	sess := &fakeSession{id: id, ch: make(chan mcp.JSONRPCNotification, n), level: level}
	if err := f.s.mcp.RegisterSession(context.Background(), sess); err != nil {
		t.Fatalf("RegisterSession(%s): %v", id, err)
	}
	t.Cleanup(f.s.AttachSession(grant, id))
	return sess
}

// queued takes every notification waiting in sess's queue, as JSON.
func (s *fakeSession) queued(t *testing.T) []string {
	t.Helper()
	var out []string
	for {
		select {
		case n := <-s.ch:
			b, err := json.Marshal(n)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(b))
		default:
			return out
		}
	}
}

// events are the "event" values of the notifications/message in msgs,
// and "list_changed" for a tools/list_changed.
func events(t *testing.T, msgs []string) []string {
	t.Helper()
	var out []string
	for _, m := range msgs {
		var n struct {
			Method string `json:"method"`
			Params struct {
				Level  string         `json:"level"`
				Logger string         `json:"logger"`
				Data   map[string]any `json:"data"`
			} `json:"params"`
		}
		if err := json.Unmarshal([]byte(m), &n); err != nil {
			t.Fatalf("notification %s: %v", m, err)
		}
		switch n.Method {
		case "notifications/tools/list_changed":
			out = append(out, "list_changed")
		case "notifications/message":
			if n.Params.Logger != LoggerName || n.Params.Data["message"] == "" {
				t.Errorf("notification %s: want logger %q and a message", m, LoggerName)
			}
			out = append(out, fmt.Sprintf("%s:%s", n.Params.Level, n.Params.Data["event"]))
		default:
			t.Errorf("unexpected notification %s", m)
		}
	}
	return out
}

func mustEngine(t *testing.T, doc string) *policy.Engine {
	t.Helper()
	eng, err := policy.Parse("reload.json", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// fireEveryLevel makes the server log one event of each level it uses to
// grant "local": info, notice, warning, error.
func fireEveryLevel(t *testing.T, f *fixture, round int) {
	t.Helper()
	// info: a reload that changes no tool (a new fingerprint each round).
	doc := fmt.Sprintf(`{"version":"1","default":"allow","tools":{"vm_status":{"action":"allow","reason":"round %d"}}}`, round)
	if err := f.s.SetPolicy("local", mustEngine(t, doc)); err != nil {
		t.Fatal(err)
	}
	f.s.notifyProcess("lab", hypervisor.ProcessEvent{Driver: "qemu", Kind: hypervisor.ProcessRestarted, Restarts: 1})     // notice
	f.s.notifyLeaseEnded(store.Lease{Name: "lab/w1", Grant: "local", State: store.LeaseLive, Expires: f.s.now()})         // warning
	f.s.notifyProcess("lab", hypervisor.ProcessEvent{Driver: "qemu", Kind: hypervisor.ProcessRestartFailed, Restarts: 1}) // error
}

// A session gets exactly the events at or above the level it set
// (logging/setLevel), through mcp-go's own handler, and none below.
func TestLogNotificationsAtTheLevelSet(t *testing.T) {
	all := []string{"info:policy_reloaded", "notice:plugin_restarted", "warning:lease_ended", "error:plugin_restart_failed"}
	tests := []struct {
		level mcp.LoggingLevel
		want  []string
	}{
		{mcp.LoggingLevelDebug, all},
		{mcp.LoggingLevelInfo, all},
		{mcp.LoggingLevelNotice, all[1:]},
		{mcp.LoggingLevelWarning, all[2:]},
		{mcp.LoggingLevelError, all[3:]},
		{mcp.LoggingLevelCritical, nil},
		{mcp.LoggingLevelEmergency, nil},
	}
	f := newFixture(t, fixtureOpts{})
	sess := attachFake(t, f, "local", "sess-levels", mcp.LoggingLevelDebug, 16)
	ctx := f.s.mcp.WithContext(context.Background(), sess)
	for i, tt := range tests {
		// Set through the MCP message, as a client does.
		resp := f.s.mcp.HandleMessage(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"`+string(tt.level)+`"}}`))
		if b, _ := json.Marshal(resp); !strings.Contains(string(b), `"result":{}`) {
			t.Fatalf("logging/setLevel %s = %s; want an empty result", tt.level, b)
		}
		fireEveryLevel(t, f, i)
		if got := events(t, sess.queued(t)); !slices.Equal(got, tt.want) {
			t.Errorf("level %s: got %q; want %q", tt.level, got, tt.want)
		}
	}
}

// A grant's events reach its own sessions only; a plugin's reach the
// grants that see its backend; a detached session gets nothing.
func TestNotificationsReachTheirGrantOnly(t *testing.T) {
	f := newFixture(t, fixtureOpts{vms: []string{"lab/*"}}) // "other" sees other/*
	local := attachFake(t, f, "local", "sess-local", mcp.LoggingLevelDebug, 16)
	other := attachFake(t, f, "other", "sess-other", mcp.LoggingLevelDebug, 16)
	gone := &fakeSession{id: "sess-gone", ch: make(chan mcp.JSONRPCNotification, 4), level: mcp.LoggingLevelDebug}
	f.s.mcp.RegisterSession(context.Background(), gone)
	f.s.AttachSession("local", gone.id)()

	f.s.notifyLeaseEnded(store.Lease{Name: "other/w1", Grant: "other", State: store.LeaseCreating})
	// Plugin events come through the driver's WatchProcess.
	var tell func(hypervisor.ProcessEvent)
	f.s.backends["lab"] = &watchedFake{Fake: hypervisortest.Counting(f.calls), watch: func(fn func(hypervisor.ProcessEvent)) { tell = fn }}
	f.s.watchProcesses()
	if tell == nil {
		t.Fatal("watchProcesses did not watch a driver that is a hypervisor.ProcessWatcher")
	}
	tell(hypervisor.ProcessEvent{Driver: "qemu", Kind: hypervisor.ProcessExited, RestartIn: time.Second})
	if got, want := events(t, local.queued(t)), []string{"warning:plugin_exited"}; !slices.Equal(got, want) {
		t.Errorf("grant local (lab/*) got %q; want %q", got, want)
	}
	if got, want := events(t, other.queued(t)), []string{"warning:lease_ended"}; !slices.Equal(got, want) {
		t.Errorf("grant other (other/*) got %q; want %q", got, want)
	}
	if got := gone.queued(t); len(got) != 0 {
		t.Errorf("a detached session got %q; want nothing", got)
	}
	if d := f.s.AttachSession("nobody", "x"); d == nil {
		t.Error("AttachSession(unknown grant) = nil; want a detach that does nothing")
	}
}

// watchedFake is a driver that reports its process's events.
type watchedFake struct {
	*hypervisortest.Fake
	watch func(fn func(hypervisor.ProcessEvent))
}

func (w *watchedFake) WatchProcess(fn func(hypervisor.ProcessEvent)) { w.watch(fn) }

// A session whose queue is full loses what does not fit, counted, and the
// server never waits for it.
func TestNotificationsToAFullQueueAreDropped(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	sess := attachFake(t, f, "local", "sess-slow", mcp.LoggingLevelDebug, 2)
	before := f.s.NotificationsDropped()
	for i := range 5 {
		f.s.notifyProcess("lab", hypervisor.ProcessEvent{Driver: "qemu", Kind: hypervisor.ProcessRestarted, Restarts: int64(i)})
	}
	if got := len(sess.queued(t)); got != 2 {
		t.Errorf("queue of 2 holds %d notifications; want 2", got)
	}
	if got := f.s.NotificationsDropped() - before; got != 3 {
		t.Errorf("NotificationsDropped() grew by %d; want 3", got)
	}
}

// A reload tells the grant's sessions; tools/list_changed follows only
// the reloads that change what tools/list shows them, and a reload to
// the same document says nothing.
func TestPolicyReloadToolsListChanged(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	sess := attachFake(t, f, "local", "sess-reload", mcp.LoggingLevelInfo, 16)
	other := attachFake(t, f, "other", "sess-other", mcp.LoggingLevelInfo, 16)
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"a new reason, the same tools", `{"version":"1","default":"allow","tools":{"vm_status":{"action":"allow","reason":"x"}}}`,
			[]string{"info:policy_reloaded"}},
		{"vm_power hidden", `{"version":"1","default":"allow","hide":["vm_power"]}`,
			[]string{"notice:policy_reloaded", "list_changed"}},
		{"the same document again", `{"version":"1","default":"allow","hide":["vm_power"]}`, nil},
		{"vm_power denied, still shown", `{"version":"1","default":"allow","tools":{"vm_power":{"action":"deny"}}}`,
			[]string{"notice:policy_reloaded", "list_changed"}},
		{"vm_power allowed again, a limit added", `{"version":"1","default":"allow","tools":{"vm_power":{"action":"allow","limits":[{"counter":"power","window":"hour","max":5,"scope":"grant"}]}}}`,
			[]string{"info:policy_reloaded"}},
		{"a deny default hides the unlisted tools", `{"version":"1","default":"deny","tools":{"vm_status":{"action":"allow"}}}`,
			[]string{"notice:policy_reloaded", "list_changed"}},
	}
	for _, tt := range tests {
		if err := f.s.SetPolicy("local", mustEngine(t, tt.doc)); err != nil {
			t.Fatal(err)
		}
		if got := events(t, sess.queued(t)); !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %q; want %q", tt.name, got, tt.want)
		}
	}
	if got := other.queued(t); len(got) != 0 {
		t.Errorf("grant other's session got %q from local's reloads; want nothing", got)
	}
}

// The secrets of a parked call (stdin, env values, file content) never
// reach a notification: its arguments are shown as the audit log keeps
// them, and the operator's decision carries no arguments at all.
func TestParkedCallNotificationsCarryNoSecret(t *testing.T) {
	const stdin, envValue, content = "stdin-s3cret-A1", "env-s3cret-B2", "file-s3cret-C3"
	f := newFixture(t, fixtureOpts{policy: approveExec})
	sess := attachFake(t, f, "local", "sess-park", mcp.LoggingLevelDebug, 16)
	calls := []struct{ tool, args string }{
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["sh"],"stdin":"` + stdin + `","env":{"TOKEN":"` + envValue + `"}}`},
		{"vm_file_write", `{"vm":"lab/vm1","path":"/tmp/f","content":"` + content + `"}`},
	}
	for i, c := range calls {
		out := f.s.Handle(context.Background(), &Conn{Grant: f.s.grants["local"], Transport: "stdio", Session: sess.id}, []byte(mcptest.ToolCall(i+1, c.tool, c.args)))
		var r mcptest.Reply
		if err := json.Unmarshal(out, &r); err != nil || !mcptest.HasTag(r, TagApproval) {
			t.Fatalf("%s = %s; want %s", c.tool, out, TagApproval)
		}
		id, _ := r.Result.StructuredContent["approval_id"].(string)
		decide := f.s.Approvals().Grant
		if i == 1 {
			decide = f.s.Approvals().Deny
		}
		if _, err := decide(context.Background(), id, "tester", "checked"); err != nil {
			t.Fatal(err)
		}
	}
	msgs := sess.queued(t)
	if got, want := events(t, msgs), []string{"notice:approval_pending", "notice:approval_granted", "notice:approval_pending", "warning:approval_denied"}; !slices.Equal(got, want) {
		t.Fatalf("events %q; want %q", got, want)
	}
	all := strings.Join(msgs, "\n")
	for _, secret := range []string{stdin, envValue, content} {
		if strings.Contains(all, secret) {
			t.Errorf("a notification carries the secret %q:\n%s", secret, all)
		}
	}
	// What is shown instead: the digests, the env name, the command.
	for _, want := range []string{`"stdin":"sha256:`, `"TOKEN":"sha256:`, `"content":"sha256:`, `"command":["sh"]`, `"path":"/tmp/f"`} {
		if !strings.Contains(msgs[0]+msgs[2], want) {
			t.Errorf("the parked calls' notifications lack %s:\n%s\n%s", want, msgs[0], msgs[2])
		}
	}
}

// A lease about to end is told to its grant's sessions only, as a
// warning naming the VM, when it is deleted and the time left.
func TestLeaseEndingNotification(t *testing.T) {
	f := newFixture(t, fixtureOpts{vms: []string{"lab/*"}})
	local := attachFake(t, f, "local", "sess-local", mcp.LoggingLevelWarning, 4)
	other := attachFake(t, f, "other", "sess-other", mcp.LoggingLevelDebug, 4)
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	f.s.notifyLeaseEnding(store.Lease{Name: "lab/w1", VM: "lab/w1", Grant: "local", State: store.LeaseLive, Expires: exp}, 90*time.Second)
	got := local.queued(t)
	if ev := events(t, got); !slices.Equal(ev, []string{"warning:lease_ending"}) {
		t.Fatalf("local's events = %q; want one warning:lease_ending", ev)
	}
	b := fmt.Sprint(got[0])
	for _, want := range []string{`"vm":"lab/w1"`, `"expires":"2030-01-02T03:04:05Z"`, `"left_s":90`, "will be deleted at 2030-01-02T03:04:05Z (in 1m30s)"} {
		if !strings.Contains(b, want) {
			t.Errorf("lease_ending = %s; want %s in it", b, want)
		}
	}
	if ev := events(t, other.queued(t)); len(ev) != 0 {
		t.Errorf("other grant's events = %q; want none", ev)
	}
}
