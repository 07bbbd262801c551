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
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
	first := readyThread(t, s, sess.ID) // made ahead of the first run
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
	var h wire.Hello
	if err := s.call(t, []string{"hello"}, nil, &h); err != nil {
		t.Fatal(err)
	}
	if th := h.Threads; th == nil || th.Made != 1 || th.Ready != 5 || th.OnPath != 0 || th.Kept != 1 {
		t.Errorf("hello's threads = %+v; want one made (ahead), five runs from it ready", th)
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
	out, d := swapDirs(t)
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

// readyThread waits for session id's kept thread to be confined and
// returns it.
func readyThread(t *testing.T, s *served, id string) *sessionThread {
	t.Helper()
	var th *sessionThread
	waitUntil(t, "session "+id+"'s confined thread", func() bool {
		if th = s.thread(id); th == nil {
			return false
		}
		select {
		case <-th.ready:
			return th.err == nil
		default:
			return false
		}
	})
	return th
}

// ended waits for th's OS thread to be gone.
func ended(t *testing.T, th *sessionThread, why string) {
	t.Helper()
	select {
	case <-th.done:
	case <-time.After(time.Minute):
		t.Fatalf("%s: the thread's goroutine still runs a minute on", why)
	}
	waitUntil(t, why+": OS thread "+strconv.Itoa(th.tid)+" gone", func() bool { return threadGone(th.tid) })
}

// TestSessionThreadLife: a session's thread ends with its destroy (by
// the helper, or per command through `job end-session`), even with a
// job running from it; past the cache's bound the least recently used
// idle thread ends; an idle one ends after threadIdle; a helper that stops
// ends them all, and one that starts again makes a thread at the first
// run.
func TestSessionThreadLife(t *testing.T) {
	s, a := serveThreads(t, "5a4db0c5a4db0c000041", wire.FSAccess{})
	root := s.a.cfg.Root
	th := readyThread(t, s, a.ID)
	var st wire.JobStarted
	if err := s.call(t, []string{"job", "start"}, runJSON(t, wire.RunRequest{Session: a.ID, Shell: "echo up; sleep 1002", TimeoutMS: 60000}), &st); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the job's sleep", func() bool { return len(procsWith(t, s.a, "sleep 1002")) > 0 })
	if err := s.call(t, []string{"session", "destroy", "--id", a.ID}, nil, nil); err != nil {
		t.Fatal(err)
	}
	ended(t, th, "destroy with a job running")
	if s.thread(a.ID) != nil || len(procsWith(t, s.a, "sleep 1002")) != 0 {
		t.Errorf("after the destroy: thread %v, sleep %v; want neither", s.thread(a.ID), procsWith(t, s.a, "sleep 1002"))
	}

	// Destroyed by a process per command.
	box, _ := json.Marshal(wire.Sandbox{BestEffort: []wire.Feature{wire.FeatureCgroup}})
	mk := func(id string) *sessionThread {
		if err := s.call(t, []string{"session", "create", "--id", id, "--sandbox", string(box)}, nil, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = s.a.SessionDestroy(context.Background(), id) })
		if res, err := s.runIn(t, id, wire.RunRequest{Shell: "true"}); err != nil || res.ExitCode != 0 {
			t.Fatalf("run in %s = %+v, %v", id, res, err)
		}
		return readyThread(t, s, id)
	}
	b := "5a4db0c5a4db0c000042"
	tb := mk(b)
	perCommand, err := New(s.a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := perCommand.SessionDestroy(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	ended(t, tb, "destroy per command")

	// The bound: the least recently used idle thread ends.
	tc := s.a.res.threads
	tc.mu.Lock()
	tc.max = 2
	tc.mu.Unlock()
	c, d, e := "5a4db0c5a4db0c000043", "5a4db0c5a4db0c000044", "5a4db0c5a4db0c000045"
	tcc, tcd := mk(c), mk(d)
	mk(e)
	ended(t, tcc, "past the bound")
	if s.thread(c) != nil || s.thread(d) != tcd {
		t.Errorf("past the bound: %s's thread %v, %s's %v; want the older gone, the newer kept", c, s.thread(c), d, s.thread(d))
	}

	// Idle: d's thread, used before e's.
	te := s.thread(e)
	tc.mu.Lock()
	later := te.lastUse.Add(threadIdle - time.Nanosecond)
	tc.mu.Unlock()
	tc.mu.Lock()
	tc.now = func() time.Time { return later }
	tc.mu.Unlock()
	tc.expire(later)
	ended(t, tcd, "idle")
	if s.thread(e) != te {
		t.Errorf("%s's thread, used since, ended with the idle one", e)
	}

	// A helper that stops ends every thread; the next one makes them anew.
	s.stop()
	ended(t, te, "the helper stopped")
	s2 := serveForTest(t, root)
	if res, err := s2.runIn(t, e, wire.RunRequest{Shell: "id -u"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("run after a restart = %+v, %v", res, err)
	}
	if th := readyThread(t, s2, e); th == te {
		t.Errorf("the restarted helper has the old thread")
	}
}
