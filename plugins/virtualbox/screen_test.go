package virtualbox

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/internal/vboxemu"
)

// labMachine is a running machine backed by the lab VM v, its first UART
// in file mode on the lab VM's console log (what VirtualBox writes the
// guest's serial output to).
func labMachine(name, uuid string, v *lab.VM) *vboxemu.Machine {
	m := machine(name, uuid, v.QGASocket, v.QMPSocket)
	m.UART1 = &vboxemu.UART{Mode: "file", Path: v.SerialLog}
	return m
}

func TestScancodes(t *testing.T) {
	tests := []struct {
		combo string
		want  string
	}{
		{"a", "1e 9e"},
		{"shift-a", "2a 1e 9e aa"},
		{"ctrl-alt-delete", "1d 38 e0 53 e0 d3 b8 9d"},
		{"alt-f2", "38 3c bc b8"},
		{"ctrl_r-up", "e0 1d e0 48 e0 c8 e0 9d"},
	}
	for _, tt := range tests {
		c, err := hypervisor.ParseKeyCombo(tt.combo)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(scancodes(c), " "); got != tt.want {
			t.Errorf("scancodes(%s) = %s; want %s", tt.combo, got, tt.want)
		}
	}
}

func TestUARTFile(t *testing.T) {
	for _, tt := range []struct {
		kv   map[string]string
		path string
	}{
		{map[string]string{"uart1": "0x03f8,4", "uartmode1": "file,/v/con.log"}, "/v/con.log"},
		{map[string]string{"uart1": "off"}, ""},
		{map[string]string{}, ""},
		{map[string]string{"uart1": "0x03f8,4", "uartmode1": "server,/tmp/pipe"}, ""},
		{map[string]string{"uart1": "0x03f8,4", "uartmode1": "disconnected"}, ""},
	} {
		got, err := uartFile(tt.kv, "vm1")
		if got != tt.path || (tt.path == "") != errors.Is(err, hypervisor.ErrNotSupported) {
			t.Errorf("uartFile(%v) = %q, %v; want %q (or ErrNotSupported)", tt.kv, got, err, tt.path)
		}
		if err != nil && !strings.Contains(err.Error(), "--uart-mode1 file") {
			t.Errorf("uartFile(%v) error %q does not say how to enable the file mode", tt.kv, err)
		}
	}
}

// resumeByConsoleSocket continues the lab VM's stopped agent through its
// serial console socket (VirtualBox's UART in file mode takes no input, so
// the test types on the lab VM's console itself).
func resumeByConsoleSocket(v *lab.VM, h hypervisortest.Harness) func(t testing.TB) {
	return func(t testing.TB) {
		c, err := net.Dial("unix", v.ConsoleSocket)
		if err != nil {
			t.Fatalf("console socket: %v", err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(testload.Scale(30 * time.Second)))
		if _, err := c.Write([]byte("kill -CONT $(pidof qemu-ga)\n")); err != nil {
			t.Fatal(err)
		}
		hypervisortest.WaitAgent(t, h)
	}
}

// TestConsoleBootAndNoAgent, on a lab VM of its own behind the emulator:
// the UART's file shows the kernel's boot messages after a reset; with
// the guest agent stopped the screen, the keys and the console still
// work; console input is not supported and says so.
func TestConsoleBootAndNoAgent(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "vscreen"})
	e := newEmulator(t, "7.1", []*vboxemu.Machine{labMachine("vs", uuidT1, v)})
	d := e.driver(t)
	h := hypervisortest.Harness{Driver: d, VM: "vs", Capabilities: vboxCapabilities}
	t.Run("Boot", func(t *testing.T) { hypervisortest.RunConsoleBoot(t, h) })
	h.StopAgent = hypervisortest.StopAgentByExec(h)
	h.ResumeAgent = resumeByConsoleSocket(v, h)
	t.Run("WithoutAgent", func(t *testing.T) { hypervisortest.RunWithoutAgent(t, h) })
	if _, ok := hypervisor.AsConsoleWriter(d); ok {
		t.Errorf("the VirtualBox driver claims console input; a file-mode UART takes none")
	}
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	noUART := newEmulator(t, "7.1", []*vboxemu.Machine{machine("vs", uuidT1, v.QGASocket, v.QMPSocket)}).driver(t)
	if _, err := noUART.ConsoleRead(ctx, "vs", hypervisor.ConsoleReadRequest{}); !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("ConsoleRead of a machine whose UART is off = %v; want ErrNotSupported", err)
	}
}
