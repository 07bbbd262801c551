package server

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/tools"
)

// fakeEnforced is what the fake guest says holds for a sandboxed session:
// everything asked for, on a kernel with Landlock ABI 4 and cgroup v2.
func fakeEnforced(id string, sb wire.Sandbox) wire.Enforced {
	return wire.Enforced{
		Sandboxed: true, User: sb.User, UID: 1900000042, GID: 1900000042, NoNewPrivs: true, Capabilities: "none",
		Landlock: wire.LandlockReport{ABI: 4, FS: true, Rights: []string{"execute", "write_file", "read_file"},
			Write: append([]string{"/var/lib/vmgate/sessions/" + id}, sb.FS.Write...), Read: sb.FS.Read},
		Net:        wire.NetReport{Mode: sb.Net, Namespace: sb.Net != wire.NetHost, LoopbackUp: true},
		PrivateTmp: true,
		Cgroup:     wire.CgroupReport{Path: "/vmgate/" + id, Controllers: []string{"cpu", "memory", "pids"}, Limits: "cgroup"},
		Membership: wire.MemberCgroup,
	}
}

// sentSandbox is the --sandbox the fake guest got with its last session
// create, decoded; ok false when there was none.
func (g *fakeGuest) sentSandbox(t *testing.T) (sb wire.Sandbox, ok bool) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := len(g.argvs) - 1; i >= 0; i-- {
		a := g.argvs[i]
		if len(a) < 3 || a[0] != guestctl.GuestPath || a[1] != "session" || a[2] != "create" {
			continue
		}
		raw := flag(a, "--sandbox")
		if raw == "" {
			return sb, false
		}
		if err := json.Unmarshal([]byte(raw), &sb); err != nil {
			t.Fatalf("--sandbox %q: %v", raw, err)
		}
		return sb, true
	}
	return sb, false
}

// ceilingPolicy lets create_session ask for at most net host, root, read
// /srv and /opt/data, write /srv/out; cgroup and mountns may be missing.
const ceilingPolicy = `{"version":"1","default":"allow","tools":{"create_session":{"sandbox":{
	"net":"host","user":"root","fs":{"read":["/srv","/opt/data"],"write":["/srv/out"]},"best_effort":["cgroup","mountns"]}}}}`

// TestCreateSessionSandbox: the policy's sandbox, with the call's asks
// within it, is what reaches the guest; a looser ask is denied naming the
// field, a malformed one is an invalid argument, and neither reaches the guest.
func TestCreateSessionSandbox(t *testing.T) {
	tests := []struct {
		name, policy, sandbox string // sandbox: the call's argument, "" for none
		want                  wire.Sandbox
	}{
		{"default policy, no ask", mcptest.AllowAll, "", wire.Sandbox{Net: "none", User: "session", BestEffort: []wire.Feature{"cgroup"}}},
		{"default policy, tighter ask", mcptest.AllowAll, `{"net":"none","user":"session"}`, wire.Sandbox{Net: "none", User: "session", BestEffort: []wire.Feature{"cgroup"}}},
		{"ceiling, no ask gets the ceiling", ceilingPolicy, "",
			wire.Sandbox{Net: "host", User: "root", FS: wire.FSAccess{Read: []string{"/opt/data", "/srv"}, Write: []string{"/srv/out"}}, BestEffort: []wire.Feature{"cgroup", "mountns"}}},
		{"ceiling, tighter ask", ceilingPolicy, `{"net":"loopback","user":"session","fs":{"read":["/srv/in"],"write":[]}}`,
			wire.Sandbox{Net: "loopback", User: "session", FS: wire.FSAccess{Read: []string{"/srv/in"}}, BestEffort: []wire.Feature{"cgroup", "mountns"}}},
		{"ceiling, write inside the write path", ceilingPolicy, `{"fs":{"write":["/srv/out/a"]}}`,
			wire.Sandbox{Net: "host", User: "root", FS: wire.FSAccess{Write: []string{"/srv/out/a"}}, BestEffort: []wire.Feature{"cgroup", "mountns"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newSessFixture(t, haveBins(), tt.policy)
			args := `{"vm":"lab/vm1"}`
			if tt.sandbox != "" {
				args = `{"vm":"lab/vm1","sandbox":` + tt.sandbox + `}`
			}
			r := f.as(t, "alice", "create_session", args)
			if r.Result == nil || r.Result.IsError {
				t.Fatalf("create_session(%s) = %q; want success", args, r.Text())
			}
			got, ok := f.guest.sentSandbox(t)
			if !ok {
				t.Fatalf("create_session(%s) sent no --sandbox; want %+v", args, tt.want)
			}
			if gj, wj := mustJSON(t, got), mustJSON(t, tt.want); gj != wj {
				t.Errorf("create_session(%s) sent sandbox %s; want %s", args, gj, wj)
			}
			enf, _ := r.Result.StructuredContent["enforced"].(map[string]any)
			if enf["sandboxed"] != true || enf["uid"] != float64(1900000042) {
				t.Errorf("create_session(%s) enforced = %v; want the guest's report (sandboxed, uid 1900000042)", args, enf)
			}
			if txt := r.Text(); !strings.Contains(txt, "confined: user "+string(tt.want.User)+" (uid 1900000042") || !strings.Contains(txt, "Landlock ABI 4") {
				t.Errorf("create_session(%s) text = %q; want what is confined, uid and Landlock ABI", args, txt)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCreateSessionSandboxRefused: looser asks are [POLICY DENIED] naming
// what was too loose, malformed ones [INVALID ARGUMENT] naming the field;
// none reaches the guest or the session store.
func TestCreateSessionSandboxRefused(t *testing.T) {
	many := make([]string, wire.MaxSandboxPaths+1)
	for i := range many {
		many[i] = fmt.Sprintf(`"/srv/p%d"`, i)
	}
	tests := []struct {
		name, policy, sandbox, tag string
		says                       []string
	}{
		{"net host over the default", mcptest.AllowAll, `{"net":"host"}`, TagDenied, []string{`net "host" is looser than the policy's "none"`, "no sandbox block"}},
		{"net loopback over the default", mcptest.AllowAll, `{"net":"loopback"}`, TagDenied, []string{`net "loopback"`}},
		{"root over the default", mcptest.AllowAll, `{"user":"root"}`, TagDenied, []string{`user "root" is looser`}},
		{"write outside the ceiling", ceilingPolicy, `{"fs":{"write":["/srv"]}}`, TagDenied, []string{`fs.write "/srv" is outside the policy's write paths`}},
		{"write beside the ceiling", ceilingPolicy, `{"fs":{"write":["/srv/outside"]}}`, TagDenied, []string{`fs.write "/srv/outside"`}},
		{"read /etc", ceilingPolicy, `{"fs":{"read":["/etc"]}}`, TagDenied, []string{`fs.read "/etc" is outside`}},
		{"read / over the default", mcptest.AllowAll, `{"fs":{"read":["/"]}}`, TagDenied, []string{`fs.read "/"`}},
		{"unknown field", mcptest.AllowAll, `{"net":"none","exec":true}`, TagInvalid, []string{"sandbox.exec: unknown argument"}},
		{"unknown fs field", mcptest.AllowAll, `{"fs":{"exec":["/bin"]}}`, TagInvalid, []string{"sandbox.fs.exec: unknown argument"}},
		{"best_effort is the policy's", mcptest.AllowAll, `{"best_effort":["landlock"]}`, TagInvalid, []string{"sandbox.best_effort: unknown argument"}},
		{"unknown net", mcptest.AllowAll, `{"net":"bridge"}`, TagInvalid, []string{"sandbox.net", "bridge"}},
		{"unknown user", mcptest.AllowAll, `{"user":"nobody"}`, TagInvalid, []string{"sandbox.user"}},
		{"sandbox not an object", mcptest.AllowAll, `"none"`, TagInvalid, []string{"sandbox: want an object"}},
		{"sandbox null", mcptest.AllowAll, `null`, TagInvalid, []string{"sandbox: want an object"}},
		{"relative path", ceilingPolicy, `{"fs":{"read":["srv/in"]}}`, TagInvalid, []string{"sandbox.fs.read[0]", "not absolute"}},
		{"dot-dot path", ceilingPolicy, `{"fs":{"write":["/srv/out/../../etc"]}}`, TagInvalid, []string{"sandbox.fs.write[0]", "not clean"}},
		{"dot path", ceilingPolicy, `{"fs":{"write":["/srv/out/./x"]}}`, TagInvalid, []string{"not clean"}},
		{"trailing slash", ceilingPolicy, `{"fs":{"write":["/srv/out/"]}}`, TagInvalid, []string{"not clean"}},
		{"double slash", ceilingPolicy, `{"fs":{"read":["//srv"]}}`, TagInvalid, []string{"not clean"}},
		{"empty path", ceilingPolicy, `{"fs":{"read":[""]}}`, TagInvalid, []string{"empty path"}},
		{"NUL in a path", ceilingPolicy, `{"fs":{"read":["/srv\u0000/etc"]}}`, TagInvalid, []string{"NUL"}},
		{"huge path", ceilingPolicy, `{"fs":{"read":["/srv/` + strings.Repeat("a", 5000) + `"]}}`, TagInvalid, []string{"the limit is 4096"}},
		{"too many paths", ceilingPolicy, `{"fs":{"read":[` + strings.Join(many, ",") + `]}}`, TagInvalid, []string{"sandbox.fs.read", "more than 64 items"}},
		{"path not a string", ceilingPolicy, `{"fs":{"read":[7]}}`, TagInvalid, []string{"sandbox.fs.read[0]: want a string"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newSessFixture(t, haveBins(), tt.policy)
			args := `{"vm":"lab/vm1","sandbox":` + tt.sandbox + `}`
			r := f.as(t, "alice", "create_session", args)
			if !mcptest.HasTag(r, tt.tag) {
				t.Fatalf("create_session(%.200s) = %.300q; want %s", args, r.Text(), tt.tag)
			}
			for _, s := range tt.says {
				if !strings.Contains(r.Text(), s) {
					t.Errorf("create_session(%.200s) = %.300q; want it to say %q", args, r.Text(), s)
				}
			}
			if n := f.guest.count(guestctl.GuestPath, "session", "create"); n != 0 {
				t.Errorf("a refused create reached the guest %d times; want 0", n)
			}
			if l, err := f.sessions.ListSessions(t.Context(), "alice", ""); err != nil || len(l) != 0 {
				t.Errorf("sessions stored = %v, %v; want none", l, err)
			}
		})
	}
}

// TestCreateSessionSandboxUnavailable: a guest whose kernel lacks a
// feature the policy requires refuses; the agent gets a [BACKEND ERROR]
// naming the feature and who can allow going without it, and nothing is
// left in the store. The same kernel serves a policy that allows it.
func TestCreateSessionSandboxUnavailable(t *testing.T) {
	f := newSessFixture(t, haveBins(), mcptest.AllowAll)
	f.guest.lacks = []wire.Feature{wire.FeatureLandlock}
	r := f.as(t, "alice", "create_session", `{"vm":"lab/vm1"}`)
	if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), "landlock") || !strings.Contains(r.Text(), "best_effort is the grant's policy's to set") {
		t.Fatalf("create_session on a guest without Landlock = %q; want %s naming landlock and best_effort", r.Text(), TagBackend)
	}
	if r.Result.StructuredContent["refused"] != wire.ReasonSandboxUnavailable {
		t.Errorf("structured = %v; want refused %q", r.Result.StructuredContent, wire.ReasonSandboxUnavailable)
	}
	if l, err := f.sessions.ListSessions(t.Context(), "alice", ""); err != nil || len(l) != 0 {
		t.Errorf("live sessions stored = %+v, %v; want none", l, err)
	}

	lenient := `{"version":"1","default":"allow","sandbox":{"best_effort":["landlock","cgroup"]}}`
	f2 := newSessFixture(t, haveBins(), lenient)
	f2.guest.lacks = []wire.Feature{wire.FeatureLandlock}
	f2.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	if sb, _ := f2.guest.sentSandbox(t); !slices.Contains(sb.BestEffort, wire.FeatureLandlock) {
		t.Errorf("sent best_effort %v; want landlock among them (the policy's top-level block)", sb.BestEffort)
	}
}

// TestListSessionsEnforced: list_sessions says, per session, what the
// guest enforces.
func TestListSessionsEnforced(t *testing.T) {
	f := newSessFixture(t, haveBins(), mcptest.AllowAll)
	id := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	r := f.as(t, "alice", "list_sessions", `{"vm":"lab/vm1"}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("list_sessions = %q; want success", r.Text())
	}
	list, _ := r.Result.StructuredContent["sessions"].([]any)
	if len(list) != 1 {
		t.Fatalf("list_sessions = %v; want one session", r.Result.StructuredContent)
	}
	v, _ := list[0].(map[string]any)
	enf, _ := v["enforced"].(map[string]any)
	cg, _ := enf["cgroup"].(map[string]any)
	ll, _ := enf["landlock"].(map[string]any)
	if v["session"] != id || enf["sandboxed"] != true || enf["uid"] != float64(1900000042) || ll["abi"] != float64(4) || fmt.Sprint(cg["controllers"]) != "[cpu memory pids]" {
		t.Errorf("list_sessions session = %v; want %s with its enforcement (uid, Landlock ABI 4, cgroup controllers)", v, id)
	}
	sb, _ := v["sandbox"].(map[string]any)
	if sb["net"] != "none" || sb["user"] != "session" {
		t.Errorf("list_sessions sandbox = %v; want net none, user session", sb)
	}
	if !strings.Contains(r.Text(), "confined: user session (uid 1900000042") {
		t.Errorf("list_sessions text = %q; want what is confined", r.Text())
	}
}

// TestExecEnvReserved: no exec road takes a VMGATE_* variable in env, in
// any case: plain exec, exec in a session, wait false. Nothing reaches
// the guest.
func TestExecEnvReserved(t *testing.T) {
	f := newSessFixture(t, haveBins(), mcptest.AllowAll)
	id := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	before := f.guest.count()
	for _, key := range []string{"VMGATE_SESSION", "vmgate_session", "VmGaTe_SeSsIoN", "VMGATE_X", "VMGATE_", "vmgate_driver_plugin"} {
		for _, extra := range []string{``, `,"session":"` + id + `"`, `,"wait":false`} {
			args := fmt.Sprintf(`{"vm":"lab/vm1","command":["env"],"env":{"OK":"1",%q:"%s.secret"}%s}`, key, id, extra)
			r := f.as(t, "alice", "vm_agent_exec", args)
			if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "env."+key) || !strings.Contains(r.Text(), "VMGATE_* variables are reserved") {
				t.Errorf("vm_agent_exec(%s) = %q; want %s naming env.%s as reserved", args, r.Text(), TagInvalid, key)
			}
		}
	}
	for _, key := range []string{"VMGATEX", "MY_VMGATE_SESSION", "VMGAT_SESSION"} {
		args := fmt.Sprintf(`{"vm":"lab/vm1","command":["env"],"env":{%q:"1"},"session":%q}`, key, id)
		if r := f.as(t, "alice", "vm_agent_exec", args); r.Result == nil || r.Result.IsError {
			t.Errorf("vm_agent_exec(%s) = %q; want success (not a VMGATE_ name)", args, r.Text())
		}
	}
	if got, want := f.guest.count(), before+3; got != want {
		t.Errorf("guest commands = %d; want %d (only the three allowed runs)", got, want)
	}
}

// TestSessionExecSandboxNote: a command in a session refused an access
// comes back with its own stderr and a note on what the sandbox allows; a
// command that succeeds or fails otherwise gets no note.
func TestSessionExecSandboxNote(t *testing.T) {
	f := newSessFixture(t, haveBins(), mcptest.AllowAll)
	id := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	r := f.as(t, "alice", "vm_agent_exec", `{"vm":"lab/vm1","shell":"echo x > /root/x","session":"`+id+`"}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_agent_exec = %q; want the command's result", r.Text())
	}
	if txt := r.Text(); !strings.Contains(txt, "exit 2") || !strings.Contains(txt, "Permission denied") || !strings.Contains(txt, "sessions are sandboxed") {
		t.Errorf("vm_agent_exec text = %q; want exit 2, the shell's Permission denied and the sandbox note", txt)
	}
	if r.Result.StructuredContent["sandbox_note"] != tools.SandboxNote {
		t.Errorf("structured = %v; want sandbox_note", r.Result.StructuredContent)
	}
	r = f.as(t, "alice", "vm_agent_exec", `{"vm":"lab/vm1","shell":"true","session":"`+id+`"}`)
	if _, ok := r.Result.StructuredContent["sandbox_note"]; ok || strings.Contains(r.Text(), "sandboxed") {
		t.Errorf("vm_agent_exec(true) = %q; want no sandbox note", r.Text())
	}
	// Issue 32: a write path the guest says Unix permissions block is named.
	r = f.as(t, "alice", "vm_agent_exec", `{"vm":"lab/vm1","shell":"echo x > /data/x","session":"`+id+`"}`)
	want := `the policy lets it write "/data" ("owned by root, mode 0755: the session's uid cannot write"), but the guest's own file permissions do not`
	if note, _ := r.Result.StructuredContent["sandbox_note"].(string); !strings.Contains(note, want) || !strings.Contains(r.Text(), want) {
		t.Errorf("vm_agent_exec(write /data) = %q; want the note to say %q", r.Text(), want)
	}
	// Issue 29: a read-only mount's refusal gets the note too.
	r = f.as(t, "alice", "vm_agent_exec", `{"vm":"lab/vm1","shell":"truncate -s 1 /data/ww","session":"`+id+`"}`)
	if r.Result.StructuredContent["sandbox_note"] != tools.SandboxNote {
		t.Errorf("vm_agent_exec(truncate) = %q; want the sandbox note", r.Text())
	}
}
