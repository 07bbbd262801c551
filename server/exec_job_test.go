package server

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit/audittest"
	"github.com/vmgate/vmgate/server/mcptest"
)

// startSessionJob creates a session of alice and starts a wait: false
// command in it; it returns the session, the exec_id and the guest's job id.
func startSessionJob(t *testing.T, f *sessFixture) (sess, execID, job string) {
	t.Helper()
	sess = f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	r := f.as(t, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","session":%q,"command":["make"],"wait":false}`, sess))
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_agent_exec wait: false in a session = %q; want an exec_id", r.Text())
	}
	sc := r.Result.StructuredContent
	execID, _ = sc["exec_id"].(string)
	job, req, ok := f.guest.job(sess)
	if !ok || req.Session != sess || sc["job"] != true || sc["session"] != sess || execID != "j"+job {
		t.Fatalf("vm_agent_exec wait: false = %v; guest job %q (session %q, found %v); want exec_id j<job> in session %s", sc, job, req.Session, ok, sess)
	}
	return sess, execID, job
}

// TestExecJobInSession: wait: false in a session starts a job of the
// resident helper (started through the agent's exec); vm_agent_exec_status
// shows its output while it runs, from the since cursor, and its end.
func TestExecJobInSession(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	_, execID, job := startSessionJob(t, f)
	status := func(since string) map[string]any {
		t.Helper()
		args := fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q%s}`, execID, since)
		r := f.as(t, "alice", "vm_agent_exec_status", args)
		if r.Result == nil || r.Result.IsError {
			t.Fatalf("vm_agent_exec_status(%s) = %q; want a status", args, r.Text())
		}
		return r.Result.StructuredContent
	}
	f.guest.emit(job, "compiling 1/2")
	sc := status("")
	if sc["exited"] != false || sc["state"] != wire.JobRunning || sc["stdout"] != "compiling 1/2\n" || sc["last_line"] != "compiling 1/2" {
		t.Fatalf("status of a running job = %v; want running with its output so far", sc)
	}
	if _, ok := sc["exit_code"]; ok {
		t.Errorf("status of a running job has exit_code %v; want none", sc["exit_code"])
	}
	next, _ := sc["next"].(map[string]any)
	f.guest.emit(job, "compiling 2/2")
	sc = status(fmt.Sprintf(`,"since":{"stdout":%v,"stderr":%v}`, next["stdout"], next["stderr"]))
	if sc["stdout"] != "compiling 2/2\n" || sc["stdout_offset"] != float64(14) {
		t.Errorf("status since %v = %v; want only the new line, from offset 14", next, sc)
	}
	f.guest.end(job, 3)
	sc = status("")
	if sc["exited"] != true || sc["exit_code"] != float64(3) || sc["stdout"] != "compiling 1/2\ncompiling 2/2\n" {
		t.Errorf("status of an ended job = %v; want exited, exit 3, all its output", sc)
	}
	// A cursor on a command of the guest agent's is refused, saying why.
	f.guest.mu.Lock()
	f.guest.pushed = true
	f.guest.mu.Unlock()
	r := f.as(t, "alice", "vm_agent_exec", `{"vm":"lab/vm1","command":["true"],"wait":false}`)
	plain, _ := r.Result.StructuredContent["exec_id"].(string)
	r = f.as(t, "alice", "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q,"since":{"stdout":1}}`, plain))
	if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "since is for a command in a session or sandbox") {
		t.Errorf("status of a plain command with since = %q; want %s since is for ...", r.Text(), TagInvalid)
	}
}

// restartedSessFixture is f's server started again over the same guest and
// session store (what a restart keeps); its own exec table is empty.
func restartedSessFixture(t *testing.T, f *sessFixture) *sessFixture {
	t.Helper()
	g := &sessFixture{fixture: &fixture{calls: new(atomic.Int64), now: f.now, rec: &audittest.Recorder{}, store: f.store}, guest: f.guest, sessions: f.sessions}
	ea, _ := policy.Parse("alice.json", []byte(mcptest.AllowAll))
	eb, _ := policy.Parse("bob.json", []byte(mcptest.AllowAll))
	s, err := New(Config{
		Grants:   []Grant{{Name: "alice", Policy: ea, VMs: []string{"lab/*"}}, {Name: "bob", Policy: eb, VMs: []string{"lab/*"}}},
		Backends: []Backend{{Name: "lab", Driver: f.guest.driver()}},
		Store:    f.store, Audit: g.rec, Sessions: f.sessions, GuestBinaries: haveBins(), ReapEvery: -1,
		Now: func() time.Time { return time.Unix(0, f.now.Load()) },
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	g.s = s
	return g
}

// TestExecJobFoundAfterRestart: a restarted server finds a session's job
// by its exec_id (the job's id in the guest) for the session's grant only;
// an id of the same form that names no job is unknown.
func TestExecJobFoundAfterRestart(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	_, execID, job := startSessionJob(t, f)
	f.guest.emit(job, "still here")
	f.s.Close()
	g := restartedSessFixture(t, f)
	r := g.as(t, "bob", "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q}`, execID))
	if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "unknown exec_id") {
		t.Errorf("another grant's status of the job after a restart = %q; want %s unknown exec_id", r.Text(), TagInvalid)
	}
	r = g.as(t, "alice", "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm2","exec_id":%q}`, execID))
	if !mcptest.HasTag(r, TagInvalid) {
		t.Errorf("status of the job on another VM = %q; want %s", r.Text(), TagInvalid)
	}
	r = g.as(t, "alice", "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q}`, execID))
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["stdout"] != "still here\n" || r.Result.StructuredContent["state"] != wire.JobRunning {
		t.Fatalf("the owner's status of the job after a restart = %q; want it running with its output", r.Text())
	}
	r = g.as(t, "alice", "vm_agent_exec_status", `{"vm":"lab/vm1","exec_id":"j0123456789abcdef01234567"}`)
	if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "unknown exec_id") {
		t.Errorf("status of a job id that names no job = %q; want %s unknown exec_id", r.Text(), TagInvalid)
	}
}

// TestExecJobWithoutResident: where the resident helper cannot run, wait:
// false in a session is refused with the reason and what to do, nothing
// having run.
func TestExecJobWithoutResident(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	f.guest.res.noServe = true
	sess := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	r := f.as(t, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","session":%q,"command":["make"],"wait":false}`, sess))
	if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), "resident helper") || !strings.Contains(r.Text(), "wait: true") {
		t.Errorf("wait: false without a resident helper = %q; want %s ... resident helper ... wait: true", r.Text(), TagBackend)
	}
	if _, _, ok := f.guest.job(""); ok {
		t.Error("a job was started without a resident helper")
	}
	if n := f.guest.count(guestctl.GuestPath, "run"); n != 0 {
		t.Errorf("%d commands ran; want none", n)
	}
}

// TestExecOneShotSandbox: sandbox runs the command alone in the policy's
// answer to it; a policy that requires a sandbox runs a command that asks
// for none in its own; a looser one is denied before anything runs, and
// sandbox with session is refused.
func TestExecOneShotSandbox(t *testing.T) {
	required := `{"version":"1","default":"allow","tools":{"vm_agent_exec":{"sandbox":{"require":true,"net":"none","fs":{"write":["/srv/out"]}}}}}`
	cases := []struct {
		name, policy, args string
		want               *wire.Sandbox // the sandbox the guest got; nil: no run reached it
		tag                string        // the refusal's tag
	}{
		{"asked, allow all", "", `{"sandbox":{}}`, &wire.Sandbox{Net: wire.NetNone, User: wire.UserSession, BestEffort: []wire.Feature{"cgroup"}}, ""},
		{"required, none asked", required, `{}`, &wire.Sandbox{Net: wire.NetNone, User: wire.UserSession, FS: wire.FSAccess{Write: []string{"/srv/out"}}, BestEffort: []wire.Feature{"cgroup"}}, ""},
		{"required, tighter asked", required, `{"sandbox":{"fs":{"write":[]}}}`, &wire.Sandbox{Net: wire.NetNone, User: wire.UserSession, BestEffort: []wire.Feature{"cgroup"}}, ""},
		{"required, root asked", required, `{"sandbox":{"user":"root"}}`, nil, TagDenied},
		{"looser than the default", "", `{"sandbox":{"net":"host"}}`, nil, TagDenied},
		{"with a session", "", `{"sandbox":{},"session":"0123456789abcdef0123456789abcdef"}`, nil, TagInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newSessFixture(t, haveBins(), tc.policy)
			var args map[string]any
			if err := json.Unmarshal([]byte(tc.args), &args); err != nil {
				t.Fatal(err)
			}
			args["vm"], args["command"] = "lab/vm1", []string{"id"}
			b, _ := json.Marshal(args)
			r := f.as(t, "alice", "vm_agent_exec", string(b))
			runs := f.guest.count(guestctl.GuestPath, "run")
			if tc.want == nil {
				if !mcptest.HasTag(r, tc.tag) || runs != 0 {
					t.Errorf("vm_agent_exec(%s) = %q after %d runs; want %s and none", b, r.Text(), runs, tc.tag)
				}
				return
			}
			if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["sandboxed"] != true || runs != 1 {
				t.Fatalf("vm_agent_exec(%s) = %q after %d runs; want one sandboxed run", b, r.Text(), runs)
			}
			f.guest.mu.Lock()
			rr := f.guest.lastRun
			f.guest.mu.Unlock()
			got, _ := json.Marshal(rr.Sandbox)
			want, _ := json.Marshal(tc.want)
			if string(got) != string(want) || rr.Session != "" {
				t.Errorf("the guest ran with sandbox %s, session %q; want %s, no session", got, rr.Session, want)
			}
		})
	}
}

// TestExecTimeoutCap: timeout_s goes up to the server's cap unless the
// grant's policy sets its own (up to a day), which then bounds it.
func TestExecTimeoutCap(t *testing.T) {
	capped := `{"version":"1","default":"allow","tools":{"vm_agent_exec":{"max_timeout_s":3600}}}`
	cases := []struct {
		policy  string
		timeout int64
		tag     string // "" for a command that runs
		text    string
	}{
		{"", 600, "", ""},
		{"", 601, TagInvalid, "over this server's cap (limits.max_timeout_s) of 600 s"},
		{capped, 3600, "", ""},
		{capped, 3601, TagDenied, "timeout_s 3601 is over the policy's cap of 3600 s"},
		{capped, 86401, TagInvalid, "timeout_s"},
		// Over the server's cap under a policy that parks the command for
		// an operator: refused at once, nobody asked to approve it.
		{approveExec, 601, TagInvalid, "over this server's cap (limits.max_timeout_s) of 600 s"},
	}
	for _, tc := range cases {
		f := newSessFixture(t, haveBins(), tc.policy)
		f.guest.pushed = true
		r := f.as(t, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","command":["true"],"timeout_s":%d,"wait":false}`, tc.timeout))
		switch {
		case tc.tag == "" && (r.Result == nil || r.Result.IsError):
			t.Errorf("timeout_s %d under %q = %q; want it to run", tc.timeout, tc.policy, r.Text())
		case tc.tag != "" && (!mcptest.HasTag(r, tc.tag) || !strings.Contains(r.Text(), tc.text)):
			t.Errorf("timeout_s %d under %q = %q; want %s ... %s", tc.timeout, tc.policy, r.Text(), tc.tag, tc.text)
		}
	}
}

// TestVMStatusRoad: vm_status says how vmgate reaches the VM's helper,
// without looking for it itself: undecided before any helper call, then
// the road and, for jobs, the resident helper through the agent's exec.
func TestVMStatusRoad(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	road := func() map[string]any {
		t.Helper()
		r := f.as(t, "alice", "vm_status", `{"vm":"lab/vm1"}`)
		if r.Result == nil || r.Result.IsError {
			t.Fatalf("vm_status = %q", r.Text())
		}
		h, _ := r.Result.StructuredContent["helper"].(map[string]any)
		return h
	}
	if h := road(); h["road"] != "undecided" {
		t.Errorf("vm_status helper before any call = %v; want undecided", h)
	}
	if n := len(f.guest.argvs); n != 0 {
		t.Errorf("vm_status ran %d commands in the guest; want none", n)
	}
	startSessionJob(t, f)
	h := road()
	if h["road"] != guestctl.RoadPerCommand || !strings.Contains(fmt.Sprint(h["why"]), "no channel") || h["jobs_via"] != guestctl.ViaCall || h["pid"] != float64(4242) {
		t.Errorf("vm_status helper after a job = %v; want per-command (no channel), jobs through the agent's exec to pid 4242", h)
	}
}

// startSandboxJob starts, as alice, a wait: false command in a sandbox of
// its own; it returns the exec_id and the guest's job id.
func startSandboxJob(t *testing.T, f *sessFixture) (execID, job string) {
	t.Helper()
	r := f.as(t, "alice", "vm_agent_exec", `{"vm":"lab/vm1","command":["make"],"sandbox":{},"wait":false}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_agent_exec sandbox wait: false = %q; want an exec_id", r.Text())
	}
	execID, _ = r.Result.StructuredContent["exec_id"].(string)
	job, req, ok := f.guest.job("")
	if !ok || req.Sandbox == nil || req.Session != "" || execID != "j"+job {
		t.Fatalf("guest job %q: sandbox %v, session %q; want a one-shot sandbox's job named by %s", job, req.Sandbox, req.Session, execID)
	}
	return execID, job
}

// TestExecSandboxJob: wait: false with a sandbox starts a job in a sandbox
// of its own; it is read like a session's, but a restarted server does
// not find it (no session of the store says whose it is).
func TestExecSandboxJob(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	execID, job := startSandboxJob(t, f)
	f.guest.emit(job, "working")
	r := f.as(t, "alice", "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q}`, execID))
	if r.Result == nil || r.Result.StructuredContent["stdout"] != "working\n" {
		t.Errorf("status of the sandbox's job = %q; want its output", r.Text())
	}
	f.s.Close()
	g := restartedSessFixture(t, f)
	r = g.as(t, "alice", "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q}`, execID))
	if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "unknown exec_id") || !strings.Contains(r.Text(), "not found again after the server restarted") {
		t.Errorf("status of a one-shot sandbox's job after a restart = %q; want %s unknown exec_id, saying a sandbox's job is not found after a restart", r.Text(), TagInvalid)
	}
}

// TestExecProgressCarriesOutputLine: a command in a session run to its end
// by a client that asked for progress runs as a job, and the progress
// notifications carry its latest output line while it runs; its result is
// the whole output.
func TestExecProgressCarriesOutputLine(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	f.s.progressEvery = 5 * time.Millisecond
	sess := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	send, lines := stdioPipe(t, f.s, "alice")
	type message struct {
		Method string          `json:"method"`
		ID     json.RawMessage `json:"id"`
		Params struct {
			Message string `json:"message"`
		} `json:"params"`
		Result *struct {
			StructuredContent map[string]any `json:"structuredContent"`
		} `json:"result"`
	}
	next := func() message {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("no more messages: %v", lines.Err())
		}
		var m message
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("message %q: %v", lines.Bytes(), err)
		}
		return m
	}
	send(mcptest.InitMsg)
	for string(next().ID) != "1" {
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"vm_agent_exec","arguments":{"vm":"lab/vm1","session":%q,"command":["make"]},"_meta":{"progressToken":"p"}}}`, sess))
	var job string
	for {
		m := next()
		if string(m.ID) == "2" {
			t.Fatalf("the call ended before its job wrote anything: %+v", m)
		}
		if id, _, ok := f.guest.job(sess); ok && job == "" {
			job = id
			f.guest.emit(job, "step 1 of 2")
		}
		if m.Method == "notifications/progress" && strings.HasSuffix(m.Params.Message, ": step 1 of 2") {
			break
		}
	}
	f.guest.emit(job, "step 2 of 2")
	f.guest.end(job, 0)
	for {
		m := next()
		if string(m.ID) != "2" {
			continue
		}
		if m.Result == nil || m.Result.StructuredContent["stdout"] != "step 1 of 2\nstep 2 of 2\n" || m.Result.StructuredContent["exit_code"] != float64(0) {
			t.Fatalf("result = %+v; want exit 0 with both lines", m.Result)
		}
		return
	}
}

// TestExecJobKeptFromOthersPolls: a poll of a one-shot sandbox's exec_id
// that is not its owner's (another grant's, or on another VM, whose helper
// does not know the job) leaves the owner's entry: the owner still reads
// the job, which no restart-style lookup would find again (it has no
// session to prove whose it is).
func TestExecJobKeptFromOthersPolls(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	execID, job := startSandboxJob(t, f)
	f.guest.emit(job, "working")
	// The helper these polls reach does not know the job.
	f.guest.mu.Lock()
	j := f.guest.res.jobs[job]
	delete(f.guest.res.jobs, job)
	f.guest.mu.Unlock()
	for _, p := range []struct{ grant, vm string }{{"bob", "lab/vm1"}, {"alice", "lab/vm2"}} {
		r := f.as(t, p.grant, "vm_agent_exec_status", fmt.Sprintf(`{"vm":%q,"exec_id":%q}`, p.vm, execID))
		if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "unknown exec_id") {
			t.Errorf("status of %s as %s on %s = %q; want %s unknown exec_id", execID, p.grant, p.vm, r.Text(), TagInvalid)
		}
	}
	f.guest.mu.Lock()
	f.guest.res.jobs[job] = j
	f.guest.mu.Unlock()
	r := f.as(t, "alice", "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q}`, execID))
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["stdout"] != "working\n" {
		t.Errorf("the owner's status after others' polls = %q; want the job's output", r.Text())
	}
}

// TestExecJobTableFull: with the server's table of commands full, a job
// in a session still answers its exec_id (found again through its session,
// as after a restart) and reads; a one-shot sandbox's, which nothing would
// find again, is refused naming its pid and started_at for kill_process.
func TestExecJobTableFull(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	sess := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	for {
		if _, err := f.s.env.Execs.AddJob("carol", "lab/vm9", newJobID(), "", f.s.env.Now()); err != nil {
			break
		}
	}
	r := f.as(t, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","session":%q,"command":["make"],"wait":false}`, sess))
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_agent_exec wait: false in a session with the table full = %q; want an exec_id", r.Text())
	}
	execID, _ := r.Result.StructuredContent["exec_id"].(string)
	job, _, ok := f.guest.job(sess)
	if !ok || execID != "j"+job {
		t.Fatalf("exec_id %q for guest job %q; want j<job>", execID, job)
	}
	f.guest.emit(job, "building")
	r = f.as(t, "alice", "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q}`, execID))
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["stdout"] != "building\n" {
		t.Errorf("status of the session's job with the table full = %q; want its output", r.Text())
	}
	r = f.as(t, "alice", "vm_agent_exec", `{"vm":"lab/vm1","command":["make"],"sandbox":{},"wait":false}`)
	if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), "cannot be tracked") || !strings.Contains(r.Text(), "started_at 1767323045000") || !strings.Contains(r.Text(), "kill_process") {
		t.Errorf("vm_agent_exec sandbox wait: false with the table full = %q; want %s cannot be tracked, naming started_at and kill_process", r.Text(), TagBackend)
	}
}

// TestExecProgressEndsItsJobOnFailure: a command run to its end as a job
// (the client asked for progress) whose status cannot be read ends with
// the call: its job is cancelled, not left running with no exec_id that
// would reach it.
func TestExecProgressEndsItsJobOnFailure(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	sess := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	f.guest.mu.Lock()
	f.guest.res.statusFails = true
	f.guest.mu.Unlock()
	r := f.sendAs(t, "alice", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"vm_agent_exec","arguments":{"vm":"lab/vm1","session":%q,"command":["make"]},"_meta":{"progressToken":"p"}}}`, sess))
	if r.Result == nil || !r.Result.IsError {
		t.Fatalf("vm_agent_exec whose job status fails = %q; want an error", r.Text())
	}
	job, _, ok := f.guest.job(sess)
	if !ok {
		t.Fatalf("no job started in %s", sess)
	}
	f.guest.mu.Lock()
	state := f.guest.res.jobs[job].state
	f.guest.mu.Unlock()
	if state == wire.JobRunning {
		t.Errorf("job %s after the call failed is %s; want it cancelled", job, state)
	}
}

// TestExecJobLost: a job the resident helper lost (it ended while the job
// ran) answers lost with the guest's note and no exit code, in its text
// as in its structured content.
func TestExecJobLost(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	_, execID, job := startSessionJob(t, f)
	const note = "the resident helper ended while this job ran"
	f.guest.mu.Lock()
	j := f.guest.res.jobs[job]
	j.state, j.exit, j.note = wire.JobLost, -1, note
	f.guest.mu.Unlock()
	r := f.as(t, "alice", "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q}`, execID))
	if r.Result == nil {
		t.Fatalf("status of a lost job = %q; want a status", r.Text())
	}
	sc := r.Result.StructuredContent
	if _, ok := sc["exit_code"]; ok || sc["state"] != wire.JobLost || sc["note"] != note {
		t.Errorf("status of a lost job = %v; want state lost, its note, no exit_code", sc)
	}
	if want := "lost, no exit code: " + note; !strings.HasPrefix(r.Text(), want) || strings.Contains(r.Text(), "exit -1") {
		t.Errorf("status text of a lost job = %q; want it to start %q and name no exit code", r.Text(), want)
	}
}

// TestReaperKeepsABusySession: a session past its idle time whose wait:
// false command still runs is kept, its idle clock started again, and
// ends once the command has ended and the idle time passed again; while
// the VM's jobs cannot be listed it is kept too, and the reaper says why.
// A session past its ttl ends even with a job running.
func TestReaperKeepsABusySession(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	ctx := context.Background()
	sess := f.createSession(t, "alice", `{"vm":"lab/vm1","idle_s":30}`)
	r := f.as(t, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","session":%q,"command":["make"],"wait":false}`, sess))
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_agent_exec wait: false = %q; want a job", r.Text())
	}
	job, _, _ := f.guest.job(sess)
	capped := f.createSession(t, "alice", `{"vm":"lab/vm1","idle_s":30,"ttl_s":100}`)
	if r := f.as(t, "alice", "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","session":%q,"command":["sleep","1000"],"wait":false}`, capped)); r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_agent_exec wait: false = %q; want a job", r.Text())
	}
	live := func(id string) bool {
		s, err := f.sessions.GetSession(ctx, id)
		return err == nil && s.Deleted.IsZero()
	}
	f.advance(40 * time.Second)
	rep := f.s.env.Guest.Reap(ctx)
	slices.Sort(rep.Busy)
	want := []string{sess, capped}
	slices.Sort(want)
	if !slices.Equal(rep.Busy, want) || len(rep.Destroyed) != 0 || len(rep.Errors) != 0 || !live(sess) || !live(capped) {
		t.Fatalf("reap past idle with jobs running = %+v; want both busy and kept", rep)
	}
	f.guest.mu.Lock()
	f.guest.res.listFails = true
	f.guest.mu.Unlock()
	f.advance(40 * time.Second) // +80 s
	rep = f.s.env.Guest.Reap(ctx)
	if len(rep.Destroyed) != 0 || len(rep.Errors) == 0 || !strings.Contains(rep.Errors[0].Error(), "list its jobs") || !live(sess) {
		t.Fatalf("reap with the job list failing = %+v; want nothing destroyed and the error", rep)
	}
	f.guest.mu.Lock()
	f.guest.res.listFails = false
	f.guest.mu.Unlock()
	f.advance(25 * time.Second) // +105 s: capped is past its ttl, its job still running
	rep = f.s.env.Guest.Reap(ctx)
	if !slices.Equal(rep.Destroyed, []string{capped}) || !slices.Equal(rep.Busy, []string{sess}) || live(capped) || !live(sess) {
		t.Fatalf("reap at +105 s = %+v; want the session past its ttl destroyed, %s busy", rep, sess)
	}
	f.guest.end(job, 0)
	f.advance(31 * time.Second) // +136 s: sess idle for 31 s, its job ended
	rep = f.s.env.Guest.Reap(ctx)
	if !slices.Equal(rep.Destroyed, []string{sess}) || len(rep.Busy) != 0 || live(sess) {
		t.Fatalf("reap after the job ended = %+v; want %s destroyed", rep, sess)
	}
}
