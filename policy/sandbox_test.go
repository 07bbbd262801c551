package policy

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseSandboxErrors(t *testing.T) {
	top := func(sb string) string { return `{"version":"1","default":"deny","sandbox":` + sb + `}` }
	cs := func(sb string) string {
		return `{"version":"1","default":"deny","tools":{"create_session":{"sandbox":` + sb + `}}}`
	}
	exec := func(sb string) string {
		return `{"version":"1","default":"deny","tools":{"vm_agent_exec":{"sandbox":` + sb + `}}}`
	}
	cases := []struct {
		name, doc, at, want string
	}{
		{"not an object", top(`"none"`), `"none"`, `sandbox: want an object, got string`},
		{"unknown field", top(`{"network":"none"}`), `"network"`, `sandbox.network: unknown field "network"`},
		{"case-variant field", cs(`{"Net":"none"}`), `"Net"`, `tools.create_session.sandbox.Net: unknown field "Net" (field names are case-sensitive: did you mean "net"?)`},
		{"unknown net", top(`{"net":"internet"}`), `"internet"`, `sandbox.net: unknown net "internet" (want none, loopback or host)`},
		{"net not a string", top(`{"net":1}`), `1}`, `sandbox.net: want a string, got number`},
		{"unknown user", cs(`{"user":"nobody"}`), `"nobody"`, `tools.create_session.sandbox.user: unknown user "nobody" (want session or root)`},
		{"relative path", top(`{"fs":{"write":["srv"]}}`), `"srv"`, `sandbox.fs.write[0]: path "srv" is not absolute`},
		{"unclean path", top(`{"fs":{"read":["/a","/srv/../etc"]}}`), `"/srv/../etc"`, `sandbox.fs.read[1]: path "/srv/../etc" is not clean (want "/etc")`},
		{"trailing slash", top(`{"fs":{"read":["/srv/"]}}`), `"/srv/"`, `sandbox.fs.read[0]: path "/srv/" is not clean (want "/srv")`},
		{"fs unknown field", top(`{"fs":{"exec":[]}}`), `"exec"`, `sandbox.fs.exec: unknown field "exec" (known: read, write)`},
		{"fs list not a list", top(`{"fs":{"read":"/srv"}}`), `"/srv"`, `sandbox.fs.read: want a list, got string`},
		{"port out of range", top(`{"tcp":{"connect":[443,70000]}}`), `70000`, `sandbox.tcp.connect[1]: port 70000 is not 0 to 65535`},
		{"connect port 0", top(`{"tcp":{"connect":[0]}}`), `0]`, `sandbox.tcp.connect[0]: port 0 cannot be connected to`},
		{"port not an integer", top(`{"tcp":{"bind":[80.5]}}`), `80.5`, `sandbox.tcp.bind[0]: want an integer, got 80.5`},
		{"unknown feature", top(`{"best_effort":["cgroup","seccomp"]}`), `"seccomp"`, `sandbox.best_effort[1]: unknown feature "seccomp" (want landlock, landlock_tcp, netns, mountns, cgroup)`},
		{"on another tool", `{"version":"1","default":"deny","tools":{"kill_process":{"sandbox":{}}}}`, `{}}`, `tools.kill_process.sandbox: a sandbox block belongs on create_session or vm_agent_exec (or the top level), not on kill_process`},
		{"require on create_session", cs(`{"require":true}`), `"require"`, `tools.create_session.sandbox.require: unknown field "require"`},
		{"require at the top", top(`{"require":true}`), `"require"`, `sandbox.require: unknown field "require"`},
		{"require not a boolean", exec(`{"require":"yes"}`), `"yes"`, `tools.vm_agent_exec.sandbox.require: want true or false, got string`},
		{"require with root", exec(`{"require":true,"user":"root"}`), `true`, `tools.vm_agent_exec.sandbox.require: require is true but user is "root"`},
		{"max_timeout_s on another tool", `{"version":"1","default":"deny","tools":{"kill_process":{"max_timeout_s":60}}}`, `60`, `tools.kill_process.max_timeout_s: max_timeout_s belongs on vm_agent_exec, not on kill_process`},
		{"max_timeout_s over a day", `{"version":"1","default":"deny","tools":{"vm_agent_exec":{"max_timeout_s":86401}}}`, `86401`, `tools.vm_agent_exec.max_timeout_s: max_timeout_s 86401 is out of range (want 1 to 86400)`},
		{"max_timeout_s zero", `{"version":"1","default":"deny","tools":{"vm_agent_exec":{"max_timeout_s":0}}}`, `0}`, `tools.vm_agent_exec.max_timeout_s: max_timeout_s 0 is out of range`},
		{"max_timeout_s a string", `{"version":"1","default":"deny","tools":{"vm_agent_exec":{"max_timeout_s":"1h"}}}`, `"1h"`, `tools.vm_agent_exec.max_timeout_s: want an integer, got string`},
		{"second line", "{\"version\":\"1\",\"default\":\"deny\",\n\"sandbox\":{\"net\":\"hots\"}}", `"hots"`, `sandbox.net: unknown net "hots"`},
		{"too many paths", top(`{"fs":{"write":[` + strings.Repeat(`"/a",`, maxSandboxPaths) + `"/a"]}}`), `[`, `sandbox.fs.write: 65 paths; the limit is 64`},
		{"long path", top(`{"fs":{"read":["/` + strings.Repeat("a", maxSandboxPath) + `"]}}`), `"/aa`, `sandbox.fs.read[0]: path is 4097 bytes; the limit is 4096`},
		{"NUL in a path", top(`{"fs":{"read":["/a\u0000b"]}}`), `"/a`, `sandbox.fs.read[0]: path contains NUL`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Parse("policy.json", []byte(tc.doc))
			var errs Errors
			if e != nil || !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("Parse(%s) = %v, %v; want Errors", tc.doc, e, err)
			}
			want := "policy.json:" + position(t, tc.doc, tc.at) + ": " + tc.want
			if got := errs[0].Error(); !strings.HasPrefix(got, want) {
				t.Errorf("Parse first error = %q; want prefix %q", got, want)
			}
		})
	}
}

// args decodes a create_session call's arguments the way the server does
// (numbers as json.Number).
func args(t *testing.T, s string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSandboxDecisions(t *testing.T) {
	loose := `{"version":"1","default":"deny","tools":{"create_session":{"sandbox":{
		"net":"loopback","user":"session","fs":{"read":["/srv/data"],"write":["/srv/out"]},
		"tcp":{"bind":[8080],"connect":[443,80]},"best_effort":["cgroup","landlock_tcp"]}}}}`
	topLevel := `{"version":"1","default":"allow","sandbox":{"net":"host","user":"root"}}`
	none := `{"version":"1","default":"deny","tools":{"create_session":{}}}`
	tcp := &TCPPorts{Bind: []uint16{8080}, Connect: []uint16{80, 443}}
	cases := []struct {
		name, doc, args string
		want            *Sandbox // the Decision's sandbox when allowed
		deny            string   // a substring of the reason when denied
		rule            string
	}{
		{"nothing asked: the policy's", loose, `{}`,
			&Sandbox{Net: "loopback", User: "session", Read: []string{"/srv/data"}, Write: []string{"/srv/out"}, TCP: tcp, BestEffort: []string{"cgroup", "landlock_tcp"}}, "", ""},
		{"tighter everywhere", loose, `{"sandbox":{"net":"none","fs":{"read":["/srv/data/a","/srv/out/b"]},"tcp":{"connect":[443]},"best_effort":[]}}`,
			&Sandbox{Net: "none", User: "session", Read: []string{"/srv/data/a", "/srv/out/b"}, TCP: &TCPPorts{Connect: []uint16{443}}}, "", ""},
		{"looser net", loose, `{"sandbox":{"net":"host"}}`, nil, `sandbox net "host" is looser than the policy's "loopback"`, "/tools/create_session/sandbox"},
		{"looser user", loose, `{"sandbox":{"user":"root"}}`, nil, `sandbox user "root" is looser than the policy's "session"`, "/tools/create_session/sandbox"},
		{"write outside", loose, `{"sandbox":{"fs":{"write":["/srv/data"]}}}`, nil, `sandbox fs.write "/srv/data" is outside the policy's write paths`, "/tools/create_session/sandbox"},
		{"a prefix is not a parent", loose, `{"sandbox":{"fs":{"write":["/srv/outside"]}}}`, nil, `fs.write "/srv/outside" is outside`, "/tools/create_session/sandbox"},
		{"read outside", loose, `{"sandbox":{"fs":{"read":["/etc"]}}}`, nil, `sandbox fs.read "/etc" is outside the policy's read and write paths`, "/tools/create_session/sandbox"},
		{"dot-dot in a call path", loose, `{"sandbox":{"fs":{"write":["/srv/out/../../etc"]}}}`, nil, `sandbox.fs.write[0]: path "/srv/out/../../etc" is not clean`, "/tools/create_session/sandbox"},
		{"another port", loose, `{"sandbox":{"tcp":{"connect":[22]}}}`, nil, `sandbox tcp.connect port 22 is not among the policy's [80 443]`, "/tools/create_session/sandbox"},
		{"looser best effort", loose, `{"sandbox":{"best_effort":["landlock"]}}`, nil, `sandbox best_effort "landlock" is not allowed`, "/tools/create_session/sandbox"},
		{"malformed", loose, `{"sandbox":{"net":true}}`, nil, `sandbox.net: want a string, got boolean`, "/tools/create_session/sandbox"},
		{"unknown field", loose, `{"sandbox":{"seccomp":"strict"}}`, nil, `sandbox: unknown field "seccomp"`, "/tools/create_session/sandbox"},
		{"not an object", loose, `{"sandbox":"none"}`, nil, `sandbox: want an object, got string`, "/tools/create_session/sandbox"},
		{"bad port", loose, `{"sandbox":{"tcp":{"bind":[-1]}}}`, nil, `sandbox.tcp.bind[0]: port -1 is not 0 to 65535`, "/tools/create_session/sandbox"},
		{"top level block for an unlisted tool", topLevel, `{"sandbox":{"net":"host","user":"root","fs":{"write":["/"]}}}`,
			nil, `sandbox fs.write "/" is outside the policy's write paths`, "/sandbox"},
		{"top level block", topLevel, `{"sandbox":{"net":"loopback"}}`, &Sandbox{Net: "loopback", User: "root", BestEffort: []string{"cgroup"}}, "", ""},
		{"no block: the default", none, `{}`, &Sandbox{Net: "none", User: "session", BestEffort: []string{"cgroup"}}, "", ""},
		{"no block: cgroup may be missing", none, `{"sandbox":{"best_effort":["cgroup"]}}`, &Sandbox{Net: "none", User: "session", BestEffort: []string{"cgroup"}}, "", ""},
		{"no block: landlock may not", none, `{"sandbox":{"best_effort":["landlock"]}}`, nil, `best_effort "landlock" is not allowed`, ""},
		{"no block: looser than the default", none, `{"sandbox":{"net":"host"}}`, nil, `the policy has no sandbox block, so the default applies`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := mustParse(t, tc.doc)
			call := Call{Grant: "g", Tool: SandboxTool, VM: "lab/vm1", Args: args(t, tc.args)}
			d := e.Decide(call)
			if tc.deny != "" {
				if d.Verdict != Deny || !strings.Contains(d.Reason, tc.deny) || d.Rule != tc.rule {
					t.Errorf("Decide(%s) = %v %q %q; want deny %q at %q", tc.args, d.Verdict, d.Rule, d.Reason, tc.deny, tc.rule)
				}
				return
			}
			if d.Verdict != Allow || !reflect.DeepEqual(d.Sandbox, tc.want) {
				t.Errorf("Decide(%s) = %v %q, sandbox %+v; want allow with %+v", tc.args, d.Verdict, d.Reason, d.Sandbox, tc.want)
			}
		})
	}
}

func TestSandboxOrderAndIsolation(t *testing.T) {
	e := mustParse(t, `{"version":"1","default":"deny","sandbox":{"net":"host"},"tools":{
		"create_session":{"action":"approve","deny_if":[{"path":"args.ttl_s","op":"gt","value":3600}],"sandbox":{"net":"loopback","fs":{"write":["/srv"]}}},
		"vm_status":{}}}`)
	// deny_if comes first, then the sandbox, then the approval.
	if d := e.Decide(Call{Grant: "g", Tool: SandboxTool, Args: args(t, `{"ttl_s":7200,"sandbox":{"net":"host"}}`)}); d.Rule != "/tools/create_session/deny_if/0" {
		t.Errorf("deny_if and a looser sandbox: rule %q; want the deny_if", d.Rule)
	}
	if d := e.Decide(Call{Grant: "g", Tool: SandboxTool, Args: args(t, `{"sandbox":{"net":"host"}}`)}); d.Verdict != Deny || d.Rule != "/tools/create_session/sandbox" {
		t.Errorf("a looser sandbox under approval = %v %q; want deny, not parked for approval", d.Verdict, d.Rule)
	}
	d := e.Decide(Call{Grant: "g", Tool: SandboxTool, Args: args(t, `{}`)})
	if d.Verdict != Approve || d.Sandbox == nil || d.Sandbox.Net != "loopback" {
		t.Fatalf("Decide(create_session) = %+v; want approve with the tool's sandbox (its block wins over the top level)", d)
	}
	d.Sandbox.Write[0] = "/" // a caller changing its copy changes nothing in the Engine
	if d2 := e.Decide(Call{Grant: "g", Tool: SandboxTool, Args: args(t, `{}`)}); d2.Sandbox.Write[0] != "/srv" {
		t.Errorf("the Engine's sandbox was changed through a Decision: %v", d2.Sandbox.Write)
	}
	if d := e.Decide(Call{Grant: "g", Tool: "vm_status"}); d.Sandbox != nil {
		t.Errorf("Decide(vm_status).Sandbox = %+v; want nil", d.Sandbox)
	}
	_, steps := e.Explain(Call{Grant: "g", Tool: SandboxTool, Args: args(t, `{"sandbox":{"user":"root"}}`)})
	if last := steps[len(steps)-1]; last.Name != "sandbox" || last.Result != "deny" || last.Rule != "/tools/create_session/sandbox" {
		t.Errorf("Explain's last step = %+v; want the sandbox deny", last)
	}
}
