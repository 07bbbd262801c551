package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/mcptest"
)

// The agent's side of every call (issue 17): what an agent gets back when
// the guest or the backend fails, and the fields it passes on.

// TestGuestErrorsReachTheAgent: a failing guest command, a missing file, a
// directory read and a permission error come back with the guest's own
// reason in plain words and what to do next; the audit log keeps the whole
// error.
func TestGuestErrorsReachTheAgent(t *testing.T) {
	reply := func(op, desc string) error {
		// As agentexec.MapError and the driver's prefix make it.
		return fmt.Errorf("qemu: %s: %w: the guest agent answered: %s", op, hypervisor.ErrBackend, desc)
	}
	tests := []struct {
		tool, args string
		err        error
		want       []string
	}{
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["/nonexistent"]}`,
			reply("exec", "Guest agent command failed, error was 'Failed to execute child process “/nonexistent” (No such file or directory)'"),
			[]string{"[BACKEND ERROR] not found: ", "/nonexistent", "(No such file or directory)", "check the path"}},
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["/tmp/tool"]}`,
			reply("exec", "Failed to execute child process “/tmp/tool” (Exec format error)"),
			[]string{"[BACKEND ERROR] not a program this guest can run", "#! line"}},
		{"vm_status", `{"vm":"lab/vm1"}`,
			fmt.Errorf("qemu: status: %w: qga: connect: no such file", hypervisor.ErrAgentUnavailable),
			[]string{"[BACKEND ERROR] the guest agent is not running or does not answer (", "start qemu-guest-agent"}},
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["true"]}`,
			fmt.Errorf("qemu: exec: %w: guest-exec", hypervisor.ErrTimeout),
			[]string{"[TIMED OUT] no result from the guest within 30 s: the VM did not answer in time (", "vm_status shows", "wait: false"}},
	}
	for _, tt := range tests {
		f := newFixture(t, fixtureOpts{})
		drv := hypervisortest.Counting(f.calls)
		drv.ExecStartFunc = func(context.Context, string, hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			return hypervisor.ExecHandle{}, tt.err
		}
		drv.StatusFunc = func(context.Context, string) (hypervisor.Status, error) { return hypervisor.Status{}, tt.err }
		f = newFixture(t, fixtureOpts{driver: drv})
		r := f.call(t, tt.tool, tt.args)
		for _, w := range tt.want {
			if !strings.Contains(r.Text(), w) {
				t.Errorf("%s(%s) = %q; want it to contain %q", tt.tool, tt.args, r.Text(), w)
			}
		}
		if m, _ := r.Result.StructuredContent["message"].(string); !strings.Contains(r.Text(), m) || m == "" {
			t.Errorf("%s(%s) structured message = %q; want the text's message", tt.tool, tt.args, m)
		}
		var detail string
		for _, rec := range f.rec.Records() {
			if rec.Kind == audit.KindOutcome {
				detail = rec.Reason
			}
		}
		if detail != tt.err.Error() {
			t.Errorf("%s(%s) audit outcome reason = %q; want the whole error %q", tt.tool, tt.args, detail, tt.err)
		}
	}
}

// TestFileErrorsReachTheAgent: the file tools run through vmgate-guest;
// its answers for a missing file, a directory and a permission error
// reach the agent in plain words with what to do next, the audit log keeps
// the whole error.
func TestFileErrorsReachTheAgent(t *testing.T) {
	for _, tt := range []struct {
		args  string
		reply hypervisor.ExecResult // as guest/agent/files.go answers
		want  []string
	}{
		{`{"vm":"lab/vm1","path":"/nope"}`, replyErr(wire.CodeNotFound, "", "file read: /nope: no such file or directory"),
			[]string{"[INVALID ARGUMENT] not found: /nope: no such file or directory; check the path"}},
		{`{"vm":"lab/vm1","path":"/etc"}`, replyErr(wire.CodeRefused, wire.ReasonNotRegular, "file read: refused: /etc is a directory"),
			[]string{"[INVALID ARGUMENT] it is a directory, not a file: refused: /etc is a directory; give a file's path; vm_agent_exec with ls lists the directory"}},
		{`{"vm":"lab/vm1","path":"/root/x"}`, replyErr(wire.CodeFailed, "", "file read: open /root/x: permission denied"),
			[]string{"[BACKEND ERROR] the guest helper failed: permission denied: file read: open /root/x: permission denied; the guest agent's user"}},
	} {
		f := newSessFixture(t, haveBins(), "")
		f.guest.file = func([]string, []byte) hypervisor.ExecResult { return tt.reply }
		r := f.as(t, "alice", "vm_file_read", tt.args)
		for _, w := range tt.want {
			if !strings.Contains(r.Text(), w) {
				t.Errorf("vm_file_read(%s) = %q; want it to contain %q", tt.args, r.Text(), w)
			}
		}
		var detail string
		for _, rec := range f.rec.Records() {
			if rec.Kind == audit.KindOutcome && rec.Tool == "vm_file_read" {
				detail = rec.Reason
			}
		}
		var rep wire.Reply
		if err := json.Unmarshal(tt.reply.Stdout, &rep); err != nil || rep.Error == nil || !strings.Contains(detail, rep.Error.Message) {
			t.Errorf("vm_file_read(%s) audit outcome reason = %q; want the guest's whole error", tt.args, detail)
		}
	}
}

// TestFileReadBinaryIsBase64: a file with NUL bytes (valid UTF-8, but not
// text) comes back as content_base64, not as content full of \u0000.
func TestFileReadBinaryIsBase64(t *testing.T) {
	for _, tt := range []struct {
		data   []byte
		binary bool
	}{
		{[]byte("\x7fELF\x02\x01\x01\x00\x00\x00"), true},
		{[]byte{0, 0, 0, 0}, true},
		{[]byte{0xff, 0xfe, 'a'}, true},
		{[]byte("plain text\n\twith a tab é"), false},
	} {
		f := newSessFixture(t, haveBins(), "")
		f.guest.file = func(argv []string, _ []byte) hypervisor.ExecResult {
			return replyData(wire.FileRead{FileInfo: wire.FileInfo{Path: flag(argv, "--path"), Exists: true, Type: "file", Mode: 0o755, Size: int64(len(tt.data))}, Bytes: int64(len(tt.data)), EOF: true}, tt.data)
		}
		sc := f.as(t, "alice", "vm_file_read", `{"vm":"lab/vm1","path":"/bin/x"}`).Result.StructuredContent
		_, hasText := sc["content"]
		b64, hasB64 := sc["content_base64"].(string)
		if hasText == tt.binary || hasB64 != tt.binary {
			t.Errorf("vm_file_read of %q = %v; want content_base64 %v", tt.data, sc, tt.binary)
			continue
		}
		if got, _ := base64.StdEncoding.DecodeString(b64); tt.binary && string(got) != string(tt.data) {
			t.Errorf("vm_file_read of %q: content_base64 decodes to %q", tt.data, got)
		}
	}
}

// vm9Fake answers every call about lab/vm9 (not the backend's) with
// ErrUnknownVM, as a backend does for a name the grant's globs let through.
func vm9Fake(f *fixture) *hypervisortest.Fake {
	drv := hypervisortest.Counting(f.calls)
	unknown := fmt.Errorf("fake: %w", hypervisor.ErrUnknownVM)
	drv.ExecStartFunc = func(context.Context, string, hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
		return hypervisor.ExecHandle{}, unknown
	}
	drv.PowerFunc = func(context.Context, string, hypervisor.PowerAction) error { return unknown }
	return drv
}

// TestUnknownVMSameMessageEveryPath: whether the gate finds the VM unknown
// (no such backend) or the backend does (lab/vm9), the agent gets the same
// message naming the VM and where to look.
func TestUnknownVMSameMessageEveryPath(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f = newFixture(t, fixtureOpts{driver: vm9Fake(f)})
	for _, c := range []struct{ tool, args, vm string }{
		{"vm_status", `{"vm":"lab/vm9"}`, "lab/vm9"},
		{"vm_agent_exec", `{"vm":"lab/vm9","command":["true"]}`, "lab/vm9"},
		{"vm_agent_exec", `{"vm":"lab/vm9","command":["true"],"wait":false}`, "lab/vm9"},
		{"vm_power", `{"vm":"lab/vm9","action":"start"}`, "lab/vm9"},
		{"vm_power", `{"vm":"lab/vm9","action":"reset"}`, "lab/vm9"},
		{"list_sessions", `{"vm":"lab/vm9"}`, "lab/vm9"},
		{"vm_status", `{"vm":"nowhere/vm1"}`, "nowhere/vm1"},
	} {
		r := f.call(t, c.tool, c.args)
		want := fmt.Sprintf(`[UNKNOWN VM] no VM %q (list_vms shows the VMs you can use)`, c.vm)
		if r.Text() != want {
			t.Errorf("%s(%s) = %q; want %q", c.tool, c.args, r.Text(), want)
		}
		if m := r.Result.StructuredContent["message"]; m != strings.TrimPrefix(want, TagUnknownVM+" ") {
			t.Errorf("%s(%s) structured message = %q; want the text's", c.tool, c.args, m)
		}
	}
}

// procFake serves /proc/<pid>/stat and /proc/stat as a Linux guest does.
func procFake(f *fixture, pid int64, startTicks, btime int64) *hypervisortest.Fake {
	drv := hypervisortest.Counting(f.calls)
	drv.FileReadFunc = func(_ context.Context, _, path string, _ int64) (hypervisor.FileContent, error) {
		switch path {
		case fmt.Sprintf("/proc/%d/stat", pid):
			// comm with a space and a parenthesis, as the kernel allows.
			stat := fmt.Sprintf("%d (sl) ep) S 1 %d %d 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 %d 2322432 128 18446744073709551615", pid, pid, pid, startTicks)
			return hypervisor.FileContent{Data: []byte(stat)}, nil
		case "/proc/stat":
			return hypervisor.FileContent{Data: []byte(fmt.Sprintf("cpu  1 2 3 4\nintr 5\nctxt 6\nbtime %d\nprocesses 7\n", btime))}, nil
		}
		return hypervisor.FileContent{}, fmt.Errorf("fake: %w: the guest agent answered: No such file or directory", hypervisor.ErrBackend)
	}
	return drv
}

// TestExecStartedAtIsKillProcesss: vm_agent_exec wait: false returns
// started_at as kill_process takes it (ms since the Unix epoch, the guest's
// start time of the process, as list_processes shows it), and kill_process
// accepts it back.
func TestExecStartedAtIsKillProcesss(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f = newFixture(t, fixtureOpts{driver: procFake(f, 4242, 123456, 1_700_000_000)})
	r := f.call(t, "vm_agent_exec", `{"vm":"lab/vm1","command":["sleep","100"],"wait":false}`)
	got, ok := r.Result.StructuredContent["started_at"].(float64)
	if want := int64(1_700_000_000*1000 + 123456*10); !ok || int64(got) != want {
		t.Fatalf("vm_agent_exec wait:false started_at = %v (%T); want %d ms", r.Result.StructuredContent["started_at"], r.Result.StructuredContent["started_at"], want)
	}
	k := f.call(t, "kill_process", fmt.Sprintf(`{"vm":"lab/vm1","pid":4242,"started_at":%d}`, int64(got)))
	if mcptest.HasTag(k, TagInvalid) {
		t.Errorf("kill_process with exec's started_at = %q; want it accepted", k.Text())
	}
	// A guest that cannot tell leaves started_at out rather than guess.
	g := newFixture(t, fixtureOpts{})
	r = g.call(t, "vm_agent_exec", `{"vm":"lab/vm1","command":["sleep","100"],"wait":false}`)
	if v, ok := r.Result.StructuredContent["started_at"]; ok {
		t.Errorf("vm_agent_exec wait:false without /proc: started_at = %v; want none", v)
	}
}

// TestExecStatusWhileRunning: a running command has exited: false and no
// made-up exit code; its output so far is shown when the guest hands it over.
func TestExecStatusWhileRunning(t *testing.T) {
	for _, partial := range []string{"", "line 1\n"} {
		f := newFixture(t, fixtureOpts{})
		drv := hypervisortest.Counting(f.calls)
		drv.ExecStatusFunc = func(_ context.Context, _ string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			return hypervisor.ExecResult{PID: h.PID, Stdout: []byte(partial)}, nil
		}
		f = newFixture(t, fixtureOpts{driver: drv})
		id := f.call(t, "vm_agent_exec", `{"vm":"lab/vm1","command":["sleep","100"],"wait":false}`).Result.StructuredContent["exec_id"]
		r := f.call(t, "vm_agent_exec_status", fmt.Sprintf(`{"vm":"lab/vm1","exec_id":%q}`, id))
		sc := r.Result.StructuredContent
		if sc["exited"] != false || r.Result.IsError {
			t.Fatalf("exec status while running = %v; want exited false", sc)
		}
		if v, ok := sc["exit_code"]; ok {
			t.Errorf("exec status while running has exit_code %v; want none", v)
		}
		if partial == "" {
			if _, ok := sc["stdout"]; ok || !strings.Contains(r.Text(), "no output so far") {
				t.Errorf("exec status while running, no output = %v %q; want no stdout and a text saying so", sc, r.Text())
			}
		} else if sc["stdout"] != partial || !strings.Contains(r.Text(), "output so far") || !strings.Contains(r.Text(), partial) {
			t.Errorf("exec status while running with output = %v %q; want stdout %q", sc, r.Text(), partial)
		}
	}
}

// TestConditionsSeeDefaults: conditions see the arguments as the handler
// runs them: kill_process without signal is a TERM, exec without timeout_s
// has the default timeout.
func TestConditionsSeeDefaults(t *testing.T) {
	pol := `{"version":"1","default":"allow","tools":{
		"kill_process":{"require":[{"path":"args.signal","op":"in","value":["TERM","KILL"]}]},
		"vm_agent_exec":{"require":[{"path":"args.timeout_s","op":"lte","value":60},{"path":"args.wait","op":"eq","value":true}]}}}`
	f := newFixture(t, fixtureOpts{policy: pol})
	for _, c := range []struct {
		tool, args string
		denied     bool
	}{
		{"kill_process", `{"vm":"lab/vm1","pid":7}`, false},
		{"kill_process", `{"vm":"lab/vm1","pid":7,"signal":"KILL"}`, false},
		{"kill_process", `{"vm":"lab/vm1","pid":7,"signal":"HUP"}`, true},
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["true"]}`, false},
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["true"],"timeout_s":600}`, true},
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["true"],"wait":false}`, true},
	} {
		r := f.call(t, c.tool, c.args)
		if mcptest.HasTag(r, TagDenied) != c.denied {
			t.Errorf("%s(%s) = %q; want denied %v", c.tool, c.args, r.Text(), c.denied)
		}
	}
	// The audit log keeps the arguments as sent.
	for _, rec := range f.rec.Records() {
		if rec.Kind == audit.KindDecision && rec.Tool == "kill_process" {
			if _, ok := rec.Args["signal"]; !ok && rec.Args["pid"] != nil && len(rec.Args) == 2 {
				return
			}
		}
	}
	t.Errorf("no decision record of kill_process with the arguments as sent (no signal)")
}

// TestPowerAlready: start on a running VM and stop on a stopped one say so
// and do not call the backend's power; other actions go through.
func TestPowerAlready(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var powered []string
	drv := hypervisortest.Counting(f.calls)
	drv.StatusFunc = func(_ context.Context, vm string) (hypervisor.Status, error) {
		st := hypervisor.StateRunning
		if vm == "vm2" {
			st = hypervisor.StateStopped
		}
		return hypervisor.Status{Name: vm, State: st}, nil
	}
	drv.PowerFunc = func(_ context.Context, vm string, a hypervisor.PowerAction) error {
		powered = append(powered, vm+" "+string(a))
		return nil
	}
	f = newFixture(t, fixtureOpts{driver: drv})
	for _, c := range []struct {
		vm, action, text string
		done             bool
	}{
		{"lab/vm1", "start", "lab/vm1 was already running; start did nothing", false},
		{"lab/vm2", "stop", "lab/vm2 was already stopped; stop did nothing", false},
		{"lab/vm2", "start", "lab/vm2: start done", true},
		{"lab/vm1", "shutdown", "lab/vm1: shutdown done", true},
	} {
		r := f.call(t, "vm_power", fmt.Sprintf(`{"vm":%q,"action":%q}`, c.vm, c.action))
		if r.Text() != c.text || r.Result.StructuredContent["done"] != c.done {
			t.Errorf("vm_power %s %s = %q %v; want %q done %v", c.vm, c.action, r.Text(), r.Result.StructuredContent, c.text, c.done)
		}
	}
	if want := []string{"vm2 start", "vm1 shutdown"}; fmt.Sprint(powered) != fmt.Sprint(want) {
		t.Errorf("backend power calls = %v; want %v", powered, want)
	}
}

// TestPowerRebootWaitsForTheNewBoot: vm_power reboot and reset return
// once the guest answers with a new boot id (issue 32, finding 11: a
// reboot answered "done" while the next exec still reached the old boot),
// and say why they did not wait when the boot id cannot be read first.
func TestPowerRebootWaitsForTheNewBoot(t *testing.T) {
	const bootA, bootB = "0b5a3f43-7a0e-4f1c-9a55-5d1e4a4d2a01", "7c2e9d10-33b4-4c8e-8f0e-2b9a6e1d5c02"
	for _, c := range []struct {
		name, action string
		readable     bool
		text, key    string
	}{
		{"reboot", "reboot", true, "lab/vm1: reboot done; the guest runs its new boot", "waited_for"},
		{"reset", "reset", true, "lab/vm1: reset done; the guest runs its new boot", "waited_for"},
		{"no boot id", "reboot", false, "lab/vm1: reboot done; not waited for: ", "no_wait"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int64
			var booted atomic.Bool
			var powered []string
			drv := hypervisortest.Counting(&calls)
			drv.ExecStartFunc = func(context.Context, string, hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
				return hypervisor.ExecHandle{}, fmt.Errorf("fake: %w", hypervisor.ErrCommandDisabled)
			}
			drv.FileReadFunc = func(_ context.Context, _, path string, _ int64) (hypervisor.FileContent, error) {
				switch {
				case !c.readable || path != hypervisor.BootIDPath:
					return hypervisor.FileContent{Data: []byte("hello")}, nil
				case booted.Load():
					return hypervisor.FileContent{Data: []byte(bootB + "\n")}, nil
				}
				return hypervisor.FileContent{Data: []byte(bootA + "\n")}, nil
			}
			drv.PowerFunc = func(_ context.Context, vm string, a hypervisor.PowerAction) error {
				powered = append(powered, vm+" "+string(a))
				booted.Store(true)
				return nil
			}
			f := newFixture(t, fixtureOpts{driver: drv})
			r := f.call(t, "vm_power", fmt.Sprintf(`{"vm":"lab/vm1","action":%q}`, c.action))
			sc := r.Result.StructuredContent
			if !strings.HasPrefix(r.Text(), c.text) || sc["done"] != true || sc[c.key] == nil {
				t.Errorf("vm_power %s = %q %v; want %q… done, with %s", c.action, r.Text(), sc, c.text, c.key)
			}
			if c.readable && (sc["waited_for"] != hypervisor.WaitedForNewBoot || sc["boot_id_changed"] != true) {
				t.Errorf("vm_power %s structuredContent = %v; want waited_for %q, boot_id_changed", c.action, sc, hypervisor.WaitedForNewBoot)
			}
			if want := []string{"vm1 " + c.action}; fmt.Sprint(powered) != fmt.Sprint(want) {
				t.Errorf("backend power calls = %v; want %v", powered, want)
			}
		})
	}
}

// TestSessionTimesAndGuestFields: create_session's last_used and
// idle_expires_at are real times (created, created + idle), and
// list_sessions shows the workdir and tracking the guest reports.
func TestSessionTimesAndGuestFields(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	r := f.as(t, "alice", "create_session", `{"vm":"lab/vm1","idle_s":600}`)
	sc := r.Result.StructuredContent
	created := time.Unix(0, f.now.Load()).UTC()
	for k, want := range map[string]time.Time{"created": created, "last_used": created, "idle_expires_at": created.Add(10 * time.Minute)} {
		got, err := time.Parse(time.RFC3339Nano, fmt.Sprint(sc[k]))
		if err != nil || !got.Equal(want) {
			t.Errorf("create_session %s = %v; want %s", k, sc[k], want.Format(time.RFC3339))
		}
	}
	id := sc["session"].(string)
	f.advance(time.Minute)
	l := f.as(t, "alice", "list_sessions", `{"vm":"lab/vm1"}`)
	list, _ := l.Result.StructuredContent["sessions"].([]any)
	if len(list) != 1 {
		t.Fatalf("list_sessions = %v; want the one session", l.Result.StructuredContent)
	}
	v := list[0].(map[string]any)
	if v["workdir"] != "/var/lib/vmgate/sessions/"+id || v["tracking"] != "cgroup" {
		t.Errorf("list_sessions workdir, tracking = %q, %q; want the guest's", v["workdir"], v["tracking"])
	}
	if v["last_used"] != sc["last_used"] || v["idle_expires_at"] != sc["idle_expires_at"] {
		t.Errorf("list_sessions last_used, idle_expires_at = %v, %v; want %v, %v", v["last_used"], v["idle_expires_at"], sc["last_used"], sc["idle_expires_at"])
	}
}

// TestListSessionsLeavesOutLost: a session the guest no longer has (lost
// to a reboot or a revert) is not listed as one; list_sessions names it
// as lost, and lists the sessions the guest still has.
func TestListSessionsLeavesOutLost(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	kept := f.as(t, "alice", "create_session", `{"vm":"lab/vm1"}`).Result.StructuredContent["session"].(string)
	lost := f.as(t, "alice", "create_session", `{"vm":"lab/vm1"}`).Result.StructuredContent["session"].(string)
	f.guest.mu.Lock()
	delete(f.guest.sessions, lost) // the guest rebooted: its sessions' state is gone
	f.guest.mu.Unlock()
	r := f.as(t, "alice", "list_sessions", `{"vm":"lab/vm1"}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("list_sessions = %q; want success", r.Text())
	}
	sc := r.Result.StructuredContent
	list, _ := sc["sessions"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["session"] != kept {
		t.Errorf("list_sessions sessions = %v; want only %s", list, kept)
	}
	if l, _ := sc["lost"].([]any); len(l) != 1 || l[0] != lost {
		t.Errorf("list_sessions lost = %v; want [%s]", sc["lost"], lost)
	}
	if !strings.Contains(r.Text(), lost) || !strings.Contains(r.Text(), "reboot") {
		t.Errorf("list_sessions text = %q; want it to name %s as lost to a reboot or revert", r.Text(), lost)
	}
}
