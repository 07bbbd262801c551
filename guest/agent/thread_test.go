//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// serveThreads serves a resident helper on a host kernel with Landlock,
// namespaces and mount_setattr, and creates a sandboxed session in it
// with fs's extra paths.
func serveThreads(t *testing.T, id string, fs wire.FSAccess) (*served, wire.Session) {
	t.Helper()
	k := (&Agent{cfg: DefaultConfig()}).probeKernel()
	if k.landlockABI == 0 || !k.netns || !k.mountns || !k.mountAPI {
		t.Skipf("this host kernel lacks Landlock, namespaces or mount_setattr (%+v); the lab VM test covers session threads", k)
	}
	s := servePool(t, t.TempDir())
	var sess wire.Session
	sb, _ := json.Marshal(wire.Sandbox{FS: fs, BestEffort: []wire.Feature{wire.FeatureCgroup}})
	if err := s.call(t, []string{"session", "create", "--id", id, "--sandbox", string(sb)}, nil, &sess); err != nil {
		t.Fatalf("session create = %v", err)
	}
	t.Cleanup(func() { _, _ = s.a.SessionDestroy(context.Background(), id) })
	return s, sess
}

// thread is session id's kept thread, nil when it has none.
func (s *served) thread(id string) *sessionThread {
	tc := s.a.res.threads
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.byID[id]
}

// runIn runs req in session id through the helper.
func (s *served) runIn(t *testing.T, id string, req wire.RunRequest) (wire.RunResult, error) {
	t.Helper()
	req.Session, req.TimeoutMS = id, 20000
	var res wire.RunResult
	err := s.call(t, []string{"run"}, runJSON(t, req), &res)
	return res, err
}

// threadGone reports whether OS thread tid of this process has ended.
func threadGone(tid int) bool {
	_, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid))
	return errors.Is(err, os.ErrNotExist)
}

// threadProbe is the confinement probe of TestPoolConfinementMatchesFresh
// and what a thread could carry from one run to the next: the working
// directory, the umask, the nice value, the signal mask and dispositions.
func threadProbe(s *served, outside string) string {
	return `id -u; id -g; id -G; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp|Sig(Blk|Ign)):' /proc/self/status
ls /sys/class/net; awk '{print $5, $6}' /proc/self/mountinfo | grep -v /netns/ | sort; env | grep -v -E '^(_|SHLVL|PWD|OLDPWD|VMGATE_RUN)=' | sort; pwd; ls -A . /tmp
echo "nice $(cut -d' ' -f19 /proc/self/stat) umask $(umask)"
for p in /etc /root . /tmp "` + s.a.cfg.Root + `" "` + outside + `"; do touch "$p/.probe-$$" 2>/dev/null && rm "$p/.probe-$$" && echo "write $p"; done; ulimit -a`
}

// TestSessionThreadRunsAlike: a sandboxed session's runs in the resident
// helper are forked from one kept thread, made ahead of the first run;
// the first and the fifth run see the same confinement, which is also
// what a run confined on a thread of its own (a process per command)
// sees, though the runs between changed their working directory, umask,
// nice value and signal mask and ran from another cwd.
func TestSessionThreadRunsAlike(t *testing.T) {
	s, sess := serveThreads(t, "5a4db0c5a4db0c000031", wire.FSAccess{})
	waitUntil(t, "the session's thread made ahead of its first run", func() bool {
		th := s.thread(sess.ID)
		if th == nil {
			return false
		}
		select {
		case <-th.ready:
			return th.err == nil
		default:
			return false
		}
	})
	first := s.thread(sess.ID)
	outside := t.TempDir()
	if err := os.Chmod(outside, 0o777); err != nil {
		t.Fatal(err)
	}
	probe := threadProbe(s, outside)
	var outs []wire.RunResult
	for i, req := range []wire.RunRequest{
		{Shell: probe},
		{Shell: "mkdir /tmp/sub && cd /tmp && umask 077 && renice -n 5 $$ >/dev/null; trap '' INT; touch /tmp/x"},
		{Shell: "pwd; umask 0; cd /", Cwd: sess.Enforced.Tmp + "/sub"},
		{Shell: "pwd; rm -r /tmp/sub /tmp/x", Cwd: "/"},
		{Shell: probe},
	} {
		res, err := s.runIn(t, sess.ID, req)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("run %d = %+v (%s), %v", i+1, res, res.Stderr, err)
		}
		outs = append(outs, res)
	}
	if got := strings.TrimSpace(string(outs[2].Stdout)); got != "/tmp/sub" {
		t.Errorf("run 3 with cwd %s/sub ran in %q; want /tmp/sub, the session's /tmp", sess.Enforced.Tmp, got)
	}
	if got := strings.TrimSpace(string(outs[3].Stdout)); got != "/" || outs[3].ExitCode != 0 {
		t.Errorf("run 4 with cwd / ran in %q", got)
	}
	if th := s.thread(sess.ID); th != first {
		t.Errorf("the session's thread changed between runs (%p, then %p); want one kept thread", first, th)
	}
	// The same session, run by a process per command: a thread confined
	// for that run alone.
	perCommand, err := New(s.a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := perCommand.Run(context.Background(), wire.RunRequest{Session: sess.ID, Shell: probe, TimeoutMS: 20000})
	if err != nil {
		t.Fatal(err)
	}
	one, five, own := outs[0].Stdout, outs[4].Stdout, fresh.Stdout
	if !bytes.Equal(one, five) {
		t.Errorf("the first run saw\n%s\nand the fifth\n%s\nwant the same", one, five)
	}
	if !bytes.Equal(five, own) {
		t.Errorf("the fifth run saw\n%s\nand a run on a thread of its own\n%s\nwant the same", five, own)
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "NoNewPrivs:\t1", "write .\n", "write /tmp\n", "nice 0 umask 0022", "\n" + sess.Workdir + "\n"} {
		if !strings.Contains(string(five), want) {
			t.Errorf("the fifth run's probe lacks %q:\n%s", want, five)
		}
	}
	if strings.Contains(string(five), "write "+outside) {
		t.Errorf("the fifth run wrote outside its paths:\n%s", five)
	}
}

// TestSessionThreadSwappedPath: an extra path swapped for a symlink after
// the session's thread was made gives the session nothing. A run after
// the swap is refused, naming it (the paths are checked before each
// run), and a fork from the kept thread past that check, as a swap that
// races the check would have it, reads and writes only what the thread
// opened: not the symlink's target, but the old directory, renamed.
func TestSessionThreadSwappedPath(t *testing.T) {
	out := outsideDir(t)
	d := filepath.Join(out, "d")
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
	if err := os.WriteFile(d+"/x/mine", []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, sess := serveThreads(t, "5a4db0c5a4db0c000032", wire.FSAccess{Write: []string{d + "/y"}, Read: []string{d + "/x"}})
	if res, err := s.runIn(t, sess.ID, wire.RunRequest{Shell: "cat " + out + "/target/secret"}); err != nil || res.ExitCode == 0 {
		t.Fatalf("reading the target before the swap = %q, %v; want refused (else this test proves nothing)", res.Stdout, err)
	}
	th := s.thread(sess.ID)
	if th == nil {
		t.Fatal("no kept thread after a run")
	}
	// Swapped by root here: the session cannot write d, and its swap
	// through a write path above its paths is TestHostSwappedPathRefused's.
	swap := fmt.Sprintf("cd %s && mv x x.old && ln -s %s/target x && mv y y.old && ln -s %s/target y", d, out, out)
	if b, err := exec.Command("sh", "-c", swap).CombinedOutput(); err != nil {
		t.Fatalf("swap: %v %s", err, b)
	}
	_, err := s.runIn(t, sess.ID, wire.RunRequest{Shell: "true"})
	var we *wire.Error
	if !errors.As(err, &we) || we.Reason != wire.ReasonSymlink || !strings.Contains(we.Message, d+"/x is a symlink") {
		t.Errorf("the run after the swap = %v; want refused naming %s/x", err, d)
	}
	// Past the check: fork from the kept thread as it is.
	m, err := s.a.readMeta(sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	attack := "cat " + d + "/x/secret; echo made > " + d + "/y/made; cat " + d + "/x.old/mine; echo kept > " + d + "/y.old/kept"
	stdout, stderr := &capped{max: 1 << 16}, &capped{max: 1 << 16}
	r := &runSetup{runID: randomHex(12), argv: []string{"/bin/sh", "-c", attack}, cwd: m.Workdir, env: []string{"PATH=" + defaultPath},
		attr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}}
	if err := s.a.joinMeta(r, wire.RunRequest{Session: sess.ID}, m); err != nil {
		t.Fatal(err)
	}
	r.confine = nil
	cmd, err := th.start(r, nil, stdout, stderr)
	if err != nil {
		t.Fatalf("a fork from the kept thread = %v", err)
	}
	_ = cmd.Wait()
	o, _ := stdout.result()
	e, _ := stderr.result()
	if strings.Contains(string(o), "secret") || exists(out+"/target/made") {
		t.Errorf("through the swapped symlinks the run read %q or wrote (made: %v); want neither", o, exists(out+"/target/made"))
	}
	if b, err := os.ReadFile(d + "/y.old/kept"); string(o) != "mine" || err != nil || string(b) != "kept\n" {
		t.Errorf("the run read %q (stderr %q) and wrote %q, %v in the old directories; want mine and kept: the rules hold the inodes opened", o, e, b, err)
	}
}
