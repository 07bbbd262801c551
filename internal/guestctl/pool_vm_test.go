package guestctl

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// labPoolSize is how many ready sessions the lab's resident helper keeps
// for one-shot runs (guest/agent's DefaultPoolSize).
const labPoolSize = 2

// oneShotIDs lists vm's one-shot sessions (ready, running or being
// destroyed), from their metadata.
func oneShotIDs(t *testing.T, ctx context.Context, h *Helper, vm string) []string {
	t.Helper()
	out := sh(t, ctx, h, vm, `cd /var/lib/vmgate/meta 2>/dev/null || exit 0; grep -l '"oneshot":true' *.json 2>/dev/null | sed 's/[.]json$//' | sort`).Stdout
	return strings.Fields(string(out))
}

// poolReady waits until vm's pool holds labPoolSize sessions and no other
// one-shot session is left (the runs before are destroyed), and returns
// their ids: the next one-shot run takes one of them.
func poolReady(t *testing.T, ctx context.Context, h *Helper, vm string, before []string) []string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ids := oneShotIDs(t, ctx, h, vm)
		stale := slices.ContainsFunc(ids, func(id string) bool { return slices.Contains(before, id) })
		if len(ids) == labPoolSize && !stale {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("one-shot sessions in %s after a minute: %v (the runs before: %v); want %d ready and none of those", vm, ids, before, labPoolSize)
		}
	}
}

// fillPool runs a one-shot command on vm, which starts the pool, and
// returns the session it ran in: poolReady must not count it among the
// ready ones while its destroy is pending.
func fillPool(t *testing.T, ctx context.Context, h *Helper, vm string) []string {
	t.Helper()
	res, err := h.Run(ctx, vm, RunRequest{Sandbox: &Sandbox{BestEffort: bestEffort(vm)}, Shell: `echo "$HOME"`})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("first one-shot run (fills the pool) = %+v, %v", res, err)
	}
	return []string{filepath.Base(strings.TrimSpace(string(res.Stdout)))}
}

// pooledRun runs line as a one-shot sandboxed command on a full pool and
// returns its result and the session it ran in, which it checks was one
// of the ready ones.
func pooledRun(t *testing.T, ctx context.Context, h *Helper, vm string, line string, before []string) (RunResult, Session) {
	t.Helper()
	ready := poolReady(t, ctx, h, vm, before)
	res, err := h.Run(ctx, vm, RunRequest{Sandbox: &Sandbox{BestEffort: bestEffort(vm)}, TimeoutMS: 20000,
		Shell: `echo "pooled $HOME $(id -u)" >&2; ` + line})
	if err != nil {
		t.Fatalf("one-shot Run(%q) = %v", line, err)
	}
	first, rest, _ := strings.Cut(string(res.Stderr), "\n")
	var home string
	var uid int
	if _, err := fmt.Sscanf(first, "pooled %s %d", &home, &uid); err != nil {
		t.Fatalf("one-shot run's first line %q: %v", first, err)
	}
	s := Session{ID: filepath.Base(home), Workdir: home}
	s.Enforced.UID, s.Enforced.GID = uid, uid
	if !slices.Contains(ready, s.ID) {
		t.Fatalf("the one-shot run ran in %s; want one of the ready sessions %v", s.ID, ready)
	}
	res.Stderr = []byte(rest)
	return res, s
}

// TestLabOneShotPooled: a one-shot run takes a ready session of the
// resident helper's pool; it sees nothing of the run before (files,
// processes, environment), the same confinement as a session made for it
// (the same view of itself, but for its own ids), and the escape attempts
// of TestLabSandboxEscapes fail in it as they do in a session.
func TestLabOneShotPooled(t *testing.T) {
	for _, vm := range []string{"cg", "nocg"} {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 10*time.Minute)
			if r := h.CheckRoad(ctx, vm); r.Kind != RoadResident {
				t.Fatalf("road = %s; want resident", r)
			}
			l := setUpEscapes(t, ctx, h, vm)
			first := fillPool(t, ctx, h, vm)
			one, s1 := pooledRun(t, ctx, h, vm, `echo one > $HOME/left; echo one > /tmp/left; env | grep -c FROM_ONE; sleep 1098 </dev/null >/dev/null 2>&1 &`, first)
			if one.ExitCode != 0 {
				t.Fatalf("first pooled run = %+v", one)
			}
			for deadline := time.Now().Add(time.Minute); len(matching(t, ctx, h, vm, "", "sleep 1098")) > 0; {
				if time.Now().After(deadline) {
					t.Fatalf("the first pooled run's background process still runs a minute after it ended")
				}
			}
			two, s2 := pooledRun(t, ctx, h, vm, `ls -A $HOME | wc -l; ls -A /tmp | wc -l; env | grep -c FROM_ONE; exit 0`, []string{s1.ID})
			if got := strings.Fields(string(two.Stdout)); !slices.Equal(got, []string{"0", "0", "0"}) || s2.Enforced.UID == s1.Enforced.UID {
				t.Errorf("second pooled run saw %q with uid %d (the first's %d); want an empty workdir and /tmp, no FROM_ONE, another uid",
					got, s2.Enforced.UID, s1.Enforced.UID)
			}
			before := []string{s2.ID}
			t.Run("same view as a session's", func(t *testing.T) { before = []string{sameViewAsSession(t, ctx, h, vm, l.a, before)} })
			for _, tc := range escapeCases {
				if tc.needCgroup { // its check needs the background process, which the pool's destroy ends after the reply
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					pl := *l
					line := tc.shell(&pl)
					res, s := pooledRun(t, ctx, h, vm, line, before)
					before = []string{s.ID}
					pl.a = s
					out := string(res.Stdout) + string(res.Stderr)
					if res.ExitCode == 0 {
						t.Errorf("%q in a pooled session exited 0: %q", line, out)
					}
					if why := tc.held(t, &pl, out); why != "" {
						t.Errorf("%q: the sandbox did not hold in a pooled session: %s (output %q)", line, why, out)
					}
				})
			}
		})
	}
}

// viewProbe prints what a command sees of its confinement.
const viewProbe = `id -u; id -g; id -G; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status
cat /proc/net/dev | cut -d: -f1; awk '{print $5, $6}' /proc/self/mountinfo | grep -v /netns/ | sort
env | grep -v -E '^(_|SHLVL|PWD|OLDPWD)=' | sort; pwd; ls -A . /tmp; sed 's/[0-9a-f]\{24\}$/RUN/' /proc/self/cgroup
for p in /etc /root / . /tmp /var/lib/vmgate; do touch "$p/probe-x" 2>/dev/null && echo "wrote $p"; done; ulimit -a`

var (
	viewSecret = regexp.MustCompile(`(VMGATE_SESSION=SID)\.[0-9a-f]+`)
	viewRun    = regexp.MustCompile(`(VMGATE_RUN=)[0-9a-f]+`)
)

// viewOf is a probe's output with what is each session's own replaced:
// its id, its uid, its marker's secret, the run's id.
func viewOf(out []byte, s Session) string {
	v := strings.ReplaceAll(string(out), s.ID, "SID")
	v = strings.ReplaceAll(v, strconv.Itoa(s.Enforced.UID), "UID")
	v = viewRun.ReplaceAllString(v, "${1}RUN")
	return viewSecret.ReplaceAllString(v, "$1.SECRET")
}

// sameViewAsSession: the probe sees the same in a pooled session as in
// session s, made by create. It returns the pooled session's id.
func sameViewAsSession(t *testing.T, ctx context.Context, h *Helper, vm string, s Session, before []string) string {
	pooled, ps := pooledRun(t, ctx, h, vm, viewProbe, before)
	inS, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: viewProbe, TimeoutMS: 20000})
	if err != nil {
		t.Fatal(err)
	}
	a, b := viewOf(pooled.Stdout, ps), viewOf(inS.Stdout, s)
	if a != b || pooled.ExitCode != inS.ExitCode {
		t.Errorf("a pooled run saw (exit %d)\n%s\na session's run (exit %d)\n%s\nwant the same", pooled.ExitCode, a, inS.ExitCode, b)
	}
	if !strings.Contains(a, "NoNewPrivs:\t1") || !strings.Contains(a, "CapEff:\t0000000000000000") || strings.Contains(a, "wrote /etc") {
		t.Errorf("the probe saw no confinement:\n%s", a)
	}
	return ps.ID
}

// TestLabOneShotJobPooled: a one-shot sandboxed job (wait: false with a
// sandbox) takes a ready session of the pool, like a one-shot run; when it
// ends, what it left running is killed and its session destroyed, and the
// pool fills again with others.
func TestLabOneShotJobPooled(t *testing.T) {
	h, _ := labHelper(t, "cg")
	ctx := testCtx(t, 10*time.Minute)
	if r := h.CheckRoad(ctx, "cg"); r.Kind != RoadResident {
		t.Fatalf("road = %s; want resident", r)
	}
	ready := poolReady(t, ctx, h, "cg", fillPool(t, ctx, h, "cg"))
	st, err := h.Start(ctx, "cg", RunRequest{Sandbox: &Sandbox{}, TimeoutMS: 60000,
		Shell: `echo "pooled $HOME"; sleep 1099 </dev/null >/dev/null 2>&1 & sleep 0.5; echo done`})
	if err != nil {
		t.Fatalf("Start(one-shot sandbox) = %v; want nil", err)
	}
	var out []byte
	js := JobStatus{State: wire.JobRunning}
	for cur := (Cursor{}); js.State == wire.JobRunning || js.Stdout.More; cur.Stdout = js.Stdout.Next {
		if js, err = h.Status(ctx, "cg", StatusRequest{ID: st.ID, Since: cur, Wait: 10 * time.Second}); err != nil {
			t.Fatalf("Status(%s) = %v; want nil", st.ID, err)
		}
		out = append(out, js.Stdout.Data...)
	}
	var home string
	if _, err := fmt.Sscanf(string(out), "pooled %s\ndone\n", &home); err != nil || js.ExitCode != 0 || js.Canceled || js.TimedOut {
		t.Fatalf("one-shot job ended %+v with output %q (%v); want exit 0 with its home and done", js, out, err)
	}
	id := filepath.Base(home)
	if !slices.Contains(ready, id) {
		t.Fatalf("the one-shot job ran in %s; want one of the ready sessions %v", id, ready)
	}
	for deadline := time.Now().Add(time.Minute); len(matching(t, ctx, h, "cg", "", "sleep 1099")) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("the one-shot job's background process still runs a minute after it ended")
		}
	}
	// The pool is full again without the job's session: it was destroyed.
	poolReady(t, ctx, h, "cg", []string{id})
}
