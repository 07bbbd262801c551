//go:build linux

package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// servePool serves a resident helper whose root sandboxed sessions can
// use, on a host kernel that has Landlock and namespaces.
func servePool(t *testing.T, root string) *served {
	t.Helper()
	k := (&Agent{cfg: DefaultConfig()}).probeKernel()
	if k.landlockABI == 0 || !k.netns || !k.mountns {
		t.Skipf("this host kernel lacks Landlock or namespaces (%+v); the lab VM test covers the pool", k)
	}
	letOthersEnter(t, filepath.Dir(root))
	return serveForTest(t, root)
}

// hostBox is the sandbox of the pool tests: everything but a cgroup,
// which the host does not give.
func hostBox() *wire.Sandbox {
	return &wire.Sandbox{BestEffort: []wire.Feature{wire.FeatureCgroup}}
}

// ready lists the pool's ready sessions.
func (s *served) ready() []meta {
	p := s.a.res.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.ready)
}

// waitFull waits until the pool holds DefaultPoolSize sessions of sb and
// no other one-shot session is left (those of runs before are destroyed),
// and returns their ids.
func waitFull(t *testing.T, s *served) []string {
	t.Helper()
	var ids []string
	waitUntil(t, "a full pool and no other one-shot session", func() bool {
		r := s.ready()
		if len(r) != DefaultPoolSize {
			return false
		}
		ids = ids[:0]
		for _, m := range r {
			ids = append(ids, m.ID)
		}
		return slices.Equal(oneShotMetas(t, s.a), sorted(ids))
	})
	return ids
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// oneShotMetas lists the ids of the one-shot sessions with metadata.
func oneShotMetas(t *testing.T, a *Agent) []string {
	metas, err := a.readAllMeta()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range metas {
		if m.OneShot {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

func (s *served) oneShot(t *testing.T, req wire.RunRequest) wire.RunResult {
	t.Helper()
	if req.Sandbox == nil {
		req.Sandbox = hostBox()
	}
	req.TimeoutMS = 20000
	var res wire.RunResult
	if err := s.call(t, []string{"run"}, runJSON(t, req), &res); err != nil {
		t.Fatalf("one-shot run %q = %v", req.Shell, err)
	}
	return res
}

// TestPoolRunIsFresh: a run in a pooled session sees an empty workdir and
// /tmp, another uid, nothing of the run before (files, processes, env);
// the run before's session and its background process are gone; pooled
// sessions are in no list and take no other command.
func TestPoolRunIsFresh(t *testing.T) {
	s := servePool(t, t.TempDir())
	one := s.oneShot(t, wire.RunRequest{Env: map[string]string{"FROM_ONE": "secret-1"},
		Shell: `echo $HOME; id -u; echo one > $HOME/left; echo one > /tmp/left; sleep 1197 </dev/null >/dev/null 2>&1 &`})
	home1, uid1, _ := strings.Cut(strings.TrimSpace(string(one.Stdout)), "\n")
	if one.ExitCode != 0 || !strings.HasPrefix(filepath.Base(home1), oneShotPrefix) {
		t.Fatalf("first run = %+v; want exit 0 in a one-shot session", one)
	}
	waitUntil(t, "the first run's background process to end", func() bool { return len(procsWith(t, s.a, "sleep 1197")) == 0 })
	ready := waitFull(t, s)
	if slices.Contains(ready, filepath.Base(home1)) {
		t.Fatalf("the first run's session %s is back in the pool %v", home1, ready)
	}
	var list []wire.Session
	if err := s.call(t, []string{"session", "list"}, nil, &list); err != nil || len(list) != 0 {
		t.Errorf("session list with %d sessions ready = %+v, %v; want none listed", len(ready), list, err)
	}
	if err := s.call(t, []string{"run"}, runJSON(t, wire.RunRequest{Session: ready[0], Argv: []string{"true"}}), nil); !isCode(err, wire.CodeNotFound) {
		t.Errorf("run in a ready pooled session = %v; want %s", err, wire.CodeNotFound)
	}
	two := s.oneShot(t, wire.RunRequest{Shell: `echo $HOME; id -u; ls -A $HOME | wc -l; ls -A /tmp | wc -l; env | grep -c FROM_ONE; pgrep -fc 'sleep 119[7]'; exit 0`})
	lines := strings.Split(strings.TrimSpace(string(two.Stdout)), "\n")
	home2 := filepath.Base(lines[0])
	if !slices.Contains(ready, home2) {
		t.Fatalf("second run in %s; want one of the ready sessions %v", home2, ready)
	}
	want := []string{lines[0], lines[1], "0", "0", "0", "0"}
	if !slices.Equal(lines, want) || lines[1] == uid1 {
		t.Errorf("second run saw %q (uid of the first %s); want %q: an empty workdir and /tmp, no FROM_ONE, no sleep, another uid", lines, uid1, want)
	}
	if _, err := os.Stat(home1); !os.IsNotExist(err) {
		t.Errorf("the first run's workdir: %v; want it removed", err)
	}
}

// TestPoolConfinementMatchesFresh: what a command sees of its confinement
// (ids, capabilities, no_new_privs, network, mounts, environment, what it
// may write) is the same in a pooled session as in a session made for it,
// but for the ids and names that are each session's own.
func TestPoolConfinementMatchesFresh(t *testing.T) {
	s := servePool(t, t.TempDir())
	// outside is writable by every uid: only the confinement keeps the
	// command from writing there.
	outside := t.TempDir()
	if err := os.Chmod(outside, 0o777); err != nil {
		t.Fatal(err)
	}
	probe := `id -u; id -g; id -G; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status
ls /sys/class/net; awk '{print $5, $6}' /proc/self/mountinfo | grep -v /netns/ | sort; env | grep -v -E '^(_|SHLVL|PWD|OLDPWD)=' | sort; pwd; ls -A . /tmp
for p in /etc /root . /tmp "` + s.a.cfg.Root + `" "` + outside + `"; do touch "$p/.probe-$$" 2>/dev/null && rm "$p/.probe-$$" && echo "write $p"; done; ulimit -a`
	s.oneShot(t, wire.RunRequest{Shell: "true"})
	ready := waitFull(t, s)
	pooled := s.oneShot(t, wire.RunRequest{Shell: probe})
	fresh, err := s.a.SessionCreate(context.Background(), wire.SessionCreate{ID: "5a4db0c5a4db0c0000f1", Sandbox: hostBox()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.a.SessionDestroy(context.Background(), fresh.ID)
	var inFresh wire.RunResult
	if err := s.call(t, []string{"run"}, runJSON(t, wire.RunRequest{Session: fresh.ID, Shell: probe, TimeoutMS: 20000}), &inFresh); err != nil {
		t.Fatal(err)
	}
	pooledID := filepath.Base(strings.SplitN(envLine(pooled.Stdout, "HOME"), "=", 2)[1])
	if !slices.Contains(ready, pooledID) {
		t.Fatalf("the probe ran in %s; want one of the ready sessions %v", pooledID, ready)
	}
	a, b := normalise(pooled.Stdout, pooledID), normalise(inFresh.Stdout, fresh.ID)
	if a != b || pooled.ExitCode != inFresh.ExitCode {
		t.Errorf("pooled run saw (exit %d)\n%s\nand a fresh session's (exit %d)\n%s\nwant the same", pooled.ExitCode, a, inFresh.ExitCode, b)
	}
	if !strings.Contains(a, "CapEff:\t0000000000000000") || !strings.Contains(a, "NoNewPrivs:\t1") ||
		!strings.Contains(a, "write .\n") || !strings.Contains(a, "write /tmp\n") || strings.Contains(a, "write "+outside) {
		t.Errorf("the probe saw no confinement:\n%s", a)
	}
}

func envLine(out []byte, key string) string {
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, key+"=") {
			return l
		}
	}
	return key + "="
}

var (
	secretMarker = regexp.MustCompile(`(VMGATE_SESSION=SID)\.[0-9a-f]+`)
	runMarker    = regexp.MustCompile(`(VMGATE_RUN=)[0-9a-f]+`)
)

// normalise replaces what is each session's own: its id, its uid (the
// first line), the marker's secret.
func normalise(out []byte, id string) string {
	s := string(out)
	uid, _, _ := strings.Cut(s, "\n")
	s = strings.ReplaceAll(s, id, "SID")
	if _, err := strconv.Atoi(uid); err == nil {
		s = strings.ReplaceAll(s, uid, "UID")
	}
	s = runMarker.ReplaceAllString(s, "${1}RUN")
	return secretMarker.ReplaceAllString(s, "$1.SECRET")
}

// TestPoolNeverTwice: concurrent one-shot runs each get a session of
// their own.
func TestPoolNeverTwice(t *testing.T) {
	s := servePool(t, t.TempDir())
	s.oneShot(t, wire.RunRequest{Shell: "true"})
	waitFull(t, s)
	var mu sync.Mutex
	homes := map[string]int{}
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := s.oneShot(t, wire.RunRequest{Shell: "echo $HOME"})
			mu.Lock()
			homes[strings.TrimSpace(string(res.Stdout))]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(homes) != 6 {
		t.Errorf("6 concurrent one-shot runs ran in %d sessions %v; want 6", len(homes), homes)
	}
	var h wire.Hello
	if err := s.call(t, []string{"hello"}, nil, &h); err != nil {
		t.Fatal(err)
	}
	if p := h.Pool; p == nil || p.Hits+p.Misses != 7 || p.Hits < int64(DefaultPoolSize) || p.Size != DefaultPoolSize {
		t.Errorf("hello's pool = %+v; want 7 runs counted, at least the %d ready ones hits", p, DefaultPoolSize)
	}
}

// TestPoolFollowsTheSandboxAndEmptiesOnStop: a run with another sandbox
// empties the pool (its sessions are destroyed) and refills it with that
// sandbox; the pool never holds more than its size; stopping the helper
// leaves no one-shot session behind, and a helper that starts destroys
// those a helper before it left.
func TestPoolFollowsTheSandboxAndEmptiesOnStop(t *testing.T) {
	root := t.TempDir()
	s := servePool(t, root)
	s.oneShot(t, wire.RunRequest{Shell: "true"})
	first := waitFull(t, s)
	loop := &wire.Sandbox{Net: wire.NetLoopback, BestEffort: []wire.Feature{wire.FeatureCgroup}}
	s.oneShot(t, wire.RunRequest{Shell: "true", Sandbox: loop})
	second := waitFull(t, s)
	for _, id := range second {
		if slices.Contains(first, id) {
			t.Errorf("session %s of the first sandbox is still in the pool %v", id, second)
		}
	}
	for _, m := range s.ready() {
		if m.Sandbox == nil || m.Sandbox.Net != wire.NetLoopback {
			t.Errorf("ready session %s has sandbox %+v; want net loopback", m.ID, m.Sandbox)
		}
	}
	s.stop()
	if left := oneShotMetas(t, s.a); len(left) != 0 {
		t.Errorf("one-shot sessions after the helper stopped: %v; want none", left)
	}
	for _, dir := range []string{"sessions", "tmp", "netns"} {
		if ents, _ := os.ReadDir(filepath.Join(root, dir)); len(ents) != 0 {
			t.Errorf("%s after the helper stopped holds %d entries; want none", dir, len(ents))
		}
	}
	// A helper that died left one: the next one destroys it at its start.
	m, err := s.a.createSession(wire.SessionCreate{ID: oneShotID(), Sandbox: hostBox()}, true)
	if err != nil {
		t.Fatal(err)
	}
	s2 := servePool(t, root)
	if left := oneShotMetas(t, s2.a); len(left) != 0 || exists(m.Workdir) {
		t.Errorf("one-shot sessions after a new helper started: %v (workdir there: %v); want none", left, exists(m.Workdir))
	}
}

// TestPoolBoundsPendingDestroys: with maxPendingJobs destroys queued, a
// run's session is destroyed by the run itself, before runEnded returns.
func TestPoolBoundsPendingDestroys(t *testing.T) {
	k := (&Agent{cfg: DefaultConfig()}).probeKernel()
	if k.landlockABI == 0 || !k.netns || !k.mountns {
		t.Skipf("this host kernel lacks Landlock or namespaces (%+v)", k)
	}
	a := sandboxAgent(t)
	p := &sessionPool{a: a, size: 0, done: make(chan struct{})} // no worker: what is queued stays queued
	p.cond = sync.NewCond(&p.mu)
	ids := make([]string, maxPendingJobs+1)
	for i := range ids {
		m, err := a.createSession(wire.SessionCreate{ID: oneShotID(), Sandbox: hostBox()}, true)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = m.ID
	}
	for _, id := range ids {
		p.runEnded(id)
	}
	if n := len(p.jobs); n != maxPendingJobs {
		t.Errorf("%d destroys queued; want %d", n, maxPendingJobs)
	}
	if left := oneShotMetas(t, a); len(left) != maxPendingJobs || slices.Contains(left, ids[maxPendingJobs]) {
		t.Errorf("one-shot sessions left %v; want the %d queued ones, not %s", left, maxPendingJobs, ids[maxPendingJobs])
	}
	for _, job := range p.jobs {
		job()
	}
}

func TestServeOneShotPoolFlag(t *testing.T) {
	a := hostAgent(t)
	for _, v := range []string{"-1", "17", "x"} {
		var out bytes.Buffer
		if code := a.ServeMain([]string{"--oneshot-pool", v, "--socket", filepath.Join(t.TempDir(), "s")}, &out); code != 1 ||
			!strings.Contains(out.String(), "oneshot-pool") {
			t.Errorf("serve --oneshot-pool %s = %d %s; want 1 and the flag named", v, code, out.String())
		}
	}
}
