package guestctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// residentVM reports whether vm has the resident helper's port.
func residentVM(vm string) bool { return vm != "noport" }

// serveLock is where the resident helper writes its pid.
const serveLock = "/var/lib/vmgate/serve.lock"

// endResident kills vm's resident helper, if one runs, from outside
// (SIGKILL through the agent, by the pid its lock file names, only while
// that pid is a vmgate-guest), and waits until it is gone.
func endResident(t testing.TB, ctx context.Context, h *Helper, vm string) {
	t.Helper()
	line := fmt.Sprintf(`p=$(cat %s 2>/dev/null); [ -n "$p" ] && grep -qx vmgate-guest /proc/$p/comm 2>/dev/null || exit 0
kill -9 $p; while [ -e /proc/$p/stat ] && [ "$(cut -d' ' -f3 /proc/$p/stat)" != Z ]; do sleep 0.05; done`, serveLock)
	if res := sh(t, ctx, h, vm, line); res.ExitCode != 0 {
		t.Fatalf("ending the resident helper: %q %q", res.Stdout, res.Stderr)
	}
}

// alive reports whether pid is a live vmgate-guest in vm, and its state letter.
func alive(t testing.TB, ctx context.Context, h *Helper, vm string, pid int) (bool, string) {
	t.Helper()
	res := sh(t, ctx, h, vm, fmt.Sprintf(`grep -qx vmgate-guest /proc/%d/comm 2>/dev/null && cut -d' ' -f3 /proc/%d/stat`, pid, pid))
	return res.ExitCode == 0, strings.TrimSpace(string(res.Stdout))
}

// TestLabRoads: each lab VM's road, and what holds around the resident
// helper, checked from outside.
func TestLabRoads(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 3*time.Minute)
			r := h.CheckRoad(ctx, vm)
			if !residentVM(vm) {
				if r.Kind != RoadPerCommand || !strings.Contains(r.Why, "no resident helper channel") || r.Jobs != "" {
					t.Fatalf("road of %s = %+v; want per-command, saying there is no channel", vm, r)
				}
				if _, err := h.PS(ctx, vm, ""); err != nil {
					t.Errorf("PS through the fallback = %v", err)
				}
				t.Logf("%s: %s", vm, r)
				return
			}
			bin, err := h.bins.Binary("amd64")
			if err != nil {
				t.Fatal(err)
			}
			if r.Kind != RoadResident || r.Via != ViaChannel || r.Helper == nil || r.Helper.SHA256 != bin.SHA256 || r.Helper.Port == "" {
				t.Fatalf("road of %s = %+v; want resident over virtio-serial, this build, with its port", vm, r)
			}
			t.Logf("%s: %s, helper pid %d on %s", vm, r, r.Helper.PID, r.Helper.Port)
			pid := r.Helper.PID
			checks := map[string]string{
				fmt.Sprintf("cat /proc/%d/oom_score_adj", pid):                              "-900",
				"stat -c '%a %u %g' " + r.Helper.Port:                                       "600 0 0",
				"stat -L -c '%a %u %g' /dev/virtio-ports/" + "org.vmgate.guest.0":           "600 0 0",
				"stat -L -c '%a %u %g' /dev/virtio-ports/" + "org.qemu.guest_agent.0":       "600 0 0",
				"stat -c '%a %u' /var/lib/vmgate/helper /var/lib/vmgate/helper/helper.sock": "700 0\n600 0",
			}
			if vm == "cg" { // its own cgroup (nocg mounts no cgroup v2)
				checks[fmt.Sprintf("grep -o '::.*' /proc/%d/cgroup", pid)] = "::/vmgate-helper"
			}
			for line, want := range checks {
				if got := strings.TrimSpace(string(sh(t, ctx, h, vm, line).Stdout)); got != want {
					t.Errorf("%s in %s = %q; want %q", line, vm, got, want)
				}
			}
		})
	}
}

// TestLabSessionJobStreams: a sandboxed session's job streams its output
// while it runs, read from a cursor: nothing lost, nothing repeated; a job
// writing more than its buffer reports exactly what was dropped.
func TestLabSessionJobStreams(t *testing.T) {
	for _, vm := range []string{"cg", "nocg"} {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 3*time.Minute)
			s := sandboxSession(t, ctx, h, vm, wire.Sandbox{BestEffort: bestEffort(vm)})
			gate := filepath.Join(s.Workdir, "gate")
			st, err := h.Start(ctx, vm, RunRequest{Session: s.ID, TimeoutMS: 120000,
				Shell: `echo first; while [ ! -e gate ]; do sleep 0.05; done; for i in 1 2 3; do echo line $i; sleep 0.2; done; echo err >&2; exit 5`})
			if err != nil {
				t.Fatalf("Start() = %v", err)
			}
			js, err := h.Status(ctx, vm, StatusRequest{ID: st.ID, Wait: 20 * time.Second})
			if err != nil || js.State != wire.JobRunning || string(js.Stdout.Data) != "first\n" || js.LastLine != "first" || js.Session != s.ID {
				t.Fatalf("Status while it waits = %+v, %v; want running, \"first\\n\", in the session", js, err)
			}
			sh(t, ctx, h, vm, "touch "+gate)
			got, cur := string(js.Stdout.Data), Cursor{Stdout: js.Stdout.Next}
			polls := 0
			for js.State == wire.JobRunning {
				js, err = h.Status(ctx, vm, StatusRequest{ID: st.ID, Since: cur, Wait: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				if js.Stdout.Offset != cur.Stdout || js.Stdout.Dropped != 0 {
					t.Fatalf("Status from %d: offset %d, dropped %d; want %d, 0", cur.Stdout, js.Stdout.Offset, js.Stdout.Dropped, cur.Stdout)
				}
				got, cur.Stdout = got+string(js.Stdout.Data), js.Stdout.Next
				polls++
			}
			if want := "first\nline 1\nline 2\nline 3\n"; got != want || js.ExitCode != 5 || js.State != wire.JobExited || string(js.Stderr.Data) != "err\n" {
				t.Errorf("streamed %q, end %+v; want %q, exit 5, stderr err", got, js, want)
			}
			if polls < 2 {
				t.Errorf("the output came in %d reads; want it while it ran (2 or more)", polls)
			}
			// A job writing 200 lines into a 1 KiB buffer.
			var full strings.Builder
			for i := range 200 {
				fmt.Fprintf(&full, "line-%03d-%s\n", i, strings.Repeat("x", 30))
			}
			st2, err := h.Start(ctx, vm, RunRequest{Session: s.ID, MaxOutputBytes: 1024,
				Shell: `i=0; while [ $i -lt 200 ]; do printf 'line-%03d-%s\n' $i ` + strings.Repeat("x", 30) + `; i=$((i+1)); done`})
			if err != nil {
				t.Fatal(err)
			}
			for js = (JobStatus{State: wire.JobRunning}); js.State == wire.JobRunning; {
				if js, err = h.Status(ctx, vm, StatusRequest{ID: st2.ID, Wait: 10 * time.Second}); err != nil {
					t.Fatal(err)
				}
			}
			total := int64(full.Len())
			if js.Stdout.Total != total || js.Stdout.Dropped != total-1024 || js.Stdout.Offset != total-1024 || string(js.Stdout.Data) != full.String()[total-1024:] {
				t.Errorf("wrapped job: total %d, dropped %d, offset %d, %d bytes; want %d, %d, %d and the last 1024 bytes",
					js.Stdout.Total, js.Stdout.Dropped, js.Stdout.Offset, len(js.Stdout.Data), total, total-1024, total-1024)
			}
		})
	}
}

// TestLabJobOutlivesHostRestart: a job runs on after the host side that
// started it is gone; a new driver and Helper on the same VM find it by
// id and read its output and exit status. A job whose own cap is shorter
// is ended at that cap.
func TestLabJobOutlivesHostRestart(t *testing.T) {
	v := labtest.VM(t, "cg")
	ctx := testCtx(t, 3*time.Minute)
	newHelper := func() (*Helper, func()) {
		d, err := qemu.New(qemu.Config{LabDir: filepath.Dir(v.Dir), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return New(d, &DirBinaries{Dirs: []string{guestDir}}), func() { d.Close() }
	}
	h1, close1 := newHelper()
	s := sandboxSession(t, ctx, h1, "cg", wire.Sandbox{})
	long, err := h1.Start(ctx, "cg", RunRequest{Session: s.ID, TimeoutMS: 60000, Shell: "echo start; sleep 4; echo end; exit 4"})
	if err != nil {
		t.Fatal(err)
	}
	capped, err := h1.Start(ctx, "cg", RunRequest{Session: s.ID, TimeoutMS: 1500, Shell: "echo capped; sleep 30"})
	if err != nil {
		t.Fatal(err)
	}
	close1() // the host goes: its driver, its connection to the helper
	h2, close2 := newHelper()
	defer close2()
	wait := func(id string) JobStatus {
		js := JobStatus{State: wire.JobRunning}
		for js.State == wire.JobRunning {
			if js, err = h2.Status(ctx, "cg", StatusRequest{ID: id, Wait: 10 * time.Second}); err != nil {
				t.Fatalf("Status(%s) from a new host = %v", id, err)
			}
		}
		return js
	}
	if js := wait(long.ID); string(js.Stdout.Data) != "start\nend\n" || js.ExitCode != 4 || js.TimedOut || js.DurationMS < 4000 {
		t.Errorf("the long job, read by a new host = %+v; want start, end, exit 4, 4 s or more", js)
	}
	if js := wait(capped.ID); string(js.Stdout.Data) != "capped\n" || !js.TimedOut || js.Killed < 1 || js.DurationMS >= 30000 {
		t.Errorf("the capped job = %+v; want its output, timed out at its 1.5 s cap, killed", js)
	}
	if r := h2.Road("cg"); r.Kind != RoadResident || r.Helper.PID == 0 {
		t.Errorf("road of the new host = %+v; want the same resident helper", r)
	}
}

// TestLabKillResidentRestarts: the resident helper killed from outside
// comes back on the next call, with every session; a job it ran is lost,
// and says so.
func TestLabKillResidentRestarts(t *testing.T) {
	h, _ := labHelper(t, "cg")
	ctx := testCtx(t, 3*time.Minute)
	s := sandboxSession(t, ctx, h, "cg", wire.Sandbox{})
	bg := bgPID(t, ctx, h, "cg", s.ID, "sleep 1093")
	job, err := h.Start(ctx, "cg", RunRequest{Session: s.ID, Shell: "echo started; sleep 1094", TimeoutMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	old := h.Road("cg").Helper.PID
	sh(t, ctx, h, "cg", fmt.Sprintf("kill -9 %d", old))
	sessions, err := h.SessionList(ctx, "cg")
	if err != nil {
		t.Fatalf("SessionList after the helper was killed = %v; want it restarted", err)
	}
	r := h.Road("cg")
	if r.Kind != RoadResident || r.Helper.PID == old {
		t.Errorf("road after the kill = %+v; want a new resident helper (not pid %d)", r, old)
	}
	found := false
	for _, x := range sessions {
		found = found || x.ID == s.ID
	}
	if !found {
		t.Errorf("SessionList after the restart = %+v; want session %s", sessions, s.ID)
	}
	if res, err := h.Run(ctx, "cg", RunRequest{Session: s.ID, Argv: []string{"id", "-u"}}); err != nil || strings.TrimSpace(string(res.Stdout)) != strconv.Itoa(s.Enforced.UID) {
		t.Errorf("Run in the session after the restart = %+v, %v; want its uid %d", res, err, s.Enforced.UID)
	}
	if res := sh(t, ctx, h, "cg", fmt.Sprintf("kill -0 %d", bg)); res.ExitCode != 0 {
		t.Errorf("the session's background process %d is gone after the helper's restart; want it running", bg)
	}
	js, err := h.Status(ctx, "cg", StatusRequest{ID: job.ID})
	if err != nil || js.State != wire.JobLost || js.Note == "" {
		t.Errorf("the job the killed helper ran = %+v, %v; want lost, with a note", js, err)
	}
	if n := len(matching(t, ctx, h, "cg", "", "sleep 1094")); n != 0 {
		t.Errorf("%d processes of the lost job are still running; want none", n)
	}
}

// TestLabSessionCannotReachHelper: a sandboxed session's process cannot
// open the helper's port or socket, signal it, trace it or replace its
// binary; checked from outside: the same helper runs, untraced, from the
// same binary, and answers.
func TestLabSessionCannotReachHelper(t *testing.T) {
	for _, vm := range []string{"cg", "nocg"} {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 3*time.Minute)
			pushEscape(t, ctx, h, vm)
			r := h.CheckRoad(ctx, vm)
			if r.Kind != RoadResident {
				t.Fatalf("road = %s; want resident", r)
			}
			pid, port := r.Helper.PID, r.Helper.Port
			sum := string(sh(t, ctx, h, vm, "sha256sum "+GuestPath).Stdout)
			s := sandboxSession(t, ctx, h, vm, wire.Sandbox{BestEffort: bestEffort(vm)})
			attempts := []string{
				escapeBin + " open /dev/virtio-ports/org.vmgate.guest.0",
				escapeBin + " open " + port,
				escapeBin + " dial-unix /var/lib/vmgate/helper/helper.sock",
				escapeBin + " signal " + strconv.Itoa(pid),
				escapeBin + " ptrace " + strconv.Itoa(pid),
				"cat /proc/" + strconv.Itoa(pid) + "/environ",
				"cp /bin/busybox " + GuestPath,
				"rm -f " + GuestPath,
				"mv " + GuestPath + " " + GuestPath + ".old",
			}
			for _, line := range attempts {
				res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: line, TimeoutMS: 20000})
				if err != nil {
					t.Fatalf("Run(%q) = %v", line, err)
				}
				if res.ExitCode == 0 {
					t.Errorf("%q in the session exited 0: %q %q", line, res.Stdout, res.Stderr)
				}
			}
			if ok, state := alive(t, ctx, h, vm, pid); !ok || state == "t" || state == "T" {
				t.Errorf("the helper (pid %d) after the attempts: alive %v, state %q; want running, not stopped", pid, ok, state)
			}
			if got := string(sh(t, ctx, h, vm, "sha256sum "+GuestPath).Stdout); got != sum {
				t.Errorf("the helper's binary after the attempts: %q; want %q", got, sum)
			}
			hello, err := h.Hello(ctx, vm)
			if err != nil || hello.PID != pid {
				t.Errorf("Hello after the attempts = %+v, %v; want pid %d answering", hello, err, pid)
			}
		})
	}
}

// TestLabUpgradeReplacesHelper: a host with another build replaces the
// running helper (its jobs are lost, and say so) and the new one answers.
func TestLabUpgradeReplacesHelper(t *testing.T) {
	h, _ := labHelper(t, "cg")
	ctx := testCtx(t, 3*time.Minute)
	old := h.CheckRoad(ctx, "cg")
	job, err := h.Start(ctx, "cg", RunRequest{Shell: "sleep 1095", TimeoutMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	// Another build: the same program with a byte appended (the loader
	// ignores it; the SHA-256 differs).
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(guestDir, FileName("amd64")))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileName("amd64")), append(b, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	h2 := New(h.d, &DirBinaries{Dirs: []string{dir}})
	bin2, _ := h2.bins.Binary("amd64")
	r := h2.CheckRoad(ctx, "cg")
	if r.Kind != RoadResident || r.Helper.SHA256 != bin2.SHA256 || r.Helper.PID == old.Helper.PID {
		t.Fatalf("road with another build = %+v; want a new resident helper running sha256 %s", r, bin2.SHA256)
	}
	js, err := h2.Status(ctx, "cg", StatusRequest{ID: job.ID})
	if err != nil || js.State == wire.JobRunning {
		t.Errorf("the old helper's job = %+v, %v; want ended with its helper", js, err)
	}
	// Back to this package's build, for the tests after.
	if r := New(h.d, h.bins).CheckRoad(ctx, "cg"); r.Kind != RoadResident {
		t.Fatalf("road back on this build = %s", r)
	}
}

// TestLabJobsNeedAResidentHelper: without the port, jobs go through the
// agent's exec to the helper's socket (started there), and work.
func TestLabJobsWithoutThePort(t *testing.T) {
	h, _ := labHelper(t, "noport")
	ctx := testCtx(t, 3*time.Minute)
	st, err := h.Start(ctx, "noport", RunRequest{Shell: "echo via-exec"})
	if err != nil {
		t.Fatalf("Start() without the port = %v; want the exec road to the helper's socket", err)
	}
	js := JobStatus{State: wire.JobRunning}
	for js.State == wire.JobRunning {
		if js, err = h.Status(ctx, "noport", StatusRequest{ID: st.ID, Wait: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if string(js.Stdout.Data) != "via-exec\n" {
		t.Errorf("job output = %q; want via-exec", js.Stdout.Data)
	}
	if r := h.Road("noport"); r.Kind != RoadPerCommand || r.Jobs != ViaCall {
		t.Errorf("road = %+v; want per-command for commands, jobs %s", r, ViaCall)
	}
	if _, err := h.Status(ctx, "noport", StatusRequest{ID: "000000000000000000000000"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Status of an unknown job = %v; want ErrNotFound", err)
	}
}
