package guestctl

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

// escapeBin is the guest path of testdata/escape, and escapeSUID of its
// setuid-root copy.
const (
	escapeBin  = "/usr/local/bin/vmgate-escape"
	escapeSUID = "/usr/local/bin/vmgate-escape-suid"
)

var (
	escapeBuild    sync.Once
	escapeData     []byte
	escapeBuildErr error
)

// pushEscape builds testdata/escape for the guest and installs it, with a
// setuid-root copy, as root outside any session.
func pushEscape(t *testing.T, ctx context.Context, h *Helper, vm string) {
	t.Helper()
	escapeBuild.Do(func() {
		out := filepath.Join(guestDir, "escape")
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./testdata/escape")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if b, err := cmd.CombinedOutput(); err != nil {
			escapeBuildErr = fmt.Errorf("building testdata/escape: %v\n%s", err, b)
			return
		}
		escapeData, escapeBuildErr = os.ReadFile(out)
	})
	if escapeBuildErr != nil {
		t.Fatal(escapeBuildErr)
	}
	sh(t, ctx, h, vm, "mkdir -p /usr/local/bin")
	if err := h.d.FileWrite(ctx, vm, escapeBin, escapeData, 0o755); err != nil {
		t.Fatalf("FileWrite(%s) = %v", escapeBin, err)
	}
	if res := sh(t, ctx, h, vm, "cp "+escapeBin+" "+escapeSUID+" && chmod 4755 "+escapeSUID+" && ls -l "+escapeSUID); res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), "-rwsr-xr-x") {
		t.Fatalf("setuid copy: %q %q", res.Stdout, res.Stderr)
	}
}

func sandboxSession(t testing.TB, ctx context.Context, h *Helper, vm string, sb wire.Sandbox) Session {
	t.Helper()
	s, err := h.SessionCreate(ctx, vm, SessionCreate{ID: NewSessionID(), TTLS: 3600, Sandbox: &sb})
	if err != nil {
		t.Fatalf("SessionCreate(%s, %+v) = %v; want nil", vm, sb, err)
	}
	t.Cleanup(func() { _, _ = h.SessionDestroy(context.Background(), vm, s.ID) })
	return s
}

// bgPID starts line in the background through sh (outside any session, or
// in session when set) and returns the pid it prints.
func bgPID(t *testing.T, ctx context.Context, h *Helper, vm, session, line string) int {
	t.Helper()
	line += " </dev/null >/dev/null 2>&1 & echo $!"
	var out []byte
	if session == "" {
		out = sh(t, ctx, h, vm, line).Stdout
	} else {
		res, err := h.Run(ctx, vm, RunRequest{Session: session, Shell: line})
		if err != nil {
			t.Fatalf("Run(%q) = %v", line, err)
		}
		out = res.Stdout
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("%q printed %q; want a pid", line, out)
	}
	return pid
}

// escapeLab is what the escape attempts aim at, all set up as root outside
// the attacking session.
type escapeLab struct {
	h        *Helper
	vm       string
	ctx      context.Context
	a, b     Session // the attacker's session and another one
	outside  int     // a root process outside every session
	inB      int     // a process of session b
	listener int     // testdata/escape listening on the guest's port 7777, every address
}

// alive reports whether pid is a live process in the guest.
func (l *escapeLab) alive(t *testing.T, pid int) bool {
	return sh(t, l.ctx, l.h, l.vm, fmt.Sprintf("grep -q '^State:.[^Z]' /proc/%d/status", pid)).ExitCode == 0
}

// guest runs a shell line as root outside the sessions and returns its stdout.
func (l *escapeLab) guest(t *testing.T, line string) string {
	return string(sh(t, l.ctx, l.h, l.vm, line).Stdout)
}

// escapeCase is one attempt from inside session a. It must fail (exit not
// 0), and held, looking from outside, says what went wrong ("" when the
// sandbox held).
type escapeCase struct {
	name       string
	needCgroup bool
	shell      func(l *escapeLab) string
	held       func(t *testing.T, l *escapeLab, out string) string
}

var escapeCases = []escapeCase{
	{name: "write /root", shell: func(*escapeLab) string { return "echo x > /root/escaped" },
		held: func(t *testing.T, l *escapeLab, _ string) string {
			return nonEmpty(l.guest(t, "ls /root/escaped 2>/dev/null"), "/root/escaped was created")
		}},
	{name: "read /root", shell: func(*escapeLab) string { return "cat /root/secret" },
		held: func(_ *testing.T, _ *escapeLab, out string) string { return contains(out, "root-secret") }},
	{name: "read /etc/shadow", shell: func(*escapeLab) string { return "cat /etc/shadow" },
		held: func(_ *testing.T, _ *escapeLab, out string) string { return contains(out, "shadow-secret") }},
	{name: "write the world-writable root directory", shell: func(*escapeLab) string { return "echo x > /escaped" },
		held: func(t *testing.T, l *escapeLab, _ string) string {
			return nonEmpty(l.guest(t, "ls /escaped 2>/dev/null"), "/escaped was created")
		}},
	{name: "read another session's directory", shell: func(l *escapeLab) string { return "cat " + l.b.Workdir + "/b-secret; ls " + l.b.Workdir },
		held: func(_ *testing.T, _ *escapeLab, out string) string { return contains(out, "data of session b") }},
	{name: "write another session's directory", shell: func(l *escapeLab) string { return "echo x > " + l.b.Workdir + "/from-a" },
		held: func(t *testing.T, l *escapeLab, _ string) string {
			return nonEmpty(l.guest(t, "ls "+l.b.Workdir+"/from-a 2>/dev/null"), "a file appeared in session b")
		}},
	{name: "write vmgate-guest's metadata", shell: func(l *escapeLab) string { return "ls /var/lib/vmgate/meta; echo x > /var/lib/vmgate/meta/x.json" },
		held: func(t *testing.T, l *escapeLab, _ string) string {
			return nonEmpty(l.guest(t, "ls /var/lib/vmgate/meta/x.json 2>/dev/null"), "metadata was written")
		}},
	{name: "tcp to the guest's loopback with net none", shell: func(*escapeLab) string { return escapeBin + " connect 127.0.0.1:7777" },
		held: listenerUntouched},
	{name: "tcp over the guest's network with net none", shell: func(*escapeLab) string { return escapeBin + " connect " + labAddr + ":7777" },
		held: listenerUntouched},
	{name: "signal a root process", shell: func(l *escapeLab) string { return fmt.Sprintf("%s signal %d", escapeBin, l.outside) },
		held: func(t *testing.T, l *escapeLab, _ string) string { return dead(t, l, l.outside) }},
	{name: "signal another session's process", shell: func(l *escapeLab) string { return fmt.Sprintf("kill -TERM %d", l.inB) },
		held: func(t *testing.T, l *escapeLab, _ string) string { return dead(t, l, l.inB) }},
	{name: "ptrace a root process", shell: func(l *escapeLab) string { return fmt.Sprintf("%s ptrace %d", escapeBin, l.outside) },
		held: func(t *testing.T, l *escapeLab, _ string) string { return stopped(t, l, l.outside) }},
	{name: "ptrace another session's process", shell: func(l *escapeLab) string { return fmt.Sprintf("%s ptrace %d", escapeBin, l.inB) },
		held: func(t *testing.T, l *escapeLab, _ string) string { return stopped(t, l, l.inB) }},
	{name: "setuid binary", shell: func(*escapeLab) string { return escapeSUID + " privs" },
		held: func(t *testing.T, l *escapeLab, out string) string {
			if !strings.Contains(out, fmt.Sprintf("euid %d\n", l.a.Enforced.UID)) {
				return "the setuid bit changed the effective uid: " + out
			}
			return nonEmpty(l.guest(t, "ls /root/suid-escaped 2>/dev/null"), "the setuid copy wrote as root")
		}},
	{name: "leave the cgroup", needCgroup: true,
		shell: func(*escapeLab) string {
			return `sh -c 'echo $$ > /sys/fs/cgroup/cgroup.procs; echo $$ > /sys/fs/cgroup/vmgate/cgroup.procs; mkdir /sys/fs/cgroup/escaped; exec sleep 1095' </dev/null >/dev/null 2>&1 &
				echo $$ > /sys/fs/cgroup/cgroup.procs`
		},
		held: func(t *testing.T, l *escapeLab, _ string) string {
			if why := nonEmpty(l.guest(t, "ls -d /sys/fs/cgroup/escaped 2>/dev/null"), "a cgroup was made"); why != "" {
				return why
			}
			pids := waitMatching(t, l, "sleep 1095", 1)
			if len(pids) != 1 {
				return fmt.Sprintf("the background attempt is not running (%v)", pids)
			}
			cg := l.guest(t, fmt.Sprintf("cat /proc/%d/cgroup", pids[0].PID))
			if !strings.Contains(cg, "/vmgate/"+l.a.ID+"/") {
				return "it left the session's cgroup: " + cg
			}
			return ""
		}},
}

// labAddr is the lab guest's address on its NIC (QEMU's user network).
const labAddr = "10.0.2.15"

// listenerUntouched says what is wrong when the listener outside the
// session got a connection.
func listenerUntouched(t *testing.T, l *escapeLab, _ string) string {
	if !l.alive(t, l.listener) {
		return "the listener outside the session got a connection"
	}
	return ""
}

// waitMatching polls ps (outside any session) until n processes match s, or 30 s pass.
func waitMatching(t *testing.T, l *escapeLab, s string, n int) []Process {
	t.Helper()
	deadline := time.Now().Add(testload.Scale(30 * time.Second))
	for {
		got := matching(t, l.ctx, l.h, l.vm, "", s)
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
	}
}

// stopped says what is wrong when pid was stopped (a ptrace attach) or is gone.
func stopped(t *testing.T, l *escapeLab, pid int) string {
	st := l.guest(t, fmt.Sprintf("grep '^State:' /proc/%d/status", pid))
	if !strings.Contains(st, "S (sleeping)") {
		return fmt.Sprintf("pid %d is %q, not sleeping", pid, st)
	}
	return ""
}

// TestLabSandboxEscapes runs escape attempts from inside a sandboxed session
// on the lab VMs and checks from outside that each failed; then that the
// same session does real work; then that destroy_session ends processes
// that daemonized, cleared their markers and tried to leave the cgroup.
func TestLabSandboxEscapes(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 5*time.Minute)
			l := setUpEscapes(t, ctx, h, vm)
			mntNS := func() string {
				res, err := h.Run(ctx, vm, RunRequest{Session: l.a.ID, Argv: []string{"readlink", "/proc/self/ns/mnt"}})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("readlink /proc/self/ns/mnt in session a = %+v, %v", res, err)
				}
				return strings.TrimSpace(string(res.Stdout))
			}
			before := mntNS()
			for _, tc := range escapeCases {
				if tc.needCgroup && vm == "nocg" {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					line := tc.shell(l)
					res, err := h.Run(ctx, vm, RunRequest{Session: l.a.ID, Shell: line, TimeoutMS: 20000})
					if err != nil {
						t.Fatalf("Run(%q) = %v", line, err)
					}
					out := string(res.Stdout) + string(res.Stderr)
					if res.ExitCode == 0 {
						t.Errorf("%q in the sandbox exited 0: %q", line, out)
					}
					if why := tc.held(t, l, out); why != "" {
						t.Errorf("%q: the sandbox did not hold: %s (output %q)", line, why, out)
					}
				})
			}
			// Through the resident helper every run of a session is forked
			// from its one kept confined thread (guest/agent's thread.go):
			// the attempts ran in that thread's mount namespace. A process
			// per command confines a thread per run.
			if after, r := mntNS(), h.CheckRoad(ctx, vm); (r.Kind == RoadResident) != (after == before) {
				t.Errorf("session a's mount namespace before the attempts %s, after %s, road %s; want the same one exactly when resident", before, after, r)
			}
			t.Run("connect works outside net none", func(t *testing.T) {
				// The control for the net none cases: from a net host session
				// the same connection reaches the listener.
				c := sandboxSession(t, ctx, h, vm, wire.Sandbox{Net: wire.NetHost, BestEffort: bestEffort(vm)})
				res, err := h.Run(ctx, vm, RunRequest{Session: c.ID, Argv: []string{escapeBin, "connect", labAddr + ":7777"}})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("connect from net host = %+v, %v; want exit 0", res, err)
				}
			})
			t.Run("work inside", func(t *testing.T) { sandboxWork(t, ctx, h, vm, l.a) })
			t.Run("survive destroy", func(t *testing.T) { surviveDestroy(t, ctx, h, vm, l.a) })
		})
	}
}

// bestEffort is what a lab VM must be allowed to go without.
func bestEffort(vm string) []wire.Feature {
	if vm == "nocg" {
		return []wire.Feature{wire.FeatureCgroup}
	}
	return nil
}

func setUpEscapes(t *testing.T, ctx context.Context, h *Helper, vm string) *escapeLab {
	t.Helper()
	pushEscape(t, ctx, h, vm)
	sh(t, ctx, h, vm, "rm -f /root/escaped /root/suid-escaped /escaped; rmdir /sys/fs/cgroup/escaped 2>/dev/null;"+
		"echo root-secret > /root/secret; echo 'root:shadow-secret:19000:0:99999:7:::' > /etc/shadow; chmod 640 /etc/shadow")
	l := &escapeLab{h: h, vm: vm, ctx: ctx}
	l.a = sandboxSession(t, ctx, h, vm, wire.Sandbox{BestEffort: bestEffort(vm)})
	l.b = sandboxSession(t, ctx, h, vm, wire.Sandbox{BestEffort: bestEffort(vm)})
	e := l.a.Enforced
	want := wire.MemberCgroup
	if vm == "nocg" {
		want = wire.MemberUID
	}
	if !e.Sandboxed || e.UID <= 65535 || e.GID != e.UID || e.UID == l.b.Enforced.UID || !e.Landlock.FS || e.Landlock.ABI < 1 ||
		!e.Net.Namespace || !e.PrivateTmp || e.Membership != want || e.Capabilities != "none" || !e.NoNewPrivs {
		t.Fatalf("session a Enforced = %+v; want its own uid, Landlock, netns, private /tmp, %s membership", e, want)
	}
	t.Logf("%s: session a enforces %+v", vm, e)
	if res, err := h.Run(ctx, vm, RunRequest{Session: l.b.ID, Shell: "echo data of session b > b-secret"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing in session b = %+v, %v", res, err)
	}
	l.inB = bgPID(t, ctx, h, vm, l.b.ID, "sleep 1090")
	l.outside = bgPID(t, ctx, h, vm, "", "sleep 1091")
	if out := sh(t, ctx, h, vm, "ip -4 addr show").Stdout; !strings.Contains(string(out), labAddr+"/") {
		t.Fatalf("the lab guest has no %s (the net none case over its NIC needs it): %s", labAddr, out)
	}
	l.listener = bgPID(t, ctx, h, vm, "", escapeBin+" listen 0.0.0.0:7777")
	t.Cleanup(func() {
		sh(t, context.Background(), h, vm, fmt.Sprintf("kill -9 %d %d 2>/dev/null; rm -f /root/secret /etc/shadow", l.outside, l.listener))
	})
	// The listener must be listening before the attempts (and the control).
	if sh(t, ctx, h, vm, `i=0; until netstat -ltn | grep -q ':7777 '; do i=$((i+1)); [ $i -gt 1000 ] && exit 1; usleep 10000; done`).ExitCode != 0 {
		t.Fatalf("nc did not listen on 7777")
	}
	return l
}

// sandboxWork: what an agent does in a session works in the sandbox.
func sandboxWork(t *testing.T, ctx context.Context, h *Helper, vm string, s Session) {
	for _, tt := range []struct{ name, shell, want string }{
		{"files in the session directory", `mkdir -p a/b && echo hi > a/b/f && mv a/b/f a/g && cat a/g && rm -r a && ls`, "hi\n"},
		{"private /tmp", `echo t > /tmp/t && cat $TMPDIR/t && ls /tmp`, "t\nt\n"},
		{"shell pipeline", `seq 1 1000 | grep 7 | sort -rn | head -3 | tr '\n' ' '`, "997 987 979 "},
		{"many processes", `for i in $(seq 1 40); do (echo "int f$i;" > src$i.c; tr a-z A-Z < src$i.c > obj$i.o) & done; wait; cat obj*.o | wc -l; ls *.c | xargs -n 4 -P 4 cat | wc -l`, "40\n40\n"},
		{"loopback of its own", escapeBin + ` listen 127.0.0.1:8088 > got & until ` + escapeBin + ` connect 127.0.0.1:8088 >/dev/null; do usleep 10000; done; wait; cat got`, "escaped\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: tt.shell, TimeoutMS: 60000})
			if err != nil || res.ExitCode != 0 || strings.TrimLeft(string(res.Stdout), " ") != tt.want {
				t.Errorf("Run(%q) = exit %d, stdout %q, stderr %q, %v; want %q", tt.shell, res.ExitCode, res.Stdout, res.Stderr, err, tt.want)
			}
		})
	}
	if got := sh(t, ctx, h, vm, "ls /tmp/t 2>/dev/null").Stdout; len(got) != 0 {
		t.Errorf("the session's /tmp/t is in the guest's /tmp")
	}
}

// surviveDestroy: processes that double-fork, setsid, clear their markers
// and try to leave the cgroup are still ended by destroy.
func surviveDestroy(t *testing.T, ctx context.Context, h *Helper, vm string, s Session) {
	line := `env -u VMGATE_SESSION -u VMGATE_RUN setsid sh -c '(setsid sleep 11$1 </dev/null >/dev/null 2>&1 &); echo $$ > /sys/fs/cgroup/cgroup.procs; exec sleep 11$2' sh 96 97 </dev/null >/dev/null 2>&1 &`
	if res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: line}); err != nil || res.ExitCode != 0 {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	l := &escapeLab{h: h, vm: vm, ctx: ctx}
	if got := waitMatching(t, l, "sleep 119", 2); len(got) != 2 {
		t.Fatalf("daemonized processes in the session = %+v; want 2", got)
	}
	d, err := h.SessionDestroy(ctx, vm, s.ID)
	if err != nil || d.Killed < 2 {
		t.Fatalf("SessionDestroy = %+v, %v; want at least 2 killed", d, err)
	}
	if got := matching(t, ctx, h, vm, "", "sleep 119"); len(got) != 0 {
		t.Errorf("processes survived destroy: %+v", got)
	}
	if sess := matching(t, ctx, h, vm, "", "sleep 1095"); len(sess) != 0 {
		t.Errorf("the cgroup escape attempt survived destroy: %+v", sess)
	}
	if out := sh(t, ctx, h, vm, "ls /var/lib/vmgate/sessions /var/lib/vmgate/tmp /var/lib/vmgate/netns /var/lib/vmgate/meta; ls /sys/fs/cgroup/vmgate 2>/dev/null").Stdout; strings.Contains(string(out), s.ID) {
		t.Errorf("files of %s left after destroy: %q", s.ID, out)
	}
}

func nonEmpty(out, what string) string {
	if strings.TrimSpace(out) != "" {
		return what
	}
	return ""
}

func contains(out, secret string) string {
	if strings.Contains(out, secret) {
		return "the output holds " + secret
	}
	return ""
}

func dead(t *testing.T, l *escapeLab, pid int) string {
	if !l.alive(t, pid) {
		return fmt.Sprintf("pid %d is gone", pid)
	}
	return ""
}

// TestLabForgedMarker: a process started outside a session (a plain exec,
// as another grant could) that sets VMGATE_SESSION to the session's id, or
// to the id with a guessed secret, is not a member: ps does not list it
// under the session, the session does not count it, and destroying the
// session leaves it alone. On the guest without cgroup v2 this is the
// marker tracking the forgery aimed at.
func TestLabForgedMarker(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 3*time.Minute)
			s := newSession(t, ctx, h, vm)
			if s.Enforced.Membership != map[string]wire.Membership{"cg": wire.MemberCgroup, "nocg": wire.MemberSecret, "noport": wire.MemberCgroup}[vm] {
				t.Errorf("Enforced.Membership = %q", s.Enforced.Membership)
			}
			bgPID(t, ctx, h, vm, s.ID, "sleep 1140")
			var forged []int
			for i, marker := range []string{s.ID, s.ID + "." + strings.Repeat("0", 32), s.ID + "."} {
				res, err := hypervisor.Run(ctx, h.d, vm, hypervisor.ExecRequest{
					Argv: []string{"/bin/sh", "-c", fmt.Sprintf("sleep 114%d </dev/null >/dev/null 2>&1 & echo $!", i+1)},
					Env:  []string{"VMGATE_SESSION=" + marker}, Timeout: time.Minute})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("plain exec with VMGATE_SESSION=%s = %+v, %v", marker, res, err)
				}
				pid, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
				forged = append(forged, pid)
			}
			t.Cleanup(func() {
				for _, pid := range forged {
					sh(t, context.Background(), h, vm, fmt.Sprintf("kill -9 %d 2>/dev/null", pid))
				}
			})
			if got := sh(t, ctx, h, vm, fmt.Sprintf("tr '\\0' '\\n' < /proc/%d/environ | grep VMGATE_SESSION", forged[0])).Stdout; !strings.Contains(string(got), s.ID) {
				t.Fatalf("the forged process's environment = %q; want the marker (else this test proves nothing)", got)
			}
			if got := matching(t, ctx, h, vm, s.ID, "sleep 114"); len(got) != 1 || got[0].Cmdline != "sleep 1140" {
				t.Errorf("ps --session = %+v; want only the session's own sleep 1140", got)
			}
			list, err := h.SessionList(ctx, vm)
			if err != nil || len(list) == 0 {
				t.Fatalf("SessionList = %+v, %v", list, err)
			}
			for _, l := range list {
				if l.ID == s.ID && l.Processes != 1 {
					t.Errorf("the session counts %d processes; want 1", l.Processes)
				}
			}
			if d, err := h.SessionDestroy(ctx, vm, s.ID); err != nil || d.Killed != 1 {
				t.Errorf("SessionDestroy = %+v, %v; want 1 killed", d, err)
			}
			if got := matching(t, ctx, h, vm, "", "sleep 114"); len(got) != len(forged) {
				t.Errorf("after destroy: %+v; want the %d forged processes alive and the member gone", got, len(forged))
			}
		})
	}
}
