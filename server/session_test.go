package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit/audittest"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server/mcptest"
)

// fakeBins is a guestctl.Binaries made of a function field.
type fakeBins struct {
	BinaryFunc func(arch string) (guestctl.Binary, error)
}

func (b fakeBins) Binary(arch string) (guestctl.Binary, error) { return b.BinaryFunc(arch) }

var fakeBuild = []byte("\x7fELF fake vmgate-guest")

func fakeBuildSum() string {
	s := sha256.Sum256(fakeBuild)
	return hex.EncodeToString(s[:])
}

func haveBins() fakeBins {
	return fakeBins{BinaryFunc: func(arch string) (guestctl.Binary, error) {
		return guestctl.Binary{Data: fakeBuild, SHA256: fakeBuildSum(), Source: "test"}, nil
	}}
}

func noBins() fakeBins {
	return fakeBins{BinaryFunc: func(arch string) (guestctl.Binary, error) {
		return guestctl.Binary{}, fmt.Errorf("test: %w", guestctl.ErrNoBinary)
	}}
}

// fakeGuest answers the helper's commands the way vmgate-guest would, as a
// Fake driver. mu guards everything below it.
type fakeGuest struct {
	mu       sync.Mutex
	pushed   bool
	sessions map[string]wire.Session
	results  map[int64]hypervisor.ExecResult
	next     int64
	argvs    [][]string                                              // every command run, in order
	file     func(argv []string, stdin []byte) hypervisor.ExecResult // vmgate-guest file …
	reaped   []string                                                // what the next reap of reapVM destroys
	reapVM   string
	lacks    []wire.Feature  // what the fake kernel lacks (session create refuses a sandbox requiring one)
	trash    map[string]bool // sessions destroyed with --trash-s
	procs    []wire.Process  // what ps answers, when set
	cwds     []string        // the cwd of every command run with one through the driver, and of every vmgate-guest run
	res      fakeResident    // the resident helper (resident_fake_test.go)
	lastRun  wire.RunRequest // the last vmgate-guest run's request
}

func newFakeGuest() *fakeGuest {
	return &fakeGuest{sessions: map[string]wire.Session{}, results: map[int64]hypervisor.ExecResult{}, trash: map[string]bool{}}
}

func (g *fakeGuest) driver() *hypervisortest.Fake {
	return &hypervisortest.Fake{
		ListVMsFunc: func(ctx context.Context) ([]hypervisor.VM, error) {
			return []hypervisor.VM{{Name: "vm1", State: hypervisor.StateRunning}, {Name: "vm2", State: hypervisor.StateRunning}}, nil
		},
		StatusFunc: func(ctx context.Context, vm string) (hypervisor.Status, error) {
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning, AgentConnected: true}, nil
		},
		ExecStartFunc: func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			g.waitForJob(ctx, req.Argv)
			g.mu.Lock()
			defer g.mu.Unlock()
			g.next++
			// Data flags: output inline (replyData), input from staged pieces.
			for len(req.Argv) > 2 && (req.Argv[1] == "--out" || req.Argv[1] == "--in") {
				req.Argv = append([]string{req.Argv[0]}, req.Argv[3:]...)
			}
			g.argvs = append(g.argvs, req.Argv)
			if req.Cwd != "" {
				g.cwds = append(g.cwds, "driver:"+req.Cwd)
			}
			g.results[g.next] = g.answerLocked(vm, req)
			return hypervisor.ExecHandle{PID: g.next}, nil
		},
		ExecStatusFunc: func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			r, ok := g.results[h.PID]
			if !ok {
				return hypervisor.ExecResult{}, hypervisor.ErrUnknownExec
			}
			delete(g.results, h.PID)
			return r, nil
		},
		FileWriteFunc: func(ctx context.Context, vm, path string, data []byte, mode uint32) error {
			return nil
		},
	}
}

func reply(v any) hypervisor.ExecResult {
	b, _ := json.Marshal(wire.Reply{OK: true, Result: v})
	return hypervisor.ExecResult{Exited: true, Stdout: b}
}

// replyData is the reply of a command with data output (--out auto):
// the data inline after the reply's line.
func replyData(v any, data []byte) hypervisor.ExecResult {
	b, _ := json.Marshal(wire.Reply{OK: true, Result: v, Data: &wire.DataOut{Bytes: int64(len(data))}})
	return hypervisor.ExecResult{Exited: true, Stdout: append(append(b, '\n'), data...)}
}

func replyErr(code, reason, msg string) hypervisor.ExecResult {
	b, _ := json.Marshal(wire.Reply{Error: &wire.Error{Code: code, Reason: reason, Message: msg}})
	return hypervisor.ExecResult{Exited: true, ExitCode: 1, Stdout: b}
}

func flag(argv []string, name string) string {
	if i := slices.Index(argv, name); i >= 0 && i+1 < len(argv) {
		return argv[i+1]
	}
	return ""
}

func (g *fakeGuest) answerLocked(vm string, req hypervisor.ExecRequest) hypervisor.ExecResult {
	a := req.Argv
	switch {
	case slices.Equal(a, []string{"uname", "-m"}):
		return hypervisor.ExecResult{Exited: true, Stdout: []byte("x86_64\n")}
	case len(a) == 2 && a[0] == "sha256sum":
		if !g.pushed {
			return hypervisor.ExecResult{Exited: true, ExitCode: 1}
		}
		return hypervisor.ExecResult{Exited: true, Stdout: []byte(fakeBuildSum() + "  " + a[1] + "\n")}
	case a[0] == "mv":
		g.pushed = true
		return hypervisor.ExecResult{Exited: true}
	case a[0] == "mkdir" || a[0] == "rm":
		return hypervisor.ExecResult{Exited: true}
	case a[0] == "/bin/sh": // the kill script without the helper
		return hypervisor.ExecResult{Exited: true, Stdout: []byte("exited\n")}
	case a[0] != guestctl.GuestPath:
		return hypervisor.ExecResult{Exited: true, ExitCode: 127}
	case len(a) > 1 && (a[1] == "call" || a[1] == "serve"):
		return g.residentLocked(vm, req)
	}
	switch strings.Join(a[1:min(3, len(a))], " ") {
	case "session create":
		id := flag(a, "--id")
		ttl, _ := strconv.ParseInt(flag(a, "--ttl-s"), 10, 64)
		mem, _ := strconv.ParseInt(flag(a, "--memory-mb"), 10, 64)
		s := wire.Session{ID: id, Workdir: "/var/lib/vmgate/sessions/" + id, Tracking: wire.TrackCgroup, TTLS: ttl, Limits: wire.Limits{MemoryMB: mem}}
		if raw := flag(a, "--sandbox"); raw != "" {
			var sb wire.Sandbox
			if err := json.Unmarshal([]byte(raw), &sb); err != nil {
				return replyErr(wire.CodeInvalid, "", "sandbox: "+err.Error())
			}
			for _, f := range g.lacks {
				if !sb.Allows(f) {
					return replyErr(wire.CodeRefused, wire.ReasonSandboxUnavailable,
						"this guest lacks what the sandbox requires: "+string(f)+" (not in this kernel); list the feature in best_effort to go without it")
				}
			}
			sb = sb.Normalized()
			s.Sandbox = &sb
			s.Enforced = fakeEnforced(id, sb)
		}
		g.sessions[id] = s
		return reply(s)
	case "session destroy":
		id := flag(a, "--id")
		_, ok := g.sessions[id]
		delete(g.sessions, id)
		res := wire.DestroyResult{ID: id, Existed: ok, Killed: 2}
		if secs, _ := strconv.ParseInt(flag(a, "--trash-s"), 10, 64); secs > 0 && ok {
			g.trash[id] = true
			res.TrashUntilMS = 1767323045000 + secs*1000
		}
		return reply(res)
	case "session restore":
		id, from := flag(a, "--id"), flag(a, "--from")
		if !g.trash[from] {
			return replyErr(wire.CodeNotFound, "", "session restore: no files of session "+from+" in the trash")
		}
		delete(g.trash, from)
		return reply(wire.RestoreResult{ID: id, From: from, Workdir: "/var/lib/vmgate/sessions/" + id, Entries: []string{"notes.txt", "src"}})
	case "session list":
		out := []wire.Session{}
		for _, s := range g.sessions {
			s.Processes = 3
			out = append(out, s)
		}
		return reply(out)
	case "session reap":
		var res wire.ReapResult
		if vm != g.reapVM {
			return reply(res)
		}
		for _, id := range g.reaped {
			delete(g.sessions, id)
			res.Destroyed = append(res.Destroyed, wire.DestroyResult{ID: id, Existed: true})
		}
		g.reaped = nil
		return reply(res)
	}
	switch a[1] {
	case "file", "dir", "archive":
		if g.file != nil {
			return g.file(a, req.Stdin)
		}
	case "metrics":
		return reply(wire.Metrics{TimeMS: 1, CPU: wire.CPUMetrics{Count: 2, Percent: 37.5, SampleMS: 250}, Memory: wire.MemoryMetrics{TotalBytes: 512 << 20, UsedBytes: 128 << 20, UsedPercent: 25}})
	case "ps":
		if g.procs != nil {
			return reply(g.procs)
		}
		return reply([]wire.Process{{PID: 7, PPID: 1, User: "root", Name: "sleep", Cmdline: "sleep 1000", StartedAt: 1700000000000, State: "S", Session: flag(a, "--session")}})
	case "run":
		var rr wire.RunRequest
		if err := json.Unmarshal(req.Stdin, &rr); err != nil {
			return replyErr(wire.CodeInvalid, "", err.Error())
		}
		g.cwds = append(g.cwds, "run:"+rr.Cwd)
		g.lastRun = rr
		if strings.Contains(rr.Shell, "> /root/") { // as a sandboxed session's shell answers
			return reply(wire.RunResult{PID: 9, ExitCode: 2, Stderr: []byte("sh: 1: cannot create /root/x: Permission denied\n")})
		}
		if strings.Contains(rr.Shell, "> /data/") { // a write path the session's uid cannot write
			return reply(wire.RunResult{PID: 9, ExitCode: 2, Stderr: []byte("sh: 1: cannot create /data/x: Permission denied\n"),
				WriteBlocked: []wire.BlockedPath{{Path: "/data", Reason: "owned by root, mode 0755: the session's uid cannot write"}}})
		}
		if strings.Contains(rr.Shell, "truncate") { // outside the write paths, read-only
			return reply(wire.RunResult{PID: 9, ExitCode: 1, Stderr: []byte("truncate: /data/ww: Read-only file system\n")})
		}
		return reply(wire.RunResult{PID: 9, Stdout: []byte("ran in " + rr.Session)})
	case "kill":
		pid, _ := strconv.Atoi(flag(a, "--pid"))
		switch {
		case pid == 1: // the agent's guard, as guest/agent/kill.go answers
			return replyErr(wire.CodeRefused, wire.ReasonInit, "kill: refused: pid 1 is init")
		case pid == 2:
			return replyErr(wire.CodeRefused, wire.ReasonKernelThread, "refused: pid 2 is a kernel thread")
		case pid == 99:
			return replyErr(wire.CodeRefused, wire.ReasonGuestAgent, "refused: pid 99 is the guest agent")
		case pid == 999:
			return replyErr(wire.CodeNotFound, "", "no such process")
		case flag(a, "--started-at") == "1":
			return replyErr(wire.CodeRefused, wire.ReasonPidReused, "refused: pid was reused")
		}
		return reply(wire.KillResult{PID: pid, Signal: flag(a, "--signal"), Exited: true, WaitedMS: 3})
	}
	return replyErr(wire.CodeInvalid, "", "unknown command")
}

func (g *fakeGuest) count(prefix ...string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, a := range g.argvs {
		if len(a) >= len(prefix) && slices.Equal(a[:len(prefix)], prefix) {
			n++
		}
	}
	return n
}

type sessFixture struct {
	*fixture
	guest    *fakeGuest
	sessions *memory.Sessions
}

// newSessFixture is a server with grants alice and bob, both seeing lab/*,
// over a fake guest; alice's policy is alicePolicy (allow all when "").
func newSessFixture(t *testing.T, bins guestctl.Binaries, alicePolicy string) *sessFixture {
	t.Helper()
	if alicePolicy == "" {
		alicePolicy = mcptest.AllowAll
	}
	ea, err := policy.Parse("alice.json", []byte(alicePolicy))
	if err != nil {
		t.Fatal(err)
	}
	eb, err := policy.Parse("bob.json", []byte(mcptest.AllowAll))
	if err != nil {
		t.Fatal(err)
	}
	f := &sessFixture{fixture: &fixture{calls: new(atomic.Int64), now: new(atomic.Int64), rec: &audittest.Recorder{}, store: memory.New()}, guest: newFakeGuest(), sessions: memory.NewSessions()}
	f.now.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	f.s, err = New(Config{
		Grants:        []Grant{{Name: "alice", Policy: ea, VMs: []string{"lab/*"}}, {Name: "bob", Policy: eb, VMs: []string{"lab/*"}}},
		Backends:      []Backend{{Name: "lab", Driver: f.guest.driver()}},
		Store:         f.store,
		Audit:         f.rec,
		Now:           func() time.Time { return time.Unix(0, f.now.Load()) },
		Sessions:      f.sessions,
		GuestBinaries: bins,
		ReapEvery:     -1,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { f.s.Close() })
	return f
}

func (f *sessFixture) as(t *testing.T, grant, tool, args string) mcptest.Reply {
	t.Helper()
	return f.sendAs(t, grant, mcptest.ToolCall(1, tool, args))
}

func (f *sessFixture) createSession(t *testing.T, grant, args string) string {
	t.Helper()
	r := f.as(t, grant, "create_session", args)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("create_session(%s) = %q; want success", args, r.Text())
	}
	id, _ := r.Result.StructuredContent["session"].(string)
	if wire.ValidateSessionID(id) != nil || len(id) != 32 {
		t.Fatalf("create_session gave session id %q; want 32 lowercase hex digits", id)
	}
	return id
}

func TestSessionGrantBinding(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	id := f.createSession(t, "alice", `{"vm":"lab/vm1","ttl_s":600}`)
	if id2 := f.createSession(t, "alice", `{"vm":"lab/vm1"}`); id2 == id {
		t.Fatalf("two create_session calls gave the same id %q", id)
	}
	never := strings.Repeat("a", 32)
	unknown := f.as(t, "alice", "destroy_session", fmt.Sprintf(`{"vm":"lab/vm1","session":%q}`, never)).Text()
	if unknown != TagInvalid+" unknown session" {
		t.Fatalf("destroy_session(never created) = %q; want %q", unknown, TagInvalid+" unknown session")
	}
	hostile := []struct {
		name, grant, tool, args string
	}{
		{"bob lists alice's processes", "bob", "list_processes", fmt.Sprintf(`{"vm":"lab/vm1","session":%q}`, id)},
		{"bob execs in alice's session", "bob", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","session":%q,"command":["id"]}`, id)},
		{"bob destroys alice's session", "bob", "destroy_session", fmt.Sprintf(`{"vm":"lab/vm1","session":%q}`, id)},
		{"alice names another VM", "alice", "destroy_session", fmt.Sprintf(`{"vm":"lab/vm2","session":%q}`, id)},
		{"path as id", "alice", "list_processes", `{"vm":"lab/vm1","session":"../../etc"}`},
		{"upper-case id", "alice", "destroy_session", fmt.Sprintf(`{"vm":"lab/vm1","session":%q}`, strings.ToUpper(id))},
	}
	before := len(f.guest.argvs)
	for _, tt := range hostile {
		if got := f.as(t, tt.grant, tt.tool, tt.args).Text(); got != unknown {
			t.Errorf("%s: %s = %q; want %q (the answer for an id that never existed)", tt.name, tt.tool, got, unknown)
		}
	}
	if n := len(f.guest.argvs) - before; n != 0 {
		t.Errorf("refused session calls ran %d guest commands; want 0", n)
	}
	r := f.as(t, "bob", "list_sessions", `{}`)
	if r.Result == nil || r.Result.IsError || len(r.Result.StructuredContent["sessions"].([]any)) != 0 {
		t.Errorf("bob's list_sessions = %q; want no sessions", r.Text())
	}
	r = f.as(t, "alice", "list_sessions", `{"vm":"lab/vm1"}`)
	if got := len(r.Result.StructuredContent["sessions"].([]any)); got != 2 {
		t.Errorf("alice's list_sessions = %q; want 2 sessions", r.Text())
	}
	// Alice uses her session: exec and list_processes touch it.
	f.advance(time.Minute)
	r = f.as(t, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","session":%q,"shell":"true"}`, id))
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["stdout"] != "ran in "+id {
		t.Errorf("alice's exec in her session = %q; want it run in the session", r.Text())
	}
	if s, _ := f.sessions.GetSession(context.Background(), id); !s.LastUsed.Equal(time.Unix(0, f.now.Load())) {
		t.Errorf("after exec LastUsed = %v; want now %v", s.LastUsed, time.Unix(0, f.now.Load()))
	}
	// Within a second of the recorded last use a call writes nothing to
	// the store (touchEvery); past it, the next call records its time.
	used := time.Unix(0, f.now.Load())
	for _, step := range []struct {
		advance time.Duration
		written bool
	}{{500 * time.Millisecond, false}, {499 * time.Millisecond, false}, {time.Millisecond, true}} {
		f.advance(step.advance)
		if r := f.as(t, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","session":%q,"shell":"true"}`, id)); r.Result == nil || r.Result.IsError {
			t.Fatalf("alice's exec in her session = %q", r.Text())
		}
		if step.written {
			used = time.Unix(0, f.now.Load())
		}
		if s, _ := f.sessions.GetSession(context.Background(), id); !s.LastUsed.Equal(used) {
			t.Errorf("exec %v after the last one: LastUsed = %v; want %v", step.advance, s.LastUsed, used)
		}
	}
	r = f.as(t, "alice", "list_processes", fmt.Sprintf(`{"vm":"lab/vm1","session":%q}`, id))
	if r.Result == nil || r.Result.IsError || !strings.Contains(r.Text(), "sleep 1000") {
		t.Errorf("alice's list_processes = %q; want her session's processes", r.Text())
	}
	// Destroy, twice, then bob once more.
	r = f.as(t, "alice", "destroy_session", fmt.Sprintf(`{"vm":"lab/vm1","session":%q}`, id))
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["existed"] != true {
		t.Fatalf("destroy_session = %q; want destroyed", r.Text())
	}
	r = f.as(t, "alice", "destroy_session", fmt.Sprintf(`{"vm":"lab/vm1","session":%q}`, id))
	if r.Result == nil || r.Result.IsError || !strings.Contains(r.Text(), "already gone") {
		t.Errorf("second destroy_session = %q; want success saying already gone", r.Text())
	}
	if got := f.as(t, "bob", "destroy_session", fmt.Sprintf(`{"vm":"lab/vm1","session":%q}`, id)).Text(); got != unknown {
		t.Errorf("bob destroying alice's destroyed session = %q; want %q", got, unknown)
	}
	if n := f.guest.count(guestctl.GuestPath, "session", "destroy"); n != 1 {
		t.Errorf("guest saw %d session destroy commands; want 1", n)
	}
	r = f.as(t, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","session":%q,"shell":"true"}`, id))
	if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "has ended") {
		t.Errorf("exec in a destroyed session = %q; want %s ... has ended", r.Text(), TagInvalid)
	}
	if n := f.guest.count("mv"); n != 1 {
		t.Errorf("the helper was pushed %d times; want once (cached per VM)", n)
	}
}

func TestHelperNotAvailable(t *testing.T) {
	f := newSessFixture(t, noBins(), "")
	tests := []struct{ tool, args string }{
		{"create_session", `{"vm":"lab/vm1"}`},
		{"list_sessions", `{}`},
		{"list_processes", `{"vm":"lab/vm1"}`},
		{"destroy_session", `{"vm":"lab/vm1","session":"0123456789abcdef0123456789abcdef"}`},
		{"vm_agent_exec", `{"vm":"lab/vm1","session":"0123456789abcdef0123456789abcdef","command":["id"]}`},
		{"kill_process", `{"vm":"lab/vm1","pid":42,"started_at":1700000000000}`},
		{"kill_process", `{"vm":"lab/vm1","pid":42}`},
	}
	for _, tt := range tests {
		r := f.as(t, "alice", tt.tool, tt.args)
		if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), "vmgate-guest helper is not available on this host (build it with make build)") {
			t.Errorf("%s(%s) = %q; want %s ... not available on this host", tt.tool, tt.args, r.Text(), TagBackend)
		}
	}
	// kill_process has no fallback without the helper (the guards live in
	// vmgate-guest): nothing at all reaches the guest.
	if n := len(f.guest.argvs); n != 0 {
		t.Errorf("without the helper the tools ran %d guest commands; want 0", n)
	}
}

func TestKillProcessMapping(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	tests := []struct {
		args    string
		tag     string // "" for success
		text    string
		refused string
	}{
		{`{"vm":"lab/vm1","pid":1}`, TagInvalid, "refused: pid 1 is init", wire.ReasonInit},
		{`{"vm":"lab/vm1","pid":2}`, TagInvalid, "refused: kernel thread", wire.ReasonKernelThread},
		{`{"vm":"lab/vm1","pid":99}`, TagInvalid, "refused: guest agent", wire.ReasonGuestAgent},
		{`{"vm":"lab/vm1","pid":42,"started_at":1}`, TagInvalid, "refused: pid was reused", wire.ReasonPidReused},
		{`{"vm":"lab/vm1","pid":999}`, TagInvalid, "no process 999 in lab/vm1", ""},
		{`{"vm":"lab/vm1","pid":42,"signal":"KILL","started_at":1700000000000}`, "", "sent SIGKILL to 42; it exited", ""},
		{`{"vm":"lab/vm1","pid":42,"started_at":"yesterday"}`, TagInvalid, "started_at", ""},
	}
	for _, tt := range tests {
		r := f.as(t, "alice", "kill_process", tt.args)
		switch {
		case tt.tag == "" && (r.Result == nil || r.Result.IsError || r.Text() != tt.text):
			t.Errorf("kill_process(%s) = %q; want success %q", tt.args, r.Text(), tt.text)
		case tt.tag != "" && (!mcptest.HasTag(r, tt.tag) || !strings.Contains(r.Text(), tt.text)):
			t.Errorf("kill_process(%s) = %q; want %s ... %s", tt.args, r.Text(), tt.tag, tt.text)
		case tt.refused != "" && r.Result.StructuredContent["refused"] != tt.refused:
			t.Errorf("kill_process(%s) structured refused = %v; want %q", tt.args, r.Result.StructuredContent["refused"], tt.refused)
		}
	}
	// The guards are the guest's: the host sends every valid pid, pid 1
	// included, and maps the guest's refusal.
	if n := f.guest.count(guestctl.GuestPath, "kill", "--pid", "1"); n != 1 {
		t.Errorf("pid 1 reached the guest %d times; want 1 (the guard is the guest's)", n)
	}
	if n := f.guest.count(guestctl.GuestPath, "kill", "--pid", "42", "--signal", "TERM", "--started-at", "1"); n != 1 {
		t.Errorf("kill of 42 with started_at 1 reached the guest %d times as kill --pid 42 --signal TERM --started-at 1; want 1", n)
	}
}

func TestCreateSessionLimitsPolicy(t *testing.T) {
	pol := `{"version":"1","default":"allow","tools":{"create_session":{
		"require":[{"path":"args.limits.memory_mb","op":"lte","value":512}]}}}`
	f := newSessFixture(t, haveBins(), pol)
	for _, args := range []string{`{"vm":"lab/vm1"}`, `{"vm":"lab/vm1","limits":{"memory_mb":1024}}`, `{"vm":"lab/vm1","limits":{"pids":10}}`} {
		if r := f.as(t, "alice", "create_session", args); !mcptest.HasTag(r, TagDenied) {
			t.Errorf("create_session(%s) = %q; want %s", args, r.Text(), TagDenied)
		}
	}
	if n := f.guest.count(guestctl.GuestPath, "session", "create"); n != 0 {
		t.Errorf("denied creates reached the guest %d times; want 0", n)
	}
	id := f.createSession(t, "alice", `{"vm":"lab/vm1","limits":{"memory_mb":256}}`)
	s, err := f.sessions.GetSession(context.Background(), id)
	if err != nil || s.Limits.MemoryMB != 256 || s.Grant != "alice" || s.VM != "lab/vm1" {
		t.Errorf("stored session = %+v, %v; want alice's on lab/vm1 with memory_mb 256", s, err)
	}
	if g := f.guest.sessions[id]; g.Limits.MemoryMB != 256 {
		t.Errorf("guest session limits = %+v; want memory_mb 256", g.Limits)
	}
}

func TestReaper(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	short := f.createSession(t, "alice", `{"vm":"lab/vm1","ttl_s":60}`)
	idle := f.createSession(t, "bob", `{"vm":"lab/vm1","idle_s":30}`)
	keep := f.createSession(t, "alice", `{"vm":"lab/vm2"}`)
	byGuest := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	ctx := context.Background()

	f.advance(20 * time.Second)
	if rep := f.s.env.Guest.Reap(ctx); len(rep.Destroyed)+len(rep.Reaped)+len(rep.Errors) != 0 {
		t.Fatalf("reap at +20 s = %+v; want nothing", rep)
	}
	f.guest.mu.Lock()
	f.guest.reaped, f.guest.reapVM = []string{byGuest}, "vm1"
	f.guest.mu.Unlock()
	f.advance(41 * time.Second) // +61 s: short is past its ttl, idle past its idle time
	rep := f.s.env.Guest.Reap(ctx)
	slices.Sort(rep.Destroyed)
	want := []string{short, idle}
	slices.Sort(want)
	if !slices.Equal(rep.Destroyed, want) || !slices.Equal(rep.Reaped, []string{byGuest}) || len(rep.Errors) != 0 {
		t.Errorf("reap at +61 s = %+v; want destroyed %v and reaped [%s]", rep, want, byGuest)
	}
	for id, live := range map[string]bool{short: false, idle: false, byGuest: false, keep: true} {
		s, err := f.sessions.GetSession(ctx, id)
		if err != nil || s.Deleted.IsZero() != live {
			t.Errorf("session %s after reap = %+v, %v; want live %v", id, s, err, live)
		}
		if _, inGuest := f.guest.sessions[id]; inGuest != live {
			t.Errorf("session %s in the guest after reap: %v; want %v", id, inGuest, live)
		}
	}
	// The expired session answers as ended to its owner.
	r := f.as(t, "alice", "list_processes", fmt.Sprintf(`{"vm":"lab/vm1","session":%q}`, short))
	if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "has ended") {
		t.Errorf("list_processes of a reaped session = %q; want %s ... has ended", r.Text(), TagInvalid)
	}
}

// failingSessions is a store.Sessions whose every call fails.
type failingSessions struct{ store.Sessions }

func (failingSessions) CreateSession(context.Context, store.Session) error {
	return fmt.Errorf("test: %w", store.ErrUnavailable)
}

func (failingSessions) GetSession(context.Context, string) (store.Session, error) {
	return store.Session{}, fmt.Errorf("test: %w", store.ErrUnavailable)
}

func TestSessionStoreDown(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	f.s.env.Guest.Sessions = failingSessions{}
	for _, tt := range []struct{ tool, args string }{
		{"create_session", `{"vm":"lab/vm1"}`},
		{"destroy_session", `{"vm":"lab/vm1","session":"0123456789abcdef0123456789abcdef"}`},
	} {
		r := f.as(t, "alice", tt.tool, tt.args)
		if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), "session store") {
			t.Errorf("%s with the store down = %q; want %s ... session store", tt.tool, r.Text(), TagBackend)
		}
	}
	if n := f.guest.count(guestctl.GuestPath, "session"); n != 0 {
		t.Errorf("with the store down %d session commands reached the guest; want 0", n)
	}
}
