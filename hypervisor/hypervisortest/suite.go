// Package hypervisortest helps test code built on hypervisor.Driver.
//
// Fake is a driver made of function fields for unit tests of other packages.
// Run is the conformance suite every driver passes against a live VM (the
// QEMU driver on a lab VM; libvirt, VirtualBox and Proxmox drivers through
// their emulators; and each of them again through the go-plugin boundary).
// RunPower is the separate power suite, and RunSnapshots the snapshot
// suite, each for a VM the calling test owns. Harness.Capabilities declares
// the driver's optional capabilities exactly; Run checks the declaration
// and the capabilities that only read (guest network, metrics) it lists.
//
// The suite talks to the guest only through the driver under test. It
// assumes a Linux guest with a POSIX userland: /bin/sh, /bin/echo, cat,
// head, sleep, stat, pwd, rm and /proc.
package hypervisortest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

// Harness says what the suite runs against.
type Harness struct {
	// Driver is the driver under test.
	Driver hypervisor.Driver
	// VM is a running VM, known to Driver, whose guest agent answers and has
	// guest-exec and the file commands enabled. Required.
	VM string
	// NoExecVM is a running VM whose guest agent answers but has guest-exec
	// disabled (qemu-ga --block-rpcs=guest-exec). Empty skips the NoExec checks
	// with a reason; CI must provide it so that they run.
	NoExecVM string
	// UnknownVM is a name Driver does not know; empty means "no-such-vm-xyz".
	UnknownVM string
	// Dir is a writable directory inside VM for the suite's scratch files and
	// the Cwd check; empty means "/tmp". Files the suite creates there are
	// removed afterwards.
	Dir string
	// CallTimeout and PowerTimeout are for an idle machine: the waits
	// scale them with its load (package testload).
	// CallTimeout bounds each check's calls; zero means 2 minutes (TCG guests
	// are slow). It is a bound against hangs, not a speed requirement.
	CallTimeout time.Duration
	// PowerTimeout bounds each wait for a power transition in RunPower; zero
	// means 5 minutes.
	PowerTimeout time.Duration
	// Capabilities are the optional capabilities Driver has, exactly
	// (Snapshots, GuestNetwork, Metrics, Create): Run's Capabilities/Declared check
	// fails when CapabilitiesOf(Driver) says otherwise, Run has the Network
	// and Metrics groups only for the capabilities declared here, and
	// RunSnapshots fails unless Snapshots is declared (caps.go). A missing
	// capability is a declared fact checked every run, never a skip.
	Capabilities hypervisor.Capabilities
	// NetworkIPv4Only says GuestNetwork reports what VirtualBox's Guest
	// Additions publish (VBoxServiceVMInfo.cpp): only the interfaces with
	// an IPv4 address, the loopback left out, one address each. The
	// Network/Interfaces check then holds the driver to that instead of to
	// the guest's whole interface list.
	NetworkIPv4Only bool
	// DiskDir, when set, is a writable directory inside VM on a disk the
	// VM's snapshots cover (the lab guest's /data); RunSnapshots then also
	// checks that files there are reverted.
	DiskDir string
	// BeforeGroup, when set, runs before each group of Run with the group's
	// name: a harness changes the world between checks there (the Proxmox
	// cluster test migrates VM from node to node). Run's checks must pass
	// whatever it does to VM short of stopping it.
	BeforeGroup func(t *testing.T, group string)
	// StopAgent and ResumeAgent stop VM's guest agent so that it does not
	// answer (SIGSTOP: the guest's init does not restart it) and let it go
	// on again, for RunWithoutAgent. See StopAgentByExec and
	// ResumeAgentByConsole.
	StopAgent   func(t testing.TB)
	ResumeAgent func(t testing.TB)
}

func (h Harness) unknownVM() string {
	if h.UnknownVM == "" {
		return "no-such-vm-xyz"
	}
	return h.UnknownVM
}

func (h Harness) dir() string {
	if h.Dir == "" {
		return "/tmp"
	}
	return strings.TrimSuffix(h.Dir, "/")
}

func (h Harness) callTimeout() time.Duration {
	if h.CallTimeout <= 0 {
		return 2 * time.Minute
	}
	return h.CallTimeout
}

func (h Harness) powerTimeout() time.Duration {
	if h.PowerTimeout <= 0 {
		return 5 * time.Minute
	}
	return h.PowerTimeout
}

// ctx returns a context bounded by the harness's call timeout, cancelled
// when the check ends.
func (h Harness) ctx(t testing.TB) context.Context {
	ctx, cancel := testload.WithTimeout(context.Background(), h.callTimeout())
	t.Cleanup(cancel)
	return ctx
}

func (h Harness) validate(t testing.TB) {
	t.Helper()
	if h.Driver == nil {
		t.Fatal("hypervisortest: Harness.Driver is nil")
	}
	if h.VM == "" {
		t.Fatal("hypervisortest: Harness.VM is empty")
	}
	if h.VM == h.unknownVM() || h.NoExecVM == h.unknownVM() {
		t.Fatalf("hypervisortest: Harness.UnknownVM %q names a VM the harness says exists", h.unknownVM())
	}
}

// The guest's signal number for SIGKILL (Linux, every architecture we run).
const sigKill = 9

// A check is one conformance requirement. Checks take a testing.TB so the
// package's own tests can run them against broken drivers and see them fail.
type check struct {
	name string
	run  func(t testing.TB, h Harness)
}

type checkGroup struct {
	name   string
	checks []check
}

// suite is the shared conformance suite, in the order Run runs it. Nothing
// in it changes the VM's power state.
var suite = []checkGroup{
	{"Inventory", []check{
		{"ListVMs", checkListVMs},
		{"Status", checkStatus},
		{"AgentInfo", checkAgentInfo},
	}},
	{"Exec", []check{
		{"Echo", checkEcho},
		{"ArgvVerbatim", checkArgvVerbatim},
		{"ExitCode", checkExitCode},
		{"Stderr", checkStderr},
		{"Stdin", checkStdin},
		{"Env", checkEnv},
		{"Cwd", checkCwd},
		{"Signal", checkSignal},
		{"OutputCap", checkOutputCap},
		{"Timeout", checkTimeout},
		{"TimeoutStartPoll", checkTimeoutStartPoll},
		{"TimeoutKillsTree", checkTimeoutKillsTree},
		{"StartPoll", checkStartPoll},
		{"MissingBinary", checkMissingBinary},
		{"EmptyArgv", checkEmptyArgv},
		{"BogusHandle", checkBogusHandle},
		{"Concurrent", checkConcurrent},
	}},
	{"Files", []check{
		{"RoundTrip", checkFileRoundTrip},
		{"Mode", checkFileMode},
		{"ReadTruncated", checkFileReadTruncated},
		{"ReadMissing", checkFileReadMissing},
	}},
	{"Errors", []check{
		{"UnknownVM", checkUnknownVM},
		{"InvalidPowerAction", checkInvalidPowerAction},
		{"ExpiredDeadline", checkExpiredDeadline},
	}},
	{"NoExec", []check{
		{"Run", checkNoExecRun},
		{"AgentInfo", checkNoExecAgentInfo},
	}},
	{"Network", []check{
		{"Interfaces", checkGuestNetwork},
		{"UnknownVM", checkGuestNetworkUnknownVM},
	}},
	{"Metrics", []check{
		{"Figures", checkMetrics},
		{"UnknownVM", checkMetricsUnknownVM},
	}},
	{"Screen", nil}, // the checks of the declared capabilities (screen.go)
}

// Run runs the conformance suite against h, one subtest per requirement,
// grouped as Capabilities, Inventory, Exec, Files, Errors, NoExec, Network,
// Metrics and Screen (the last three for what Harness.Capabilities declares, which
// Capabilities/Declared holds the driver to). It does not change the VM's power state (see
// RunPower) nor revert it (see RunSnapshots), so it is safe on a shared
// VM; its subtests run one after another.
func Run(t *testing.T, h Harness) {
	t.Helper()
	h.validate(t)
	t.Run("Capabilities", func(t *testing.T) {
		t.Run("Declared", func(t *testing.T) { checkDeclaredCapabilities(t, h) })
	})
	for _, g := range suite {
		if (g.name == "Network" && !h.Capabilities.GuestNetwork) || (g.name == "Metrics" && !h.Capabilities.Metrics) {
			continue // the driver has not got it, as Capabilities/Declared checks
		}
		if g.name == "Screen" {
			if anyScreenCap(h.Capabilities) {
				if h.BeforeGroup != nil {
					h.BeforeGroup(t, g.name)
				}
				t.Run(g.name, func(t *testing.T) { runScreenGroup(t, h) })
			}
			continue
		}
		if h.BeforeGroup != nil {
			h.BeforeGroup(t, g.name)
		}
		t.Run(g.name, func(t *testing.T) {
			for _, c := range g.checks {
				t.Run(c.name, func(t *testing.T) { c.run(t, h) })
			}
		})
	}
}

// run runs req to completion through hypervisor.Run.
func run(t testing.TB, h Harness, req hypervisor.ExecRequest) hypervisor.ExecResult {
	t.Helper()
	res, err := hypervisor.Run(h.ctx(t), h.Driver, h.VM, req)
	if err != nil {
		t.Fatalf("Run(%q, %q) error: %v", h.VM, req.Argv, err)
	}
	if !res.Exited {
		t.Fatalf("Run(%q, %q) returned without Exited: %+v", h.VM, req.Argv, res)
	}
	return res
}

func wantExit0(t testing.TB, req hypervisor.ExecRequest, res hypervisor.ExecResult) {
	t.Helper()
	if res.ExitCode != 0 || res.Signal != 0 || res.TimedOut {
		t.Errorf("Run(%q): exit %d, signal %d, timed out %v, stderr %q; want exit 0",
			req.Argv, res.ExitCode, res.Signal, res.TimedOut, res.Stderr)
	}
}

func wantStdout(t testing.TB, req hypervisor.ExecRequest, res hypervisor.ExecResult, want string) {
	t.Helper()
	if string(res.Stdout) != want {
		t.Errorf("Run(%q).Stdout = %q; want %q", req.Argv, res.Stdout, want)
	}
}

func checkListVMs(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	vms, err := h.Driver.ListVMs(ctx)
	if err != nil {
		t.Fatalf("ListVMs() error: %v", err)
	}
	seen := map[string]bool{}
	var found *hypervisor.VM
	for i, vm := range vms {
		if seen[vm.Name] {
			t.Errorf("ListVMs() lists %q twice", vm.Name)
		}
		seen[vm.Name] = true
		if vm.Name == h.VM {
			found = &vms[i]
		}
	}
	if found == nil {
		t.Fatalf("ListVMs() = %+v; want it to contain %q", vms, h.VM)
	}
	if found.State != hypervisor.StateRunning {
		t.Errorf("ListVMs() state of %q = %q; want %q", h.VM, found.State, hypervisor.StateRunning)
	}
	again, err := h.Driver.ListVMs(ctx)
	if err != nil {
		t.Fatalf("ListVMs() second call error: %v", err)
	}
	names := func(vms []hypervisor.VM) []string {
		var n []string
		for _, vm := range vms {
			n = append(n, vm.Name)
		}
		return n
	}
	if !slices.Equal(names(vms), names(again)) {
		t.Errorf("ListVMs() order changed between calls: %q then %q; want a stable order", names(vms), names(again))
	}
}

func checkStatus(t testing.TB, h Harness) {
	st, err := h.Driver.Status(h.ctx(t), h.VM)
	if err != nil {
		t.Fatalf("Status(%q) error: %v", h.VM, err)
	}
	if st.Name != h.VM {
		t.Errorf("Status(%q).Name = %q; want %q", h.VM, st.Name, h.VM)
	}
	if st.State != hypervisor.StateRunning {
		t.Errorf("Status(%q).State = %q; want %q", h.VM, st.State, hypervisor.StateRunning)
	}
	if !st.AgentConnected {
		t.Errorf("Status(%q).AgentConnected = false; want true", h.VM)
	}
}

func checkAgentInfo(t testing.TB, h Harness) {
	info, err := h.Driver.AgentInfo(h.ctx(t), h.VM)
	if err != nil {
		t.Fatalf("AgentInfo(%q) error: %v", h.VM, err)
	}
	if info.Version == "" {
		t.Errorf("AgentInfo(%q).Version is empty; want the agent's version", h.VM)
	}
	if !info.Enabled("guest-exec") {
		t.Errorf("AgentInfo(%q).Enabled(%q) = false; want true (commands %+v)", h.VM, "guest-exec", info.Commands)
	}
}

func checkEcho(t testing.TB, h Harness) {
	req := hypervisor.ExecRequest{Argv: []string{"/bin/echo", "hello", "world"}}
	res := run(t, h, req)
	wantExit0(t, req, res)
	wantStdout(t, req, res, "hello world\n")
	if len(res.Stderr) != 0 {
		t.Errorf("Run(%q).Stderr = %q; want empty", req.Argv, res.Stderr)
	}
	if res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("Run(%q) truncated stdout %v, stderr %v; want neither", req.Argv, res.StdoutTruncated, res.StderrTruncated)
	}
}

func checkArgvVerbatim(t testing.TB, h Harness) {
	args := []string{"a b", "$HOME", ";", "*", `"q"`, "'s'", "`id`", "$(id)", "|", "&&", "", "back\\slash", "tab\there", "ünï"}
	// The shell's printf prints each argument ("$@" is not parsed again) on
	// its own line between markers, so empty arguments and spaces show.
	var want strings.Builder
	for _, a := range args {
		want.WriteString("[" + a + "]\n")
	}
	req := hypervisor.ExecRequest{Argv: append([]string{"/bin/sh", "-c", `printf '[%s]\n' "$@"`, "sh"}, args...)}
	res := run(t, h, req)
	wantExit0(t, req, res)
	wantStdout(t, req, res, want.String())

	echo := hypervisor.ExecRequest{Argv: []string{"/bin/echo", "a b", "$HOME", ";", "*"}}
	res = run(t, h, echo)
	wantExit0(t, echo, res)
	wantStdout(t, echo, res, "a b $HOME ; *\n")
}

func checkExitCode(t testing.TB, h Harness) {
	for _, code := range []int{7, 1, 255} {
		req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "exit " + strconv.Itoa(code)}}
		res := run(t, h, req)
		if res.ExitCode != code || res.Signal != 0 {
			t.Errorf("Run(%q) exit %d, signal %d; want exit %d, signal 0", req.Argv, res.ExitCode, res.Signal, code)
		}
	}
}

func checkStderr(t testing.TB, h Harness) {
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo out; echo err >&2; echo out2"}}
	res := run(t, h, req)
	wantExit0(t, req, res)
	wantStdout(t, req, res, "out\nout2\n")
	if string(res.Stderr) != "err\n" {
		t.Errorf("Run(%q).Stderr = %q; want %q", req.Argv, res.Stderr, "err\n")
	}
}

func checkStdin(t testing.TB, h Harness) {
	for _, in := range [][]byte{[]byte("data\x00bin\xff"), patterned(64 << 10)} {
		req := hypervisor.ExecRequest{Argv: []string{"cat"}, Stdin: in}
		res := run(t, h, req)
		wantExit0(t, req, res)
		if !bytes.Equal(res.Stdout, in) {
			t.Errorf("Run(cat) with %d bytes of stdin: stdout %d bytes, first difference at %d; want the same bytes back",
				len(in), len(res.Stdout), firstDiff(res.Stdout, in))
		}
	}
}

func checkEnv(t testing.TB, h Harness) {
	req := hypervisor.ExecRequest{
		Argv: []string{"/bin/sh", "-c", `echo "$FOO"; echo "$VMGATE_T2"`},
		Env:  []string{"FOO=bar baz", "VMGATE_T2=x=y;$z"},
	}
	res := run(t, h, req)
	wantExit0(t, req, res)
	wantStdout(t, req, res, "bar baz\nx=y;$z\n")
}

func checkCwd(t testing.TB, h Harness) {
	req := hypervisor.ExecRequest{Argv: []string{"pwd"}, Cwd: h.dir()}
	res, err := hypervisor.Run(h.ctx(t), h.Driver, h.VM, req)
	if errors.Is(err, hypervisor.ErrNotSupported) {
		t.Skipf("driver refuses Cwd, as the contract allows: %v", err)
	}
	if err != nil {
		t.Fatalf("Run(pwd) with Cwd %q error: %v", req.Cwd, err)
	}
	wantExit0(t, req, res)
	wantStdout(t, req, res, h.dir()+"\n")
}

func checkSignal(t testing.TB, h Harness) {
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "kill -KILL $$"}}
	res := run(t, h, req)
	if res.Signal != sigKill {
		t.Errorf("Run(%q) signal %d, exit code %d; want signal %d (a signal is reported in Signal, not as 128+n)",
			req.Argv, res.Signal, res.ExitCode, sigKill)
	}
	if res.TimedOut {
		t.Errorf("Run(%q).TimedOut = true; want false", req.Argv)
	}
}

func checkOutputCap(t testing.TB, h Harness) {
	const limit = 1000
	req := hypervisor.ExecRequest{
		Argv:           []string{"/bin/sh", "-c", "head -c 200000 /dev/zero; echo err >&2"},
		MaxOutputBytes: limit,
	}
	res := run(t, h, req)
	if len(res.Stdout) != limit || !res.StdoutTruncated {
		t.Errorf("Run(%q) with MaxOutputBytes %d: stdout %d bytes, truncated %v; want %d bytes, truncated",
			req.Argv, limit, len(res.Stdout), res.StdoutTruncated, limit)
	}
	if i := bytes.IndexFunc(res.Stdout, func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("Run(%q).Stdout has a non-zero byte at %d; want only the command's zeros", req.Argv, i)
	}
	if string(res.Stderr) != "err\n" || res.StderrTruncated {
		t.Errorf("Run(%q) stderr %q, truncated %v; want %q, not truncated", req.Argv, res.Stderr, res.StderrTruncated, "err\n")
	}
}

// procGone reports whether pid is absent (or a zombie) in the guest,
// asking through the driver. It polls briefly: a killed process may take a
// moment to be reaped.
func procGone(t testing.TB, h Harness, pid int64) bool {
	t.Helper()
	// Prints the process's state letter, or nothing when there is none.
	script := `s=$(cat /proc/$1/stat 2>/dev/null) || exit 0; s=${s##*) }; echo "${s%% *}"`
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", script, "sh", strconv.FormatInt(pid, 10)}}
	// 5 s scaled with the load, but well under the 30 s the checks'
	// commands would live if nothing killed them.
	deadline := time.Now().Add(min(testload.Scale(5*time.Second), 15*time.Second))
	var b hypervisor.Backoff
	for {
		res := run(t, h, req)
		state := strings.TrimSpace(string(res.Stdout))
		if state == "" || state == "Z" || state == "X" {
			return true
		}
		if time.Now().After(deadline) {
			t.Logf("pid %d still there, state %q", pid, state)
			return false
		}
		time.Sleep(b.Next())
	}
}

func checkTimeout(t testing.TB, h Harness) {
	req := hypervisor.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: time.Second}
	start := time.Now()
	res := run(t, h, req)
	wantTimedOut(t, h, req, res, time.Since(start))
}

// checkTimeoutStartPoll is checkTimeout through ExecStart and ExecStatus,
// which a driver with its own Runner implements separately.
func checkTimeoutStartPoll(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	req := hypervisor.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: time.Second}
	start := time.Now()
	hd, err := h.Driver.ExecStart(ctx, h.VM, req)
	if err != nil {
		t.Fatalf("ExecStart(%q) error: %v", req.Argv, err)
	}
	res, err := hypervisor.Wait(ctx, h.Driver, h.VM, hd)
	if err != nil {
		t.Fatalf("Wait(%+v) error: %v", hd, err)
	}
	if res.PID != hd.PID {
		t.Errorf("ExecStatus(%+v).PID = %d; want %d", hd, res.PID, hd.PID)
	}
	wantTimedOut(t, h, req, res, time.Since(start))
}

// killedWithin bounds a run whose timeout (1–2 s) kills a command that
// would otherwise last 30 s: 15 s, scaled with the machine's load but kept
// under 25 s, so that a driver that waits for the command still fails.
func killedWithin() time.Duration {
	return min(testload.Scale(15*time.Second), 25*time.Second)
}

func wantTimedOut(t testing.TB, h Harness, req hypervisor.ExecRequest, res hypervisor.ExecResult, took time.Duration) {
	t.Helper()
	if !res.TimedOut {
		t.Errorf("Run(%q) with Timeout 1s: TimedOut false (exit %d, signal %d); want true", req.Argv, res.ExitCode, res.Signal)
	}
	// A correctness bound (the timeout fired at all), not a speed claim.
	if took >= killedWithin() {
		t.Errorf("Run(%q) with Timeout 1s took %v; want well under the command's 30 s", req.Argv, took)
	}
	if res.PID <= 0 {
		t.Fatalf("Run(%q).PID = %d; want the guest pid", req.Argv, res.PID)
	}
	if !procGone(t, h, res.PID) {
		t.Errorf("Run(%q) timed out but guest pid %d is still running; want it killed", req.Argv, res.PID)
	}
}

func checkTimeoutKillsTree(t testing.TB, h Harness) {
	// The shell starts a background child, prints its pid and waits.
	// The child keeps the output pipes open: a driver that kills only the
	// shell sees the command end when the child does, 30 s later, and by
	// then the child is gone by itself. So the time is part of the check.
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 30 & echo $!; wait"}, Timeout: 2 * time.Second}
	start := time.Now()
	res := run(t, h, req)
	took := time.Since(start)
	if !res.TimedOut {
		t.Errorf("Run(%q) with Timeout 2s: TimedOut false; want true", req.Argv)
	}
	// A correctness bound (the tree was killed), not a speed claim.
	if took >= killedWithin() {
		t.Errorf("Run(%q) with Timeout 2s took %v; want well under the child's 30 s (the whole process tree killed at the timeout)", req.Argv, took)
	}
	child, err := strconv.ParseInt(strings.TrimSpace(string(res.Stdout)), 10, 64)
	if err != nil || child <= 0 {
		t.Fatalf("Run(%q).Stdout = %q; want the background child's pid (the partial output of a timed-out command)", req.Argv, res.Stdout)
	}
	if !procGone(t, h, child) {
		t.Errorf("Run(%q) timed out but its child pid %d is still running; want the whole process tree killed", req.Argv, child)
	}
}

func checkStartPoll(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 1; echo polled"}}
	start := time.Now()
	hd, err := h.Driver.ExecStart(ctx, h.VM, req)
	if err != nil {
		t.Fatalf("ExecStart(%q) error: %v", req.Argv, err)
	}
	if hd.PID <= 0 {
		t.Errorf("ExecStart(%q).PID = %d; want the guest pid", req.Argv, hd.PID)
	}
	first, err := h.Driver.ExecStatus(ctx, h.VM, hd)
	if err != nil {
		t.Fatalf("ExecStatus(%+v) error: %v", hd, err)
	}
	if took := time.Since(start); took < 900*time.Millisecond && first.Exited {
		t.Errorf("ExecStatus(%+v) %v after start of a 1 s command: Exited true; want false", hd, took)
	}
	var b hypervisor.Backoff
	res := first
	for !res.Exited {
		if b.Sleep(ctx, 0) != nil {
			t.Fatalf("ExecStatus(%+v) never reported Exited: %v", hd, ctx.Err())
		}
		if res, err = h.Driver.ExecStatus(ctx, h.VM, hd); err != nil {
			t.Fatalf("ExecStatus(%+v) error: %v", hd, err)
		}
	}
	wantExit0(t, req, res)
	wantStdout(t, req, res, "polled\n")
	if res.PID != hd.PID {
		t.Errorf("ExecStatus(%+v).PID = %d; want %d", hd, res.PID, hd.PID)
	}
}

// checkMissingBinary: the contract accepts either an error from ExecStart
// (qemu-ga fails guest-exec for a missing path) or a command that exits
// non-zero (a backend that runs argv through its own launcher); never a
// success and never a hang.
func checkMissingBinary(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	req := hypervisor.ExecRequest{Argv: []string{"/nonexistent-hypervisortest/no-such-binary"}}
	hd, err := h.Driver.ExecStart(ctx, h.VM, req)
	if err != nil {
		for _, wrong := range []error{hypervisor.ErrUnknownVM, hypervisor.ErrCommandDisabled} {
			if errors.Is(err, wrong) {
				t.Errorf("ExecStart(%q) error %v; want an error about the missing binary, not %v", req.Argv, err, wrong)
			}
		}
		return
	}
	res, err := hypervisor.Wait(ctx, h.Driver, h.VM, hd)
	if err != nil {
		t.Fatalf("Wait(%+v) error: %v", hd, err)
	}
	if res.ExitCode == 0 && res.Signal == 0 {
		t.Errorf("Run(%q) succeeded (exit 0); want an error or a non-zero exit", req.Argv)
	}
}

func checkEmptyArgv(t testing.TB, h Harness) {
	for _, argv := range [][]string{nil, {}, {""}} {
		_, err := h.Driver.ExecStart(h.ctx(t), h.VM, hypervisor.ExecRequest{Argv: argv})
		if !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("ExecStart(%q) error %v; want %v", argv, err, hypervisor.ErrInvalidArgument)
		}
	}
}

func checkBogusHandle(t testing.TB, h Harness) {
	hd := hypervisor.ExecHandle{PID: 1 << 30, Token: "hypervisortest-bogus-handle"}
	_, err := h.Driver.ExecStatus(h.ctx(t), h.VM, hd)
	if !errors.Is(err, hypervisor.ErrUnknownExec) && !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("ExecStatus(%+v) error %v; want %v (or %v for a malformed token)", hd, err, hypervisor.ErrUnknownExec, hypervisor.ErrInvalidArgument)
	}
}

func checkConcurrent(t testing.TB, h Harness) {
	const n = 8
	ctx := h.ctx(t)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			word := fmt.Sprintf("concurrent-%d", i)
			req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `sleep 0.2; echo "$1"`, "sh", word}}
			res, err := hypervisor.Run(ctx, h.Driver, h.VM, req)
			switch {
			case err != nil:
				t.Errorf("Run(%q) [%d of %d in flight] error: %v", req.Argv, i, n, err)
			case !res.Exited || res.ExitCode != 0 || res.Signal != 0:
				t.Errorf("Run(%q) [%d of %d in flight] = %+v; want exit 0", req.Argv, i, n, res)
			case string(res.Stdout) != word+"\n":
				t.Errorf("Run(%q) [%d of %d in flight].Stdout = %q; want %q", req.Argv, i, n, res.Stdout, word+"\n")
			}
		})
	}
	wg.Wait()
}

// scratch returns a fresh path in the guest's scratch directory and removes
// it when the check ends.
func scratch(t testing.TB, h Harness, suffix string) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("rand: %v", err)
	}
	path := h.dir() + "/hypervisortest-" + hex.EncodeToString(b[:]) + suffix
	t.Cleanup(func() {
		ctx, cancel := testload.WithTimeout(context.Background(), h.callTimeout())
		defer cancel()
		if _, err := hypervisor.Run(ctx, h.Driver, h.VM, hypervisor.ExecRequest{Argv: []string{"rm", "-f", "--", path}}); err != nil {
			t.Logf("removing %s in the guest: %v", path, err)
		}
	})
	return path
}

// patterned returns n bytes: every byte value once, then pseudo-random
// bytes from a fixed seed, so a repeated or misplaced chunk shows.
func patterned(n int) []byte {
	b := make([]byte, n)
	r := mrand.New(mrand.NewPCG(1, 2))
	for i := range b {
		if i < 256 {
			b[i] = byte(i)
		} else {
			b[i] = byte(r.Uint32())
		}
	}
	return b
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func checkFileRoundTrip(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	path := scratch(t, h, ".bin")
	data := patterned(200 << 10)
	if err := h.Driver.FileWrite(ctx, h.VM, path, data, 0); err != nil {
		t.Fatalf("FileWrite(%q, %d bytes) error: %v", path, len(data), err)
	}
	got, err := h.Driver.FileRead(ctx, h.VM, path, 1<<20)
	if err != nil {
		t.Fatalf("FileRead(%q) error: %v", path, err)
	}
	if !bytes.Equal(got.Data, data) || got.Truncated {
		t.Errorf("FileRead(%q) = %d bytes, truncated %v, first difference at %d; want the %d bytes written, not truncated",
			path, len(got.Data), got.Truncated, firstDiff(got.Data, data), len(data))
	}
	// Replacing a file leaves no tail of the old content.
	short := []byte("short\n")
	if err := h.Driver.FileWrite(ctx, h.VM, path, short, 0); err != nil {
		t.Fatalf("FileWrite(%q) replacing error: %v", path, err)
	}
	if got, err = h.Driver.FileRead(ctx, h.VM, path, 1<<20); err != nil {
		t.Fatalf("FileRead(%q) after replace error: %v", path, err)
	}
	if !bytes.Equal(got.Data, short) {
		t.Errorf("FileRead(%q) after replacing with %q = %d bytes starting %q; want %q", path, short, len(got.Data), got.Data[:min(16, len(got.Data))], short)
	}
}

func checkFileMode(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	for _, mode := range []uint32{0o640, 0o600, 0o755} {
		path := scratch(t, h, ".mode")
		if err := h.Driver.FileWrite(ctx, h.VM, path, []byte("mode\n"), mode); err != nil {
			t.Fatalf("FileWrite(%q, mode %o) error: %v", path, mode, err)
		}
		req := hypervisor.ExecRequest{Argv: []string{"stat", "-c", "%a", path}}
		res := run(t, h, req)
		wantExit0(t, req, res)
		if want := strconv.FormatUint(uint64(mode), 8) + "\n"; string(res.Stdout) != want {
			t.Errorf("FileWrite(%q, mode %o) then stat: mode %q; want %q", path, mode, res.Stdout, want)
		}
	}
}

func checkFileReadTruncated(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	path := scratch(t, h, ".trunc")
	data := patterned(5000)
	if err := h.Driver.FileWrite(ctx, h.VM, path, data, 0); err != nil {
		t.Fatalf("FileWrite(%q) error: %v", path, err)
	}
	for _, tc := range []struct {
		max       int64
		truncated bool
	}{{1000, true}, {1, true}, {4999, true}, {5000, false}, {5001, false}} {
		got, err := h.Driver.FileRead(ctx, h.VM, path, tc.max)
		if err != nil {
			t.Errorf("FileRead(%q, %d) error: %v", path, tc.max, err)
			continue
		}
		want := data[:min(tc.max, int64(len(data)))]
		if !bytes.Equal(got.Data, want) || got.Truncated != tc.truncated {
			t.Errorf("FileRead(%q, %d) = %d bytes (first difference at %d), truncated %v; want %d bytes, truncated %v",
				path, tc.max, len(got.Data), firstDiff(got.Data, want), got.Truncated, len(want), tc.truncated)
		}
	}
}

func checkFileReadMissing(t testing.TB, h Harness) {
	path := scratch(t, h, ".missing")
	got, err := h.Driver.FileRead(h.ctx(t), h.VM, path, 1000)
	if err == nil {
		t.Errorf("FileRead(%q) of a missing file = %d bytes, no error; want an error", path, len(got.Data))
	}
}

func checkUnknownVM(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	vm := h.unknownVM()
	vms, err := h.Driver.ListVMs(ctx)
	if err != nil {
		t.Fatalf("ListVMs() error: %v", err)
	}
	for _, v := range vms {
		if v.Name == vm {
			t.Fatalf("ListVMs() lists %q, the harness's unknown VM", vm)
		}
	}
	d := h.Driver
	calls := []struct {
		name string
		call func() error
	}{
		{"Status", func() error { _, err := d.Status(ctx, vm); return err }},
		{"AgentInfo", func() error { _, err := d.AgentInfo(ctx, vm); return err }},
		{"ExecStart", func() error {
			_, err := d.ExecStart(ctx, vm, hypervisor.ExecRequest{Argv: []string{"/bin/echo", "x"}})
			return err
		}},
		{"ExecStatus", func() error { _, err := d.ExecStatus(ctx, vm, hypervisor.ExecHandle{PID: 1, Token: "x"}); return err }},
		{"Run", func() error {
			_, err := hypervisor.Run(ctx, d, vm, hypervisor.ExecRequest{Argv: []string{"/bin/echo", "x"}})
			return err
		}},
		{"FileRead", func() error { _, err := d.FileRead(ctx, vm, h.dir()+"/x", 10); return err }},
		{"FileWrite", func() error { return d.FileWrite(ctx, vm, h.dir()+"/hypervisortest-unknown-vm", []byte("x"), 0) }},
		{"Power", func() error { return d.Power(ctx, vm, hypervisor.PowerStart) }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("%s(%q) error %v; want %v", c.name, vm, err, hypervisor.ErrUnknownVM)
		}
	}
}

func checkInvalidPowerAction(t testing.TB, h Harness) {
	for _, a := range []hypervisor.PowerAction{"", "explode", "Reset", "reset "} {
		if err := h.Driver.Power(h.ctx(t), h.VM, a); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("Power(%q, %q) error %v; want %v", h.VM, a, err, hypervisor.ErrInvalidArgument)
		}
	}
}

func checkExpiredDeadline(t testing.TB, h Harness) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	d := h.Driver
	calls := []struct {
		name string
		call func() error
	}{
		{"Status", func() error { _, err := d.Status(ctx, h.VM); return err }},
		{"AgentInfo", func() error { _, err := d.AgentInfo(ctx, h.VM); return err }},
		{"Run", func() error {
			_, err := hypervisor.Run(ctx, d, h.VM, hypervisor.ExecRequest{Argv: []string{"/bin/echo", "x"}})
			return err
		}},
		{"FileRead", func() error { _, err := d.FileRead(ctx, h.VM, "/etc/hostname", 10); return err }},
	}
	for _, c := range calls {
		start := time.Now()
		err := c.call()
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, hypervisor.ErrTimeout) {
			t.Errorf("%s(%q) with an expired context: error %v; want one wrapping %v or %v",
				c.name, h.VM, err, context.DeadlineExceeded, hypervisor.ErrTimeout)
		}
		// A correctness bound (the deadline was looked at), not a speed claim.
		if took > testload.Scale(5*time.Second) {
			t.Errorf("%s(%q) with an expired context took %v; want a prompt return", c.name, h.VM, took)
		}
	}
}

func skipWithoutNoExecVM(t testing.TB, h Harness) {
	t.Helper()
	if h.NoExecVM == "" {
		t.Skip("Harness.NoExecVM is empty: no VM with guest-exec disabled (CI must provide one)")
	}
}

func checkNoExecRun(t testing.TB, h Harness) {
	skipWithoutNoExecVM(t, h)
	req := hypervisor.ExecRequest{Argv: []string{"/bin/echo", "x"}}
	res, err := hypervisor.Run(h.ctx(t), h.Driver, h.NoExecVM, req)
	if !errors.Is(err, hypervisor.ErrCommandDisabled) {
		t.Fatalf("Run(%q, %q) = %+v, error %v; want %v", h.NoExecVM, req.Argv, res, err, hypervisor.ErrCommandDisabled)
	}
	const want = "guest-exec is disabled in this guest"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("Run(%q, %q) error %q; want it to say %q", h.NoExecVM, req.Argv, err, want)
	}
}

func checkNoExecAgentInfo(t testing.TB, h Harness) {
	skipWithoutNoExecVM(t, h)
	info, err := h.Driver.AgentInfo(h.ctx(t), h.NoExecVM)
	if err != nil {
		t.Fatalf("AgentInfo(%q) error: %v", h.NoExecVM, err)
	}
	if info.Version == "" {
		t.Errorf("AgentInfo(%q).Version is empty; want the agent's version", h.NoExecVM)
	}
	if info.Enabled("guest-exec") {
		t.Errorf("AgentInfo(%q).Enabled(%q) = true; want false", h.NoExecVM, "guest-exec")
	}
}
