package policy

import (
	"reflect"
	"strings"
	"testing"
)

func TestExecSandboxDecisions(t *testing.T) {
	required := `{"version":"1","default":"deny","tools":{"vm_agent_exec":{"sandbox":{"require":true,"net":"loopback","fs":{"write":["/srv/out"]}},"max_timeout_s":3600}}}`
	optional := `{"version":"1","default":"deny","sandbox":{"net":"host"},"tools":{"vm_agent_exec":{}}}`
	unlisted := `{"version":"1","default":"allow"}`
	policySB := &Sandbox{Net: "loopback", User: "session", Write: []string{"/srv/out"}, BestEffort: []string{"cgroup"}}
	cases := []struct {
		name, doc, args string
		want            *Sandbox // the Decision's sandbox when allowed
		maxTimeout      int64
		deny            string // a substring of the reason when denied
		rule            string
	}{
		{"required, none asked: the policy's", required, `{"command":["id"]}`, policySB, 3600, "", ""},
		{"required, in a session: the session's", required, `{"command":["id"],"session":"s"}`, nil, 3600, "", ""},
		{"required, a tighter one", required, `{"command":["id"],"sandbox":{"net":"none","fs":{}}}`,
			&Sandbox{Net: "none", User: "session", BestEffort: []string{"cgroup"}}, 3600, "", ""},
		{"required, root asked", required, `{"command":["id"],"sandbox":{"user":"root"}}`, nil, 0, `sandbox user "root" is looser than the policy's "session"`, "/tools/vm_agent_exec/sandbox"},
		{"required, write outside", required, `{"command":["id"],"sandbox":{"fs":{"write":["/etc"]}}}`, nil, 0, `fs.write "/etc" is outside`, "/tools/vm_agent_exec/sandbox"},
		{"timeout within the cap", required, `{"command":["id"],"timeout_s":3600}`, policySB, 3600, "", ""},
		{"timeout over the cap", required, `{"command":["id"],"timeout_s":3601}`, nil, 0, `timeout_s 3601 is over the policy's cap of 3600 s`, "/tools/vm_agent_exec/max_timeout_s"},
		{"optional, none asked: unconfined", optional, `{"command":["id"]}`, nil, 0, "", ""},
		{"optional, the top level bounds it", optional, `{"command":["id"],"sandbox":{"net":"host"}}`, &Sandbox{Net: "host", User: "session", BestEffort: []string{"cgroup"}}, 0, "", ""},
		{"optional, looser than the top level", optional, `{"command":["id"],"sandbox":{"user":"root"}}`, nil, 0, `user "root" is looser`, "/sandbox"},
		{"unlisted, the default bounds it", unlisted, `{"command":["id"],"sandbox":{"net":"host"}}`, nil, 0, `the policy has no sandbox block, so the default applies`, ""},
		{"unlisted, none asked", unlisted, `{"command":["id"],"timeout_s":86400}`, nil, 0, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := mustParse(t, tc.doc)
			d := e.Decide(Call{Grant: "g", Tool: ExecTool, VM: "lab/vm1", Args: args(t, tc.args)})
			if tc.deny != "" {
				if d.Verdict != Deny || !strings.Contains(d.Reason, tc.deny) || d.Rule != tc.rule {
					t.Errorf("Decide(%s) = %v %q %q; want deny %q at %q", tc.args, d.Verdict, d.Rule, d.Reason, tc.deny, tc.rule)
				}
				return
			}
			if d.Verdict != Allow || !reflect.DeepEqual(d.Sandbox, tc.want) || d.MaxTimeoutS != tc.maxTimeout {
				t.Errorf("Decide(%s) = %v %q, sandbox %+v, max_timeout_s %d; want allow with %+v, %d", tc.args, d.Verdict, d.Reason, d.Sandbox, d.MaxTimeoutS, tc.want, tc.maxTimeout)
			}
		})
	}
}

func TestExecSandboxExplained(t *testing.T) {
	e := mustParse(t, `{"version":"1","default":"deny","tools":{"vm_agent_exec":{"sandbox":{"require":true},"max_timeout_s":60}}}`)
	_, steps := e.Explain(Call{Grant: "g", Tool: ExecTool, Args: args(t, `{"command":["id"],"timeout_s":61}`)})
	var names []string
	for _, s := range steps {
		names = append(names, s.Name+":"+s.Result)
	}
	got := strings.Join(names, " ")
	for _, want := range []string{"sandbox:pass", "max_timeout_s:deny"} {
		if !strings.Contains(got, want) {
			t.Errorf("Explain steps = %s; want %s among them", got, want)
		}
	}
}
