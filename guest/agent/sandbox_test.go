//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

func TestPlan(t *testing.T) {
	full := kernel{landlockABI: 7, netns: true, mountns: true, mountAPI: true, cgroup: true}
	old := kernel{} // no Landlock, no namespaces, no cgroup v2
	lab := kernel{landlockABI: 2, netns: true, mountns: true, mountAPI: true, cgroup: true}
	all := wire.Sandbox{BestEffort: wire.Features()}
	tcp := &wire.TCPPorts{Connect: []uint16{443}}
	tests := []struct {
		name    string
		sb      wire.Sandbox
		k       kernel
		refused []string // features named in the refusal; nil: accepted
		check   func(t *testing.T, e wire.Enforced)
	}{
		{name: "tightest on a full kernel", k: full, check: func(t *testing.T, e wire.Enforced) {
			if !e.Landlock.FS || e.Landlock.ABI != 7 || !e.Net.Namespace || !e.Net.LoopbackUp || e.Net.GuestLoopback ||
				!e.PrivateTmp || e.Membership != wire.MemberCgroup || e.Capabilities != "none" || !e.NoNewPrivs || len(e.NotEnforced) != 0 {
				t.Errorf("plan = %+v; want everything held", e)
			}
			if !slices.Contains(e.Landlock.Rights, "truncate") || slices.Contains(e.Landlock.Unhandled, "truncate") || len(e.Landlock.Scoped) != 0 {
				t.Errorf("rights %v, unhandled %v, scoped %v; want truncate handled, no scopes for a session uid", e.Landlock.Rights, e.Landlock.Unhandled, e.Landlock.Scoped)
			}
		}},
		{name: "lab kernel: ABI 2 lacks truncate", k: lab, check: func(t *testing.T, e wire.Enforced) {
			if !e.Landlock.FS || !slices.Contains(e.Landlock.Rights, "refer") || !slices.Contains(e.Landlock.Unhandled, "truncate") {
				t.Errorf("landlock = %+v; want refer handled, truncate unhandled", e.Landlock)
			}
		}},
		{name: "tcp rules on ABI 2 are required", sb: wire.Sandbox{Net: wire.NetHost, TCP: tcp}, k: lab, refused: []string{"landlock_tcp"}},
		{name: "tcp rules on ABI 2, best effort", sb: wire.Sandbox{Net: wire.NetHost, TCP: tcp, BestEffort: []wire.Feature{wire.FeatureLandlockTCP}}, k: lab,
			check: func(t *testing.T, e wire.Enforced) {
				if e.Landlock.TCP || !hasNote(e, "TCP ports are not limited") {
					t.Errorf("plan = %+v; want tcp not enforced, and said", e)
				}
			}},
		{name: "tcp rules on ABI 7", sb: wire.Sandbox{Net: wire.NetHost, TCP: tcp}, k: full, check: func(t *testing.T, e wire.Enforced) {
			if !e.Landlock.TCP || e.Net.Namespace || !e.Net.GuestLoopback {
				t.Errorf("plan = %+v; want tcp enforced in the guest's network", e)
			}
		}},
		{name: "old kernel, everything required", k: old, refused: []string{"landlock", "netns", "mountns", "cgroup"}},
		{name: "old kernel, best effort", sb: all, k: old, check: func(t *testing.T, e wire.Enforced) {
			if e.Landlock.FS || e.Net.Namespace || e.PrivateTmp || e.Membership != wire.MemberUID || e.Cgroup.Limits != "rlimit" || len(e.NotEnforced) != 4 {
				t.Errorf("plan = %+v; want uid membership, rlimits and four things said", e)
			}
		}},
		{name: "old kernel, root, best effort", sb: wire.Sandbox{User: wire.UserRoot, BestEffort: wire.Features()}, k: old, check: func(t *testing.T, e wire.Enforced) {
			if e.Membership != wire.MemberSecret || e.Capabilities != "all" || !hasNote(e, "user root") {
				t.Errorf("plan = %+v; want secret membership, root's capabilities, said", e)
			}
		}},
		{name: "root scopes signals on ABI 6+", sb: wire.Sandbox{User: wire.UserRoot}, k: full, check: func(t *testing.T, e wire.Enforced) {
			if !slices.Contains(e.Landlock.Scoped, "signal") {
				t.Errorf("scoped = %v; want signal", e.Landlock.Scoped)
			}
		}},
		{name: "loopback holds as none", sb: wire.Sandbox{Net: wire.NetLoopback}, k: full, check: func(t *testing.T, e wire.Enforced) {
			if !e.Net.Namespace || e.Net.GuestLoopback || !hasNote(e, "net loopback") {
				t.Errorf("net = %+v, notes %q; want a namespace, said", e.Net, e.NotEnforced)
			}
		}},
		{name: "held by, lab kernel", k: lab, check: func(t *testing.T, e wire.Enforced) {
			wantHeld(t, e, map[string]string{"truncate": wire.HeldMount, "chmod": wire.HeldMount, "xattr": wire.HeldMount,
				"write": wire.HeldBoth, "link": wire.HeldBoth, "read": wire.HeldLandlock, "ioctl_dev": wire.HeldUID})
		}},
		{name: "held by, full kernel", k: full, check: func(t *testing.T, e wire.Enforced) {
			wantHeld(t, e, map[string]string{"truncate": wire.HeldBoth, "chown": wire.HeldMount, "ioctl_dev": wire.HeldLandlock})
		}},
		{name: "no mount_setattr is required", k: kernel{landlockABI: 2, netns: true, mountns: true, cgroup: true}, refused: []string{"mountns"}},
		{name: "no mount_setattr, best effort", sb: wire.Sandbox{BestEffort: []wire.Feature{wire.FeatureMountNS}},
			k: kernel{landlockABI: 2, netns: true, mountns: true, cgroup: true}, check: func(t *testing.T, e wire.Enforced) {
				if !e.PrivateTmp || e.ReadOnlyOutside || !hasNote(e, "not mounted read-only") {
					t.Errorf("plan = %+v; want a private /tmp, nothing read-only, said", e)
				}
				wantHeld(t, e, map[string]string{"truncate": wire.HeldUID, "write": wire.HeldLandlock})
			}},
		{name: "held by, root without Landlock", sb: wire.Sandbox{User: wire.UserRoot, BestEffort: wire.Features()},
			k: kernel{netns: true, mountns: true, mountAPI: true}, check: func(t *testing.T, e wire.Enforced) {
				wantHeld(t, e, map[string]string{"write": wire.HeldNothing, "chmod": wire.HeldNothing})
			}},
		{name: "no netns for net host is fine", sb: wire.Sandbox{Net: wire.NetHost}, k: kernel{landlockABI: 1, mountns: true, mountAPI: true, cgroup: true}, check: func(t *testing.T, e wire.Enforced) {
			if len(e.NotEnforced) != 0 {
				t.Errorf("notes = %q; want none", e.NotEnforced)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := plan(tt.sb.Normalized(), tt.k)
			if tt.refused != nil {
				var we *wire.Error
				if !errors.As(err, &we) || we.Code != wire.CodeRefused || we.Reason != wire.ReasonSandboxUnavailable {
					t.Fatalf("plan(%+v) = %v; want refused", tt.sb, err)
				}
				for _, f := range wire.Features() {
					if named := strings.Contains(we.Message, string(f)+" ("); named != slices.Contains(tt.refused, string(f)) {
						t.Errorf("refusal %q names %s: %v; want %v", we.Message, f, named, !named)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("plan(%+v) = %v; want nil", tt.sb, err)
			}
			tt.check(t, e)
		})
	}
}

// wantHeld checks some of e.HeldBy, and that it names every right.
func wantHeld(t *testing.T, e wire.Enforced, want map[string]string) {
	t.Helper()
	if len(e.HeldBy) != len(heldRights) {
		t.Errorf("HeldBy = %v; want all %d rights", e.HeldBy, len(heldRights))
	}
	for r, w := range want {
		if got := e.HeldBy[r]; got != w {
			t.Errorf("HeldBy[%s] = %q; want %q", r, got, w)
		}
	}
}

func hasNote(e wire.Enforced, s string) bool {
	return slices.ContainsFunc(e.NotEnforced, func(n string) bool { return strings.Contains(n, s) })
}

func TestSandboxValidate(t *testing.T) {
	long := "/" + strings.Repeat("a", wire.MaxPathLen)
	many := make([]string, wire.MaxSandboxPaths+1)
	for i := range many {
		many[i] = "/p" + strconv.Itoa(i)
	}
	bad := []wire.Sandbox{
		{Net: "internet"},
		{Net: "None"},
		{User: "nobody"},
		{FS: wire.FSAccess{Read: []string{"relative"}}},
		{FS: wire.FSAccess{Write: []string{"/srv/../etc"}}},
		{FS: wire.FSAccess{Write: []string{"/srv/"}}},
		{FS: wire.FSAccess{Write: []string{""}}},
		{FS: wire.FSAccess{Read: []string{"/a\x00b"}}},
		{FS: wire.FSAccess{Read: []string{long}}},
		{FS: wire.FSAccess{Write: many}},
		{TCP: &wire.TCPPorts{Connect: []uint16{0}}},
		{TCP: &wire.TCPPorts{Bind: make([]uint16, wire.MaxPorts+1)}},
		{BestEffort: []wire.Feature{"seccomp"}},
	}
	for _, sb := range bad {
		if err := sb.Validate(); !errors.Is(err, wire.ErrInvalidSandbox) {
			t.Errorf("Validate(%+v) = %v; want ErrInvalidSandbox", sb, err)
		}
	}
	good := wire.Sandbox{Net: wire.NetHost, User: wire.UserRoot, FS: wire.FSAccess{Read: []string{"/srv"}, Write: []string{"/"}},
		TCP: &wire.TCPPorts{Bind: []uint16{0}, Connect: []uint16{443}}, BestEffort: wire.Features()}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate(%+v) = %v; want nil", good, err)
	}
	n := wire.Sandbox{FS: wire.FSAccess{Read: []string{"/b", "/a", "/b"}}}.Normalized()
	if n.Net != wire.NetNone || n.User != wire.UserSession || !slices.Equal(n.FS.Read, []string{"/a", "/b"}) {
		t.Errorf("Normalized() = %+v; want net none, user session, sorted unique paths", n)
	}
}

// sandboxAgent is a host agent whose root the session uids can reach.
func sandboxAgent(t testing.TB) *Agent {
	t.Helper()
	a := hostAgent(t)
	letOthersEnter(t, a.cfg.Root)
	return a
}

// letOthersEnter gives dir and every directory above it o+x (and g+x),
// so that a session's uid can reach its directories below dir.
func letOthersEnter(t testing.TB, dir string) {
	t.Helper()
	for ; dir != "/"; dir = filepath.Dir(dir) {
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(dir, st.Mode().Perm()|0o011); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestHostSandboxedSession runs a sandboxed session on the host (root, no
// cgroup v2): its processes run as the session's uid without capabilities,
// under no_new_privs and Landlock, in a network namespace of their own with
// a private /tmp; they write in the workdir and nowhere else; destroy kills
// them by uid even after they cleared their marker and daemonized.
func TestHostSandboxedSession(t *testing.T) {
	k := (&Agent{cfg: DefaultConfig()}).probeKernel()
	if k.landlockABI == 0 || !k.netns || !k.mountns {
		t.Skipf("this host kernel lacks Landlock or namespaces (%+v); the lab VM test covers the sandbox", k)
	}
	a := sandboxAgent(t)
	ctx := context.Background()
	id := "5a4db0c5a4db0c000001"
	s, err := a.SessionCreate(ctx, wire.SessionCreate{ID: id, Limits: wire.Limits{MemoryMB: 512, Pids: 64},
		Sandbox: &wire.Sandbox{BestEffort: []wire.Feature{wire.FeatureCgroup}}})
	if err != nil {
		t.Fatalf("SessionCreate = %v", err)
	}
	t.Cleanup(func() { _, _ = a.SessionDestroy(ctx, id) })
	e := s.Enforced
	if !e.Sandboxed || e.UID < DefaultUIDBase || e.GID != e.UID || !e.Landlock.FS || !e.Net.Namespace || !e.PrivateTmp || e.Membership != wire.MemberUID {
		t.Fatalf("Enforced = %+v; want a uid of the range, Landlock, netns, private /tmp, uid membership", e)
	}
	if st, err := os.Stat(s.Workdir); err != nil || st.Mode().Perm() != 0o700 || !ownedBy(st, e.UID) {
		t.Errorf("workdir %s: %v, %v; want 0700 owned by %d", s.Workdir, st, err, e.UID)
	}
	run := func(shell string) wire.RunResult {
		t.Helper()
		res, err := a.Run(ctx, wire.RunRequest{Session: id, Shell: shell, TimeoutMS: 20000})
		if err != nil {
			t.Fatalf("Run(%q) = %v", shell, err)
		}
		return res
	}
	res := run(`awk '/Max processes/{print $3}' /proc/self/limits; ulimit -v; id -u; id -g; id -G; grep -E '^(Cap|NoNewPrivs)' /proc/self/status; echo made > f && cat f; echo tmp > /tmp/t; echo "$HOME $TMPDIR"; cat /proc/self/net/dev | tail -n +3 | cut -d: -f1`)
	want := strings.Join([]string{"64", "524288", strconv.Itoa(e.UID), strconv.Itoa(e.GID), strconv.Itoa(e.GID),
		"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
		"CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "made", s.Workdir + " /tmp", "lo"}, "\n") + "\n"
	if got := strings.ReplaceAll(string(res.Stdout), " ", ""); got != strings.ReplaceAll(want, " ", "") || res.ExitCode != 0 {
		t.Errorf("inside the session: exit %d, stdout\n%s\nstderr %s\nwant\n%s", res.ExitCode, res.Stdout, res.Stderr, want)
	}
	if b, err := os.ReadFile(filepath.Join(e.Tmp, "t")); err != nil || string(b) != "tmp\n" {
		t.Errorf("the session's /tmp/t is %q, %v in %s; want its private directory", b, err, e.Tmp)
	}
	if _, err := os.Stat("/tmp/t"); err == nil {
		t.Errorf("/tmp/t exists on the host: the session's /tmp was not private")
	}
	outside := t.TempDir()
	for _, attempt := range []string{
		"echo x > " + outside + "/escape",
		"cat /etc/shadow",
		"ls /root",
		"echo x > /var/tmp/escape-" + id,
		"ls " + a.metaDir(),
	} {
		if r := run(attempt); r.ExitCode == 0 {
			t.Errorf("%q in the session exited 0 (stdout %q); want a failure", attempt, r.Stdout)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "escape")); err == nil {
		t.Errorf("the session wrote outside its directories")
	}
	// Daemonize, clear the marker: destroy still finds the uid.
	run(`env -u VMGATE_SESSION -u VMGATE_RUN setsid sh -c 'sleep 10$1 & sleep 10$2' sh 77 78 </dev/null >/dev/null 2>&1 &`)
	if got := waitFor(t, func() []int { return procsWith(t, a, "sleep 107") }, 2); len(got) != 2 {
		t.Fatalf("daemonized sleeps = %v; want 2", got)
	}
	list, err := a.SessionList(ctx)
	if err != nil || len(list) != 1 || list[0].Processes < 2 || list[0].Enforced.UID != e.UID {
		t.Errorf("SessionList = %+v, %v; want the session with its 2 daemonized processes and its report", list, err)
	}
	d, err := a.SessionDestroy(ctx, id)
	if err != nil || d.Killed < 2 {
		t.Errorf("SessionDestroy = %+v, %v; want 2 killed", d, err)
	}
	if got := procsWith(t, a, "sleep 107"); len(got) != 0 {
		t.Errorf("processes left after destroy: %v", got)
	}
	for _, p := range []string{s.Workdir, e.Tmp, filepath.Join(a.netnsDir(), id)} {
		if exists(p) {
			t.Errorf("%s left after destroy", p)
		}
	}
}

// waitFor polls list until it has n entries (or 10 s pass) and returns its last value.
func waitFor(t *testing.T, list func() []int, n int) []int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	step := time.Millisecond
	for {
		got := list()
		if len(got) == n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(step)
		step = min(2*step, 100*time.Millisecond)
	}
}

func ownedBy(st os.FileInfo, uid int) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && int(sys.Uid) == uid
}

// TestHostRootSandbox: a user root sandbox keeps root's uid and
// capabilities, and Landlock still confines it to its directories.
func TestHostRootSandbox(t *testing.T) {
	k := (&Agent{cfg: DefaultConfig()}).probeKernel()
	if k.landlockABI == 0 || !k.netns || !k.mountns {
		t.Skipf("this host kernel lacks Landlock or namespaces (%+v); the lab VM test covers the sandbox", k)
	}
	a := sandboxAgent(t)
	ctx := context.Background()
	id := "5a4db0c5a4db0c000002"
	s, err := a.SessionCreate(ctx, wire.SessionCreate{ID: id, Sandbox: &wire.Sandbox{User: wire.UserRoot, Net: wire.NetHost, BestEffort: wire.Features()}})
	if err != nil {
		t.Fatalf("SessionCreate = %v", err)
	}
	t.Cleanup(func() { _, _ = a.SessionDestroy(ctx, id) })
	if e := s.Enforced; e.UID != 0 || e.Capabilities != "all" || e.Net.Namespace || e.Membership != wire.MemberSecret {
		t.Errorf("Enforced = %+v; want root, all capabilities, the host's network, secret membership", e)
	}
	outside := t.TempDir()
	res, err := a.Run(ctx, wire.RunRequest{Session: id, Shell: "id -u; echo in > f && cat f; echo x > " + outside + "/escape || echo denied"})
	if err != nil || string(res.Stdout) != "0\nin\ndenied\n" {
		t.Errorf("Run = %q, %q, %v; want root, a write in the workdir, a denied write outside", res.Stdout, res.Stderr, err)
	}
	if exists(filepath.Join(outside, "escape")) {
		t.Errorf("a root sandbox wrote outside its directories")
	}
}

// TestHostSandboxCreateRefusals: a sandbox the guest cannot give, or whose
// paths are not plain, is refused before anything is made.
func TestHostSandboxCreateRefusals(t *testing.T) {
	a := sandboxAgent(t) // CgroupRoot "": no cgroup v2 here
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "real", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "real"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		sb   wire.Sandbox
		code string
		msg  string
	}{
		{"cgroup required", wire.Sandbox{}, wire.CodeRefused, "cgroup (this guest has no writable cgroup v2)"},
		{"a symlink", wire.Sandbox{FS: wire.FSAccess{Write: []string{filepath.Join(dir, "link")}}, BestEffort: wire.Features()}, wire.CodeInvalid, "link is a symlink"},
		{"below a symlink", wire.Sandbox{FS: wire.FSAccess{Read: []string{filepath.Join(dir, "link", "x")}}, BestEffort: wire.Features()}, wire.CodeInvalid, "link is a symlink"},
		{"missing", wire.Sandbox{FS: wire.FSAccess{Read: []string{filepath.Join(dir, "nothing")}}, BestEffort: wire.Features()}, wire.CodeInvalid, "no such file"},
		{"vmgate's state", wire.Sandbox{FS: wire.FSAccess{Read: []string{a.metaDir()}}, BestEffort: wire.Features()}, wire.CodeInvalid, "inside vmgate-guest's state"},
		{"unknown feature", wire.Sandbox{BestEffort: []wire.Feature{"seccomp"}}, wire.CodeInvalid, `best_effort "seccomp"`},
		{"unknown net", wire.Sandbox{Net: "internet"}, wire.CodeInvalid, `net "internet"`},
	}
	if err := os.MkdirAll(a.metaDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := tt.sb
			_, err := a.SessionCreate(context.Background(), wire.SessionCreate{ID: "5a4db0c5a4db0c000003", Sandbox: &sb})
			var we *wire.Error
			if !errors.As(err, &we) || we.Code != tt.code || !strings.Contains(we.Message, tt.msg) {
				t.Fatalf("SessionCreate(%+v) = %v; want %s containing %q", tt.sb, err, tt.code, tt.msg)
			}
			for _, d := range []string{a.sessionsDir(), a.tmpDir(), a.netnsDir(), a.metaDir()} {
				if ents, _ := os.ReadDir(d); len(ents) != 0 {
					t.Errorf("%s holds %v after a refused create", d, ents)
				}
			}
		})
	}
}

// TestOpenRulePath: a sandbox's own paths are opened following no
// symlink; one in any component refuses, naming it.
func TestOpenRulePath(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"real/sub", "other"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "real", "file"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, l := range [][2]string{{"/", "root"}, {filepath.Join(dir, "real"), "link"}, {"real/file", "real/flink"}} {
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		path    string
		dir     bool
		code    string // "" for success
		mention string
		enoent  bool
	}{
		{path: dir + "/real", dir: true},
		{path: dir + "/real/sub", dir: true},
		{path: dir + "/real/file"},
		{path: dir + "/root", code: wire.CodeRefused, mention: dir + "/root is a symlink (to \"/\")"},
		{path: dir + "/link/sub", code: wire.CodeRefused, mention: dir + "/link is a symlink"},
		{path: dir + "/real/flink", code: wire.CodeRefused, mention: dir + "/real/flink is a symlink"},
		{path: dir + "/missing", enoent: true},
		{path: "relative", code: wire.CodeInvalid, mention: "not absolute"},
		{path: dir + "/real/../other", code: wire.CodeInvalid, mention: "not clean"},
	}
	for _, tt := range tests {
		bothWalks(t, func(t *testing.T) {
			fd, st, err := openRulePath(tt.path)
			switch {
			case tt.enoent:
				if !errors.Is(err, syscall.ENOENT) {
					t.Errorf("openRulePath(%s) = %v; want ENOENT", tt.path, err)
				}
			case tt.code != "":
				var we *wire.Error
				if !errors.As(err, &we) || we.Code != tt.code || !strings.Contains(we.Message, tt.mention) {
					t.Errorf("openRulePath(%s) = %v; want %s naming %q", tt.path, err, tt.code, tt.mention)
				}
				if tt.code == wire.CodeRefused && we != nil && we.Reason != wire.ReasonSymlink {
					t.Errorf("openRulePath(%s) reason = %q; want %q", tt.path, we.Reason, wire.ReasonSymlink)
				}
			case err != nil:
				t.Errorf("openRulePath(%s) = %v; want nil", tt.path, err)
			default:
				if isDir := st.Mode&syscall.S_IFMT == syscall.S_IFDIR; isDir != tt.dir {
					t.Errorf("openRulePath(%s): directory %v; want %v", tt.path, isDir, tt.dir)
				}
			}
			if err == nil {
				syscall.Close(fd)
			}
		})
	}
}

// outsideDir is a temporary directory outside /tmp (which a sandboxed
// session sees as its own), reachable by a session uid.
func outsideDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "vmgate-agent-test-")
	if err != nil {
		t.Skipf("no /var/tmp for a directory outside /tmp: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// hostSandbox creates a sandboxed session on the host (no cgroup) with
// sb's extra paths, or skips where the host kernel lacks what it needs.
func hostSandbox(t *testing.T, id string, fs wire.FSAccess) (*Agent, wire.Session) {
	t.Helper()
	k := (&Agent{cfg: DefaultConfig()}).probeKernel()
	if k.landlockABI == 0 || !k.netns || !k.mountns || !k.mountAPI {
		t.Skipf("this host kernel lacks Landlock, namespaces or mount_setattr (%+v); the lab VM test covers the sandbox", k)
	}
	a := sandboxAgent(t)
	s, err := a.SessionCreate(context.Background(), wire.SessionCreate{ID: id, Sandbox: &wire.Sandbox{FS: fs, BestEffort: []wire.Feature{wire.FeatureCgroup}}})
	if err != nil {
		t.Fatalf("SessionCreate = %v", err)
	}
	t.Cleanup(func() { _, _ = a.SessionDestroy(context.Background(), id) })
	return a, s
}

// TestHostReadOnlyOutside: outside its write paths a session can change
// nothing, not even what Landlock does not handle (chmod, chown, utime on
// a file its uid owns; truncate where the ABI lacks it) or what a file's
// mode allows (a world-writable file): the mounts are read-only.
func TestHostReadOnlyOutside(t *testing.T) {
	out := outsideDir(t)
	w := filepath.Join(out, "w")
	if err := os.Mkdir(w, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(w, 0o777); err != nil {
		t.Fatal(err)
	}
	a, s := hostSandbox(t, "5a4db0c5a4db0c000011", wire.FSAccess{Write: []string{w}})
	e := s.Enforced
	if !e.ReadOnlyOutside || e.HeldBy["chmod"] != wire.HeldMount || e.HeldBy["write"] != wire.HeldBoth {
		t.Fatalf("Enforced = %+v; want read-only outside, chmod held by the mount, write by both", e)
	}
	ww, owned := filepath.Join(out, "ww"), filepath.Join(out, "owned")
	if err := os.WriteFile(ww, []byte("12345"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ww, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(owned, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(owned, e.UID, e.GID); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(owned)
	for _, attempt := range []string{
		"truncate -s 1 " + ww, "chmod 0777 " + owned, fmt.Sprintf("chown %d:%d %s", e.UID, e.GID, owned),
		"touch -d 2001-01-01 " + owned, "ln " + owned + " " + out + "/link", "mv " + owned + " " + out + "/moved",
		"echo x >> " + ww,
	} {
		res, err := a.Run(context.Background(), wire.RunRequest{Session: s.ID, Shell: attempt, TimeoutMS: 20000})
		if err != nil || res.ExitCode == 0 {
			t.Errorf("%q in the session = exit %d, %v; want a failure", attempt, res.ExitCode, err)
		}
	}
	if b, _ := os.ReadFile(ww); string(b) != "12345" {
		t.Errorf("%s holds %q; want it untouched", ww, b)
	}
	after, err := os.Stat(owned)
	if err != nil || after.Mode() != before.Mode() || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("%s: %v, %v; want mode %v and mtime %v kept", owned, after, err, before.Mode(), before.ModTime())
	}
	for _, p := range []string{out + "/link", out + "/moved"} {
		if exists(p) {
			t.Errorf("%s was made from the session", p)
		}
	}
	res, err := a.Run(context.Background(), wire.RunRequest{Session: s.ID, Shell: "echo in > " + w + "/f && truncate -s 1 " + w + "/f && echo ok > here && cat here"})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "ok\n" {
		t.Errorf("writes in the write path and the workdir = %q, %q, %v; want ok", res.Stdout, res.Stderr, err)
	}
}

// swapDirs makes, in a directory outside the sandbox, d with x and y in
// it and target with a secret, all writable by every uid: the paths a
// session's swap tests give it and the target a swap points them to.
func swapDirs(t *testing.T) (out, d string) {
	t.Helper()
	out = outsideDir(t)
	d = filepath.Join(out, "d")
	for _, p := range []string{d, d + "/x", d + "/y", out + "/target"} {
		if err := os.Mkdir(p, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(out+"/target/secret", []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	return out, d
}

// TestHostSwappedPathRefused: an extra path swapped for a symlink after
// create refuses the next run, naming it, and nothing is read or written
// through it.
func TestHostSwappedPathRefused(t *testing.T) {
	out, d := swapDirs(t)
	a, s := hostSandbox(t, "5a4db0c5a4db0c000012", wire.FSAccess{Write: []string{d, d + "/y"}, Read: []string{d + "/x"}})
	run := func(shell string) (wire.RunResult, error) {
		return a.Run(context.Background(), wire.RunRequest{Session: s.ID, Shell: shell, TimeoutMS: 20000})
	}
	if res, err := run("cat " + out + "/target/secret"); err != nil || res.ExitCode == 0 {
		t.Fatalf("reading the target before the swap = %q, %v; want refused (else this test proves nothing)", res.Stdout, err)
	}
	swap := fmt.Sprintf("cd %s && mv x x.old && ln -s %s/target x && mv y y.old && ln -s %s/target y", d, out, out)
	if res, err := run(swap); err != nil || res.ExitCode != 0 {
		t.Fatalf("swapping in the session = %q, %v", res.Stderr, err)
	}
	res, err := run("cat " + d + "/x/secret; echo made > " + d + "/y/made")
	var we *wire.Error
	if !errors.As(err, &we) || we.Reason != wire.ReasonSymlink || !strings.Contains(we.Message, d+"/x is a symlink") {
		t.Errorf("the run after the swap = %+v, %v; want refused naming %s/x", res, err, d)
	}
	if strings.Contains(string(res.Stdout), "secret") || exists(out+"/target/made") {
		t.Errorf("the session read or wrote through the swapped symlinks")
	}
}

// TestHostWriteBlocked: a write path the session's uid cannot write for
// its mode is reported at create and in a failed command's result.
func TestHostWriteBlocked(t *testing.T) {
	out := outsideDir(t)
	rootOnly := filepath.Join(out, "data")
	if err := os.Mkdir(rootOnly, 0o755); err != nil {
		t.Fatal(err)
	}
	a, s := hostSandbox(t, "5a4db0c5a4db0c000013", wire.FSAccess{Write: []string{rootOnly}})
	want := []wire.BlockedPath{{Path: rootOnly, Reason: "owned by root, mode 0755: the session's uid cannot write"}}
	if !slices.Equal(s.Enforced.WriteBlocked, want) || !hasNote(s.Enforced, "fs.write "+rootOnly) {
		t.Errorf("WriteBlocked = %+v, notes %q; want %+v, said", s.Enforced.WriteBlocked, s.Enforced.NotEnforced, want)
	}
	res, err := a.Run(context.Background(), wire.RunRequest{Session: s.ID, Shell: "echo x > " + rootOnly + "/f"})
	if err != nil || res.ExitCode == 0 || !slices.Equal(res.WriteBlocked, want) {
		t.Errorf("a refused write = exit %d, write_blocked %+v, %v; want it named", res.ExitCode, res.WriteBlocked, err)
	}
	if res, err := a.Run(context.Background(), wire.RunRequest{Session: s.ID, Shell: "true"}); err != nil || res.WriteBlocked != nil {
		t.Errorf("a command that succeeded carries write_blocked %+v, %v; want none", res.WriteBlocked, err)
	}
}

// TestHostOneShotSandbox: a run with a sandbox and no session runs
// confined in a session of its own that is gone once the run ends, with
// the processes the command left behind.
func TestHostOneShotSandbox(t *testing.T) {
	k := (&Agent{cfg: DefaultConfig()}).probeKernel()
	if k.landlockABI == 0 || !k.netns || !k.mountns {
		t.Skipf("this host kernel lacks Landlock or namespaces (%+v); the lab VM test covers the sandbox", k)
	}
	a := sandboxAgent(t)
	ctx := context.Background()
	res, err := a.Run(ctx, wire.RunRequest{Shell: "id -u; cat /etc/shadow; sleep 1196 </dev/null >/dev/null 2>&1 &", TimeoutMS: 20000,
		Sandbox: &wire.Sandbox{BestEffort: []wire.Feature{wire.FeatureCgroup}}})
	if err != nil {
		t.Fatalf("Run(one-shot sandbox) = %v", err)
	}
	uid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(res.Stdout), "\n", 2)[0]))
	if uid < DefaultUIDBase || !strings.Contains(string(res.Stderr), "shadow") {
		t.Errorf("one-shot run: stdout %q stderr %q; want a sandbox uid and /etc/shadow refused", res.Stdout, res.Stderr)
	}
	if ss, err := a.SessionList(ctx); err != nil || len(ss) != 0 {
		t.Errorf("SessionList after the one-shot run = %+v, %v; want none left", ss, err)
	}
	if out, _ := exec.Command("pgrep", "-f", "sleep 1196").Output(); len(out) != 0 {
		t.Errorf("the one-shot command's background process is still running: %q", out)
	}
	if _, err := a.Run(ctx, wire.RunRequest{Argv: []string{"true"}, Session: "5a4db0c5a4db0c000001", Sandbox: &wire.Sandbox{}}); !isCode(err, wire.CodeInvalid) {
		t.Errorf("Run with a session and a sandbox = %v; want %s", err, wire.CodeInvalid)
	}
}
