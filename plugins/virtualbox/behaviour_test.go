package virtualbox

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/vboxemu"
)

// verboseMarker is a line the release's run loop prints.
func verboseMarker(version string) string {
	if version == "6.1" {
		return "waitResult: "
	}
	return "Wait result is '"
}

// TestRunPerVersion covers what differs between the releases in `run`,
// through the driver against each emulated release:
//   - argv: the guest gets exactly the requested argv (7.x would run
//     "/bin/sh sh -c" with --exe); run is called without --exe.
//   - the verbose text never reaches stdout, also when VBoxManage's
//     buffered blocks land before and between the guest's output.
//   - a working directory goes with --cwd on 7.1 and through the shell
//     wrapper before it.
func TestRunPerVersion(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			e := newEmulator(t, v, []*vboxemu.Machine{machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)},
				func(w *vboxemu.World) { w.StdoutBuffer = 512 })
			d := e.driver(t, func(c *Config) { c.StdioBlock = 512 })
			t.Run("Argv", func(t *testing.T) { checkArgv(t, e, d) })
			t.Run("QuietThenOutput", func(t *testing.T) { checkQuietThenOutput(t, e, d, v) })
			t.Run("BigOutput", func(t *testing.T) { checkBigOutput(t, e, d, v) })
			t.Run("Cwd", func(t *testing.T) { checkCwd(t, e, d, v) })
		})
	}
}

func checkArgv(t *testing.T, e *emulator, d *Driver) {
	e.resetLog()
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `printf '[%s]' "$0" "$@"`, "zero", "a", "b c", ""}}
	res, err := d.Run(ctxT(t), "t1", req)
	if err != nil || string(res.Stdout) != "[zero][a][b c][]" || res.ExitCode != 0 {
		t.Fatalf("Run(%q) = %q, exit %d, %v; want [zero][a][b c][], exit 0", req.Argv, res.Stdout, res.ExitCode, err)
	}
	runs := e.runCalls(t)
	if len(runs) != 1 {
		t.Fatalf("%d run calls; want 1", len(runs))
	}
	argv := runs[0].Argv
	i := slices.Index(argv, "--")
	if slices.Contains(argv, "--exe") || i < 0 || !slices.Equal(argv[i+1:], req.Argv) {
		t.Errorf("run argv %q; want no --exe and the request's argv after --", argv)
	}
}

// checkQuietThenOutput: a command that prints after a while; the loop's
// lines fill blocks that reach the pipe before the output.
func checkQuietThenOutput(t *testing.T, e *emulator, d *Driver, version string) {
	e.resetLog()
	res, err := d.Run(ctxT(t), "t1", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 1; echo done"}})
	if err != nil || string(res.Stdout) != "done\n" || res.ExitCode != 0 || res.PID <= 0 {
		t.Fatalf("Run(sleep 1; echo done) = %q, exit %d, pid %d, %v; want done, exit 0, the pid", res.Stdout, res.ExitCode, res.PID, err)
	}
	raw := e.runCalls(t)[0].Stdout
	if i := strings.Index(raw, verboseMarker(version)); i < 0 || i > strings.LastIndex(raw, "done\n") {
		t.Errorf("VBoxManage's stdout %q; want verbose text before the guest's output (the case under test)", raw[:min(200, len(raw))])
	}
}

// checkBigOutput: output beyond one 64 KiB read; verbose blocks fall
// between the reads.
func checkBigOutput(t *testing.T, e *emulator, d *Driver, version string) {
	e.resetLog()
	const n = 200000
	res, err := d.Run(ctxT(t), "t1", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "head -c 200000 /dev/zero | tr '\\000' x; echo err >&2"}, MaxOutputBytes: 1 << 20})
	if err != nil || len(res.Stdout) != n || bytes.Count(res.Stdout, []byte("x")) != n || string(res.Stderr) != "err\n" {
		t.Fatalf("Run(200000 x) = %d bytes (%d x), stderr %q, %v; want %d x, err", len(res.Stdout), bytes.Count(res.Stdout, []byte("x")), res.Stderr, err, n)
	}
	raw := e.runCalls(t)[0].Stdout
	first, last := strings.Index(raw, "x"), strings.LastIndex(raw, "x")
	if between := strings.Index(raw[first:last], verboseMarker(version)); between < 0 {
		t.Errorf("VBoxManage's stdout has no verbose text between the guest's output; want some (the case under test)")
	}
}

func checkCwd(t *testing.T, e *emulator, d *Driver, version string) {
	e.resetLog()
	res, err := d.Run(ctxT(t), "t1", hypervisor.ExecRequest{Argv: []string{"pwd"}, Cwd: "/proc"})
	if err != nil || string(res.Stdout) != "/proc\n" {
		t.Fatalf("Run(pwd) in /proc = %q, %v; want /proc", res.Stdout, err)
	}
	argv := e.runCalls(t)[0].Argv
	hasCwd := slices.Contains(argv, "--cwd")
	if want := version == "7.1"; hasCwd != want {
		t.Errorf("VirtualBox %s: run argv %q has --cwd %v; want %v", version, argv, hasCwd, want)
	}
}

// TestCwdOlderAdditions: on 7.1 with 7.0 Guest Additions, --cwd fails
// before anything runs; the driver then uses the wrapper, and keeps doing so.
func TestCwdOlderAdditions(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	m := machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)
	m.GAVersion = "7.0.18"
	e := newEmulator(t, "7.1", []*vboxemu.Machine{m})
	d := e.driver(t)
	for i := range 2 {
		res, err := d.Run(ctxT(t), "t1", hypervisor.ExecRequest{Argv: []string{"pwd"}, Cwd: "/proc"})
		if err != nil || string(res.Stdout) != "/proc\n" {
			t.Fatalf("Run(pwd) in /proc, #%d = %q, %v; want /proc", i+1, res.Stdout, err)
		}
	}
	var withCwd int
	for _, c := range e.runCalls(t) {
		if slices.Contains(c.Argv, "--cwd") {
			withCwd++
			if !strings.Contains(c.Stderr, "Setting the current working directory is not supported") {
				t.Errorf("run with --cwd: stderr %q; want the Additions' refusal", c.Stderr)
			}
		}
	}
	if runs := len(e.runCalls(t)); withCwd != 1 || runs != 3 {
		t.Errorf("%d runs, %d with --cwd; want 3 runs, 1 with --cwd (then the wrapper, remembered)", runs, withCwd)
	}
}

// TestHostServiceMissing: "The guest execution service is not available"
// is VirtualBox's own guest control service missing, not exec disabled in
// the guest.
func TestHostServiceMissing(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	m := machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)
	m.HostServiceMissing = true
	d := newEmulator(t, "7.1", []*vboxemu.Machine{m}).driver(t)
	_, err := d.Run(ctxT(t), "t1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
	if !errors.Is(err, hypervisor.ErrBackend) || errors.Is(err, hypervisor.ErrCommandDisabled) || !strings.Contains(err.Error(), "host service") {
		t.Errorf("Run() without the host service = %v; want %v naming the host service, not %v", err, hypervisor.ErrBackend, hypervisor.ErrCommandDisabled)
	}
}

// TestAdditionsMissing: without Guest Additions the agent is unavailable
// (not exec disabled).
func TestAdditionsMissing(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	m := machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)
	m.GAVersion = "none"
	d := newEmulator(t, "7.0", []*vboxemu.Machine{m}).driver(t)
	_, err := d.Run(ctxT(t), "t1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
	if !errors.Is(err, hypervisor.ErrAgentUnavailable) || errors.Is(err, hypervisor.ErrCommandDisabled) {
		t.Errorf("Run() without Additions = %v; want %v", err, hypervisor.ErrAgentUnavailable)
	}
}

// TestCOMServerDown: VBoxManage's "the VirtualBox COM server is not
// running" is about VBoxSVC, not about the VM.
func TestCOMServerDown(t *testing.T) {
	e := newEmulator(t, "6.1", []*vboxemu.Machine{machine("off", uuidOff, "", "")}, func(w *vboxemu.World) { w.COMServerDown = true })
	d := e.driver(t)
	_, err := d.Status(ctxT(t), "off")
	if !errors.Is(err, hypervisor.ErrBackend) || errors.Is(err, hypervisor.ErrVMNotRunning) || errors.Is(err, hypervisor.ErrUnknownVM) || !strings.Contains(err.Error(), "VBoxSVC") {
		t.Errorf("Status() with VBoxSVC down = %v; want %v naming VBoxSVC, neither %v nor %v", err, hypervisor.ErrBackend, hypervisor.ErrVMNotRunning, hypervisor.ErrUnknownVM)
	}
}

// TestWrapperWarnings: the Linux wrapper's warnings on stdout (vboxdrv
// missing) do not break parsing nor reach a command's output; the driver
// sets USER and LOGNAME so the wrapper has nothing to say about them.
func TestWrapperWarnings(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	e := newEmulator(t, "7.1", []*vboxemu.Machine{machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)}, func(w *vboxemu.World) { w.VBoxDrvMissing = true })
	d := e.driver(t)
	ctx := ctxT(t)
	if vms, err := d.ListVMs(ctx); err != nil || len(vms) != 1 {
		t.Fatalf("ListVMs() = %+v, %v; want t1", vms, err)
	}
	res, err := d.Run(ctx, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/echo", "hi"}})
	if err != nil || string(res.Stdout) != "hi\n" {
		t.Fatalf("Run(echo hi) = %q, %v; want hi", res.Stdout, err)
	}
	for _, c := range e.calls(t) {
		if !strings.HasPrefix(c.Stdout, "WARNING: The vboxdrv kernel module is not loaded.") || strings.Contains(c.Stdout, "LOGNAME") {
			t.Errorf("%q: stdout %q; want the vboxdrv warning and none about LOGNAME", c.Argv, c.Stdout[:min(120, len(c.Stdout))])
		}
	}
}

// TestFileReadExistingDirTarget: the emulated 7.x refuses copyfrom into an
// existing directory without a trailing slash (what the driver used to
// do, --target-directory), 6.1 takes it; the driver reads files on both.
func TestFileReadExistingDirTarget(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			e := newEmulator(t, v, []*vboxemu.Machine{machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)})
			dir := t.TempDir()
			code, stderr := e.run(t, "guestcontrol", "t1", "copyfrom", "--username", emuUser, "--passwordfile", e.passwordFile, "--target-directory", dir, "/proc/version")
			wantFail := v != "6.1"
			if (code != 0) != wantFail || wantFail && !strings.Contains(stderr, "already exists and is a directory") {
				t.Errorf("copyfrom --target-directory DIR: exit %d, stderr %q; want failure %v (7.x: already exists and is a directory)", code, stderr, wantFail)
			}
			got, err := e.driver(t).FileRead(ctxT(t), "t1", "/proc/version", 4096)
			if err != nil || !bytes.HasPrefix(got.Data, []byte("Linux version")) {
				t.Errorf("FileRead(/proc/version) = %q, %v; want the kernel's version line", got.Data, err)
			}
		})
	}
}

// run runs the emulator itself.
func (e *emulator) run(t *testing.T, args ...string) (int, string) {
	t.Helper()
	before := len(e.calls(t))
	cmd := commandFor(e.bin, args...)
	cmd.Run()
	calls := e.calls(t)
	if len(calls) <= before {
		t.Fatalf("emulator %q left no log line", args)
	}
	c := calls[len(calls)-1]
	return c.Code, c.Stderr
}

// TestExecStartEarlyPID: ExecStart returns the pid while the command still
// runs (it comes with the first block of verbose text, not at exit).
func TestExecStartEarlyPID(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	d := newEmulator(t, "7.1", []*vboxemu.Machine{machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)}).driver(t)
	ctx := ctxT(t)
	h, err := d.ExecStart(ctx, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 5; echo late"}})
	if err != nil || h.PID <= 0 {
		t.Fatalf("ExecStart(sleep 5) = %+v, %v; want a pid", h, err)
	}
	st, err := d.ExecStatus(ctx, "t1", h)
	if err != nil || st.Exited {
		t.Fatalf("ExecStatus right after start = %+v, %v; want still running", st, err)
	}
	res, err := hypervisor.Wait(ctx, d, "t1", h)
	if err != nil || string(res.Stdout) != "late\n" || res.PID != h.PID {
		t.Errorf("Wait() = %q, pid %d, %v; want late, pid %d", res.Stdout, res.PID, err, h.PID)
	}
}

// TestStdinStaged: stdin goes through a staged file that the wrapper
// removes.
func TestStdinStaged(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	d := newEmulator(t, "7.1", []*vboxemu.Machine{machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)}).driver(t)
	ctx := ctxT(t)
	res, err := d.Run(ctx, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `cat; ls /tmp | grep -c vmgate-stdin || true`}, Stdin: []byte("in\n")})
	if err != nil || string(res.Stdout) != "in\n0\n" {
		t.Errorf("Run(cat) with stdin = %q, %v; want in and no staged file left", res.Stdout, err)
	}
}

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		out          string
		major, minor int
		ok           bool
	}{
		{"7.1.6r167084\n", 7, 1, true},
		{"6.1.50_Ubuntur161033\n", 6, 1, true},
		{"7.0.20_BETA1r163906\n", 7, 0, true},
		{"WARNING: Environment variable LOGNAME or USER does not correspond to effective user id.\n7.0.18r162988\n", 7, 0, true},
		{"5.2.44r139111\n", 5, 2, false},
		{"Oracle VM VirtualBox Command Line Management Interface\n", 0, 0, false},
		{"", 0, 0, false},
	} {
		v, err := parseVersion([]byte(tc.out))
		if (err == nil) != tc.ok || tc.ok && (v.major != tc.major || v.minor != tc.minor) {
			t.Errorf("parseVersion(%q) = %d.%d, %v; want %d.%d, ok %v", tc.out, v.major, v.minor, err, tc.major, tc.minor, tc.ok)
		}
	}
}

// TestOutcome maps each ending of the verbose text to the result.
func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		trailer       string
		code, status  int
		exit          int
		interrupted   bool
		wantCode, sig int
		timedOut, err bool
	}{
		{trailer: "exit", code: 255, status: 500, exit: 126, wantCode: 255},
		{trailer: "exit", code: 7, status: 500, exit: 39, wantCode: 7},
		{trailer: "exit", code: 7, status: 500, exit: 1, err: true},
		{trailer: "exit", code: 9, status: 510, exit: 18, wantCode: -1, sig: 9},
		{trailer: "exit", code: 1, status: 511, exit: 19, err: true},
		{trailer: "host-timeout", exit: 20, wantCode: -1, sig: 9, timedOut: true},
		{trailer: "guest-timeout", exit: 20, wantCode: -1, sig: 9, timedOut: true},
		{trailer: "aborted", exit: 22, err: true},
		{trailer: "aborted", exit: 22, interrupted: true, wantCode: -1, sig: 9, timedOut: true},
		{trailer: "quit", exit: 1, err: true},
	} {
		r := &running{}
		r.interrupted.Store(tc.interrupted)
		var res hypervisor.ExecResult
		err := r.outcome("exec", tc.exit, &vmatcher{trailer: tc.trailer, code: tc.code, status: tc.status}, &res)
		if (err != nil) != tc.err || !tc.err && (res.ExitCode != tc.wantCode || res.Signal != tc.sig || res.TimedOut != tc.timedOut) {
			t.Errorf("outcome(%+v) = exit %d, signal %d, timed out %v, %v; want exit %d, signal %d, timed out %v, error %v",
				tc, res.ExitCode, res.Signal, res.TimedOut, err, tc.wantCode, tc.sig, tc.timedOut, tc.err)
		}
	}
}

// TestEmulatorTimeoutMessages: the emulated VBoxManage ends a run at its
// own deadline with "Process monitor loop timed out" (exit 20), or, when
// VBoxService's timer fires first, "Process timed out (guest side) and was
// terminated" (exit 20); the driver reads both as a timeout.
func TestEmulatorTimeoutMessages(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	for _, guestFirst := range []bool{false, true} {
		m := machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)
		m.GuestTimeoutFirst = guestFirst
		e := newEmulator(t, "7.1", []*vboxemu.Machine{m})
		code, _ := e.run(t, "guestcontrol", "t1", "run", "--username", emuUser, "--passwordfile", e.passwordFile, "--verbose", "--timeout", "1000", "--", "/bin/sleep", "30")
		out := e.calls(t)[0].Stdout
		want := "Process monitor loop timed out\n"
		if guestFirst {
			want = "Process timed out (guest side) and was terminated\n"
		}
		if code != 20 || !strings.Contains(out, want) {
			t.Errorf("run --timeout 1000 sleep 30 (guest first %v): exit %d, stdout ends %q; want 20 and %q", guestFirst, code, out[max(0, len(out)-120):], want)
		}
		g := newVerboseGrammar(true, runSpecText{user: emuUser, image: "/bin/sleep", args: []string{"/bin/sleep", "30"}, timeout: 1000})
		f := newVFilter(&g, &bytes.Buffer{}, 0, nil)
		f.Write([]byte(out))
		f.Close()
		var res hypervisor.ExecResult
		err := (&running{}).outcome("exec", code, f.m, &res)
		if !f.done() || err != nil || !res.TimedOut {
			t.Errorf("driver on that output: done %v, %+v, %v; want timed out", f.done(), res, err)
		}
	}
}

// commandFor runs the emulator as the driver would, with USER and LOGNAME
// set.
func commandFor(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = os.Environ()
	if u, err := user.Current(); err == nil {
		cmd.Env = append(cmd.Env, "USER="+u.Username, "LOGNAME="+u.Username)
	}
	return cmd
}

// TestTimeoutPIDUnknown: a command whose pid is still in VBoxManage's
// stdout buffer at its deadline (the run loop has not filled a block:
// WaitSpin 1) is interrupted at the deadline, through Run and through
// ExecStart and ExecStatus, in every release: the result is a timeout with
// the guest's output so far, the guest process is gone, and VBoxManage's
// own --timeout (a backstop later) never had to fire. The command execs
// its sleep: VBoxService's kill on the session close reaches the process
// only, not a child (the tree kill needs the pid).
func TestTimeoutPIDUnknown(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			e := newEmulator(t, v, []*vboxemu.Machine{machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)},
				func(w *vboxemu.World) { w.WaitSpin = 1 })
			d := e.driver(t)
			ctx := ctxT(t)
			req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; exec sleep 60"}, Timeout: 2 * time.Second}
			for _, async := range []bool{false, true} {
				e.resetLog()
				start := time.Now()
				var res hypervisor.ExecResult
				var err error
				if async {
					var h hypervisor.ExecHandle
					if h, err = d.ExecStart(ctx, "t1", req); err == nil {
						res, err = hypervisor.Wait(ctx, d, "t1", h)
					}
				} else {
					res, err = d.Run(ctx, "t1", req)
				}
				took := time.Since(start)
				// A correctness bound: VBoxManage's own deadline is the
				// timeout plus backstop (32 s); the driver's comes first.
				if err != nil || !res.TimedOut || string(res.Stdout) != "started\n" || took >= req.Timeout+backstop/2 {
					t.Fatalf("exec (async %v) of %q with timeout 2s = %+v, %v after %v; want timed out with stdout \"started\\n\" well before %v",
						async, req.Argv, res, err, took, req.Timeout+backstop)
				}
				calls := e.runCalls(t)
				if len(calls) != 1 || calls[0].Code != 22 || !strings.Contains(calls[0].Stdout, "Process execution aborted!\n") {
					t.Errorf("VBoxManage runs = %+v; want one, interrupted (exit 22, \"Process execution aborted!\")", calls)
				}
				probe, err := d.Run(ctx, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `kill -0 "$1" 2>/dev/null && echo alive || echo gone`, "sh", strconv.FormatInt(res.PID, 10)}})
				if err != nil || string(probe.Stdout) != "gone\n" {
					t.Errorf("guest process %d after the timeout: %q, %v; want gone", res.PID, probe.Stdout, err)
				}
			}
		})
	}
}
