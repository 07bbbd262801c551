package lab_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

func TestMain(m *testing.M) {
	os.Exit(labtest.Main(m,
		lab.Spec{Name: "t1"},
		lab.Spec{Name: "noexec", Cmdline: map[string]string{"QGA_BLOCK": "guest-exec"}},
		lab.Spec{Name: "nocg", Cmdline: map[string]string{"CGROUP2": "0"}},
	))
}

type execStatus struct {
	Exited   bool   `json:"exited"`
	ExitCode int    `json:"exitcode"`
	OutData  string `json:"out-data"`
}

// guestRun runs argv through guest-exec and polls guest-exec-status.
func guestRun(t *testing.T, vm *lab.VM, argv ...string) (execStatus, error) {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var started struct {
		PID int `json:"pid"`
	}
	err := vm.AgentCall(ctx, "guest-exec", map[string]any{"path": argv[0], "arg": argv[1:], "capture-output": true}, &started)
	if err != nil {
		return execStatus{}, err
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		var st execStatus
		if err := vm.AgentCall(ctx, "guest-exec-status", map[string]any{"pid": started.PID}, &st); err != nil {
			return st, err
		}
		if st.Exited {
			return st, nil
		}
		time.Sleep(delay)
	}
}

func TestGuestExec(t *testing.T) {
	vm := labtest.VM(t, "t1")
	if err := vm.Ping(context.Background()); err != nil {
		t.Fatalf("Ping() = %v; want nil", err)
	}
	tests := []struct {
		argv     []string
		wantCode int
		wantOut  string
	}{
		{[]string{"/bin/true"}, 0, ""},
		{[]string{"/bin/false"}, 1, ""},
		{[]string{"/bin/sh", "-c", "echo $((6*7)); exit 3"}, 3, "42\n"},
		{[]string{"/bin/hostname"}, 0, "t1\n"},
		{[]string{"/bin/sh", "-c", "head -c 5 /dev/zero | wc -c"}, 0, "5\n"},
	}
	for _, tt := range tests {
		st, err := guestRun(t, vm, tt.argv...)
		if err != nil {
			t.Fatalf("guest-exec %v: %v", tt.argv, err)
		}
		out, _ := base64.StdEncoding.DecodeString(st.OutData)
		if st.ExitCode != tt.wantCode || strings.TrimLeft(string(out), " ") != tt.wantOut {
			t.Errorf("guest-exec %v = code %d, out %q; want code %d, out %q", tt.argv, st.ExitCode, out, tt.wantCode, tt.wantOut)
		}
	}
}

func TestQGABlock(t *testing.T) {
	tests := []struct {
		vm          string
		wantEnabled bool
	}{
		{"t1", true},
		{"noexec", false},
	}
	for _, tt := range tests {
		vm := labtest.VM(t, tt.vm)
		info, err := vm.AgentInfo(context.Background())
		if err != nil {
			t.Fatalf("%s: AgentInfo() = %v", tt.vm, err)
		}
		if info.Version == "" {
			t.Errorf("%s: AgentInfo().Version is empty", tt.vm)
		}
		if got := info.Enabled("guest-exec"); got != tt.wantEnabled {
			t.Errorf("%s: Enabled(guest-exec) = %v; want %v", tt.vm, got, tt.wantEnabled)
		}
		if !info.Enabled("guest-ping") {
			t.Errorf("%s: Enabled(guest-ping) = false; want true", tt.vm)
		}
	}
	_, err := guestRun(t, labtest.VM(t, "noexec"), "/bin/true")
	var ae *lab.AgentError
	if !errors.As(err, &ae) || !strings.Contains(ae.Desc, "disabled") {
		t.Errorf("guest-exec on noexec = %v; want an AgentError saying the command is disabled", err)
	}
}

func TestCgroup2Mount(t *testing.T) {
	tests := []struct {
		vm   string
		want bool
	}{
		{"t1", true},
		{"nocg", false},
	}
	for _, tt := range tests {
		st, err := guestRun(t, labtest.VM(t, tt.vm), "/bin/cat", "/proc/mounts")
		if err != nil {
			t.Fatalf("%s: cat /proc/mounts: %v", tt.vm, err)
		}
		out, _ := base64.StdEncoding.DecodeString(st.OutData)
		if !strings.Contains(string(out), " /tmp tmpfs ") {
			t.Errorf("%s: /proc/mounts has no tmpfs on /tmp: %q", tt.vm, out)
		}
		if got := strings.Contains(string(out), "cgroup2 /sys/fs/cgroup cgroup2"); got != tt.want {
			t.Errorf("%s: cgroup2 mounted = %v; want %v (mounts %q)", tt.vm, got, tt.want, out)
		}
	}
}

func TestStartRefusesRunningName(t *testing.T) {
	vm := labtest.VM(t, "t1")
	stateDir := filepath.Dir(filepath.Dir(vm.Dir))
	_, err := lab.Start(context.Background(), lab.Spec{Name: "t1", StateDir: stateDir})
	if !errors.Is(err, lab.ErrRunning) {
		t.Fatalf("Start(t1 again) = %v; want ErrRunning", err)
	}
	got, err := lab.Get(stateDir, "t1")
	if err != nil || got.State != lab.StateRunning || got.PID != vm.PID {
		t.Fatalf("Get(t1) = %+v, %v; want running pid %d", got, err, vm.PID)
	}
}

// TestListStalePID writes vm.json files whose pid is a live process that
// is not that QEMU, a dead pid, and the real VM's, and checks List.
func TestListStalePID(t *testing.T) {
	real := labtest.VM(t, "t1")
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })

	stateDir := t.TempDir()
	write := func(name string, pid int, argv []string) {
		v := lab.VM{Name: name, PID: pid, Argv: argv, Dir: filepath.Join(stateDir, "lab", name)}
		v.QMPSocket = filepath.Join(v.Dir, lab.QMPSocketName)
		if err := os.MkdirAll(v.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		b := fmt.Sprintf(`{"name":%q,"pid":%d,"argv":[%s],"dir":%q,"qmp_socket":%q}`, name, pid, quoteAll(argv), v.Dir, v.QMPSocket)
		if err := os.WriteFile(filepath.Join(v.Dir, lab.StateFileName), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("reused", sleeper.Process.Pid, real.Argv) // pid alive, not qemu
	write("dead", 999999999, real.Argv)             // no such pid
	write("live", real.PID, real.Argv)              // the real qemu
	write("argv", real.PID, append(real.Argv[:len(real.Argv):len(real.Argv)], "-S"))

	vms, err := lab.List(stateDir)
	if err != nil {
		t.Fatalf("List() = %v", err)
	}
	want := map[string]lab.State{"argv": lab.StateStopped, "dead": lab.StateStopped, "live": lab.StateRunning, "reused": lab.StateStopped}
	if len(vms) != len(want) {
		t.Fatalf("List() = %d VMs; want %d", len(vms), len(want))
	}
	for _, v := range vms {
		if v.State != want[v.Name] {
			t.Errorf("List(): %s state = %s; want %s", v.Name, v.State, want[v.Name])
		}
	}
	// Stopping the stale entry must not touch the process that reused its pid.
	stale, err := lab.Get(stateDir, "reused")
	if err != nil {
		t.Fatal(err)
	}
	if err := stale.Stop(context.Background()); err != nil {
		t.Fatalf("Stop(reused) = %v", err)
	}
	if err := syscall.Kill(sleeper.Process.Pid, 0); err != nil {
		t.Errorf("Stop(stale entry) hurt pid %d: %v", sleeper.Process.Pid, err)
	}
	if _, err := lab.Get(stateDir, "reused"); !errors.Is(err, lab.ErrNotFound) {
		t.Errorf("Get(reused) after Stop = %v; want ErrNotFound", err)
	}

	if err := os.WriteFile(filepath.Join(stateDir, "lab", "dead", lab.StateFileName), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := lab.List(stateDir); err == nil {
		t.Errorf("List() with a corrupt vm.json = nil error; want an error")
	}
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ",")
}

func TestStopLeavesNoProcess(t *testing.T) {
	vm := labtest.Start(t, lab.Spec{Name: "stopme"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := vm.Stop(ctx); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", vm.PID)); !os.IsNotExist(err) {
		t.Errorf("after Stop, /proc/%d: %v; want not exist", vm.PID, err)
	}
	for _, f := range []string{vm.QMPSocket, vm.QGASocket, filepath.Join(vm.Dir, lab.PIDFileName), filepath.Join(vm.Dir, lab.DiskName)} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("after Stop, %s: %v; want removed", f, err)
		}
	}
	if err := vm.Stop(ctx); err != nil {
		t.Errorf("second Stop() = %v; want nil", err)
	}
}

// sendNoReply writes a guest-agent command that has no reply
// (guest-shutdown) followed by a guest-ping on the same connection, and
// hangs up once the ping is answered (or the agent went away first): the
// agent handles commands in order, so the first one has then been taken.
// (The socket serves one client at a time, so the connection cannot stay
// open while the test waits.)
func sendNoReply(t *testing.T, vm *lab.VM, msg string) {
	t.Helper()
	c, err := net.Dial("unix", vm.QGASocket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(msg + `{"execute":"guest-ping"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(testload.Scale(time.Minute)))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("guest-ping after %s: %q, %v", msg, line, err)
	}
}

// bootID is the guest kernel's boot id, new on every boot.
func bootID(t *testing.T, vm *lab.VM) (string, error) {
	t.Helper()
	st, err := guestRun(t, vm, "/bin/cat", "/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	out, err := base64.StdEncoding.DecodeString(st.OutData)
	return strings.TrimSpace(string(out)), err
}

func TestGuestShutdown(t *testing.T) {
	vm := labtest.Start(t, lab.Spec{Name: "power"})
	ctx, cancel := testload.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	before, err := bootID(t, vm)
	if err != nil || before == "" {
		t.Fatalf("boot id before reboot = %q, %v", before, err)
	}

	// Reboot: the same QEMU process boots the guest again, with a new boot id.
	sendNoReply(t, vm, `{"execute":"guest-shutdown","arguments":{"mode":"reboot"}}`)
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		select {
		case <-vm.Done():
			t.Fatalf("qemu exited on a guest reboot; want the guest to boot again")
		case <-ctx.Done():
			t.Fatalf("the guest did not come back with a new boot id (was %s)", before)
		case <-time.After(delay):
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second) // an agent going down may never answer
		err := vm.Ping(pctx)
		cancel()
		if err != nil {
			continue // rebooting: the agent is not back yet
		}
		if id, err := bootID(t, vm); err == nil && id != before {
			break
		}
	}

	// Power off: QEMU exits.
	sendNoReply(t, vm, `{"execute":"guest-shutdown"}`)
	select {
	case <-vm.Done():
	case <-ctx.Done():
		t.Fatalf("qemu still running after guest-shutdown powerdown")
	}
}
