package server

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/mcptest"
)

// cwdPolicy denies a command whose cwd is under /root, the rule the tricks
// of issue 29 walked past; cwdFollowPolicy adds files.follow_symlinks.
const (
	cwdPolicy       = `{"version":"1","default":"allow","tools":{"vm_agent_exec":{"deny_if":[{"path":"args.cwd","op":"regex","value":"^/root"}]}}}`
	cwdFollowPolicy = `{"version":"1","default":"allow","tools":{"vm_agent_exec":{"deny_if":[{"path":"args.cwd","op":"regex","value":"^/root"}],"files":{"follow_symlinks":true}}}}`
)

// fakeDirs answers vmgate-guest's file stat as a guest with these
// directories, a file, and links /proc/1/root -> /, /tmp/lnk -> /root and
// /tmp/srv -> /srv would.
func fakeDirs(argv []string, _ []byte) hypervisor.ExecResult {
	if len(argv) < 3 || argv[2] != "stat" {
		return replyErr(wire.CodeInvalid, "", "unexpected file command")
	}
	p, follow := flag(argv, "--path"), slices.Contains(argv, "--follow-symlinks")
	links := map[string]string{"/proc/1/root": "/", "/tmp/lnk": "/root", "/tmp/srv": "/srv"}
	real := p
	for link, target := range links {
		if rest, ok := strings.CutPrefix(p, link); ok && (rest == "" || rest[0] == '/') {
			if !follow {
				return replyErr(wire.CodeRefused, wire.ReasonSymlink, fmt.Sprintf("file stat: refused: %s is a symlink (to %q), a directory in it of %s; vmgate follows no symlink the policy does not allow (files.follow_symlinks), and never the last component of a write", link, target, p))
			}
			real = strings.TrimSuffix(target, "/") + rest
		}
	}
	switch real {
	case "/tmp", "/root", "/srv", "/":
		return reply(wire.FileInfo{Path: real, Exists: true, Type: "dir", Mode: 0o755})
	case "/etc/passwd":
		return reply(wire.FileInfo{Path: real, Exists: true, Type: "file", Mode: 0o644})
	}
	return replyErr(wire.CodeNotFound, "", "file stat: "+real+": no such file or directory")
}

// TestExecCwdMeansTheDirectoryItNames: a cwd that is not an absolute, clean
// path is refused before the policy sees it, on both roads (the driver's
// exec and a session's run through vmgate-guest); one that reaches its
// directory through a symlink (a magic link such as /proc/1/root too) is
// refused unless the policy follows symlinks, and then the policy decides
// again on the real directory, where the command runs. Nothing runs for a
// refused cwd.
func TestExecCwdMeansTheDirectoryItNames(t *testing.T) {
	for _, pol := range []struct {
		name, policy string
		cases        []struct{ cwd, tag, says, ran string }
	}{
		{"no follow", cwdPolicy, []struct{ cwd, tag, says, ran string }{
			{"//root", TagInvalid, `not clean (want "/root")`, ""},
			{"/./root", TagInvalid, `not clean (want "/root")`, ""},
			{"/tmp/../root", TagInvalid, `not clean (want "/root")`, ""},
			{"/root/", TagInvalid, `not clean (want "/root")`, ""},
			{"root", TagInvalid, "not absolute", ""},
			{"/root", TagDenied, "", ""},
			{"/proc/1/root/root", TagDenied, `cwd /proc/1/root is a symlink (to "/"), a directory in it of /proc/1/root/root; vmgate enters no working directory through a symlink unless the policy lets vm_agent_exec follow symlinks`, ""},
			{"/tmp/lnk", TagDenied, "cwd /tmp/lnk is a symlink", ""},
			{"/tmp/srv", TagDenied, "cwd /tmp/srv is a symlink", ""},
			{"/etc/passwd", TagInvalid, "cwd /etc/passwd is not a directory", ""},
			{"/nope", TagInvalid, "cwd: ", ""},
			{"/tmp", "", "", "/tmp"},
		}},
		{"follow", cwdFollowPolicy, []struct{ cwd, tag, says, ran string }{
			{"//root", TagInvalid, "not clean", ""},
			{"/proc/1/root/root", TagDenied, "cwd leads through symlinks to /root, which the policy does not allow", ""},
			{"/tmp/lnk", TagDenied, "cwd leads through symlinks to /root, which the policy does not allow", ""},
			{"/tmp/srv", "", "", "/srv"},
			{"/tmp", "", "", "/tmp"},
		}},
	} {
		t.Run(pol.name, func(t *testing.T) {
			f := newSessFixture(t, haveBins(), pol.policy)
			f.guest.file = fakeDirs
			session := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
			for _, road := range []struct{ name, extra, ran string }{
				{"driver", "", "driver:"},
				{"session", fmt.Sprintf(`,"session":%q`, session), "run:"},
			} {
				for _, tc := range pol.cases {
					f.guest.mu.Lock()
					before := len(f.guest.cwds)
					f.guest.mu.Unlock()
					args := fmt.Sprintf(`{"vm":"lab/vm1","command":["pwd"],"cwd":%q%s}`, tc.cwd, road.extra)
					r := f.as(t, "alice", "vm_agent_exec", args)
					f.guest.mu.Lock()
					ran := slices.Clone(f.guest.cwds[before:])
					f.guest.mu.Unlock()
					if tc.tag == "" {
						if r.Result == nil || r.Result.IsError {
							t.Errorf("%s: exec(cwd %q) = %q; want it run", road.name, tc.cwd, r.Text())
						}
						if want := []string{road.ran + tc.ran}; !slices.Equal(ran, want) {
							t.Errorf("%s: exec(cwd %q) ran with %v; want %v", road.name, tc.cwd, ran, want)
						}
						continue
					}
					if !mcptest.HasTag(r, tc.tag) || !strings.Contains(r.Text(), tc.says) {
						t.Errorf("%s: exec(cwd %q) = %q; want %s saying %q", road.name, tc.cwd, r.Text(), tc.tag, tc.says)
					}
					if len(ran) != 0 {
						t.Errorf("%s: exec(cwd %q) was refused but ran with %v", road.name, tc.cwd, ran)
					}
				}
			}
		})
	}
}
