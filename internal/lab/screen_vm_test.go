package lab_test

import (
	"bytes"
	"context"
	"image/png"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/qmp"
	"github.com/vmgate/vmgate/internal/testload"
)

// waitLog waits until the console log holds want (or the deadline).
func waitLog(t *testing.T, path, want string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(testload.Scale(d))
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), want) {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never held %q; its end: %q", path, want, b[max(0, len(b)-600):])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestConsoleBootMessagesAndShell: the kernel's banner is on the serial
// console (logged to serial.log), and a command typed into the console
// socket runs in the shell there.
func TestConsoleBootMessagesAndShell(t *testing.T) {
	vm := labtest.VM(t, "t1")
	if vm.ConsoleSocket != filepath.Join(vm.Dir, lab.ConsoleSocketName) || vm.VNCSocket != filepath.Join(vm.Dir, lab.VNCSocketName) {
		t.Fatalf("VM sockets: console %q, vnc %q; want them in %s", vm.ConsoleSocket, vm.VNCSocket, vm.Dir)
	}
	waitLog(t, vm.SerialLog, "Linux version", 10*time.Second)
	for _, sock := range []string{vm.ConsoleSocket, vm.VNCSocket} {
		fi, err := os.Stat(sock)
		if err != nil || fi.Mode().Perm() != lab.FileMode {
			t.Errorf("stat %s = %v, %v; want mode %v", sock, fi.Mode(), err, lab.FileMode)
		}
	}
	c, err := net.Dial("unix", vm.ConsoleSocket)
	if err != nil {
		t.Fatalf("dial the console socket: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("echo $((6*7))-console\n")); err != nil {
		t.Fatal(err)
	}
	waitLog(t, vm.SerialLog, "42-console", 30*time.Second)
}

// TestDisplay: the VM has a display QEMU can dump as a PNG (720×400, the
// VGA text mode of the shell on tty1).
func TestDisplay(t *testing.T) {
	vm := labtest.VM(t, "t1")
	out := filepath.Join(t.TempDir(), "screen.png")
	ctx, cancel := testload.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := qmp.Call(ctx, vm.QMPSocket, "screendump", map[string]any{"filename": out, "format": "png"}); err != nil {
		t.Fatalf("screendump: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil || cfg.Width < 640 || cfg.Height < 400 {
		t.Errorf("screendump = %d×%d, %v; want a PNG of a text console (720×400)", cfg.Width, cfg.Height, err)
	}
}
