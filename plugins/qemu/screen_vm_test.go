package qemu

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// TestConsoleBootAndNoAgent, on a lab VM of its own: the console shows
// the kernel's boot messages after a reset; then, with the guest agent
// stopped, the screen, the keys and the console still work.
func TestConsoleBootAndNoAgent(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "noagent"})
	h := hypervisortest.Harness{Driver: labDriver(t, v), VM: "noagent", Capabilities: labCapabilities}
	t.Run("Boot", func(t *testing.T) { hypervisortest.RunConsoleBoot(t, h) })
	h.StopAgent = hypervisortest.StopAgentByExec(h)
	h.ResumeAgent = hypervisortest.ResumeAgentByConsole(h)
	t.Run("WithoutAgent", func(t *testing.T) { hypervisortest.RunWithoutAgent(t, h) })
}

// bareQEMU starts a QEMU with no display, no serial port and no guest
// (it sits in the firmware), with only a QMP socket, and returns the socket.
func bareQEMU(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath(lab.QEMUBinary)
	if err != nil {
		if os.Getenv(labtest.RequireEnv) != "" {
			t.Fatalf("%s not found", lab.QEMUBinary)
		}
		t.Skipf("%s not found", lab.QEMUBinary)
	}
	dir := t.TempDir()
	qmp := filepath.Join(dir, "qmp.sock")
	cmd := exec.Command(bin, "-nodefaults", "-no-user-config", "-display", "none", "-accel", "tcg", "-m", "64",
		"-S", "-qmp", "unix:"+qmp+",server=on,wait=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(qmp); err == nil {
			return qmp
		}
		if i > 200 {
			t.Fatalf("QEMU made no QMP socket at %s", qmp)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestScreenOfAVMWithoutDisplayOrConsole: the screenshot and console
// calls say what the VM lacks and how to give it; keys still go (the
// machine's PS/2 keyboard is there without a display).
func TestScreenOfAVMWithoutDisplayOrConsole(t *testing.T) {
	qmp := bareQEMU(t)
	d, err := New(Config{VMs: []VMConfig{{Name: "bare", QMPSocket: qmp, QGASocket: qmp + ".none"}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = d.Screenshot(ctx, "bare", hypervisor.ScreenshotRequest{})
	if !errors.Is(err, hypervisor.ErrNotSupported) || !strings.Contains(err.Error(), "no display device") || !strings.Contains(err.Error(), "-device VGA") {
		t.Errorf("Screenshot(a VM without display) = %v; want ErrNotSupported naming the missing display and -device VGA", err)
	}
	_, err = d.ConsoleRead(ctx, "bare", hypervisor.ConsoleReadRequest{})
	if !errors.Is(err, hypervisor.ErrNotSupported) || !strings.Contains(err.Error(), "console_log") {
		t.Errorf("ConsoleRead(a VM without console) = %v; want ErrNotSupported naming console_log", err)
	}
	err = d.ConsoleWrite(ctx, "bare", []byte("x\n"))
	if !errors.Is(err, hypervisor.ErrNotSupported) || !strings.Contains(err.Error(), "console") {
		t.Errorf("ConsoleWrite(a VM without console) = %v; want ErrNotSupported naming console", err)
	}
	if err := d.SendKeys(ctx, "bare", hypervisor.KeysRequest{Combos: []hypervisor.KeyCombo{{"shift"}}}); err != nil {
		t.Errorf("SendKeys(shift) on a VM without display = %v; want nil (QEMU's keyboard is there)", err)
	}
}
