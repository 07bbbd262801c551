package proxmox

import (
	"bytes"
	"context"
	"crypto/des"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pveemu"
	"github.com/vmgate/vmgate/internal/testload"
)

// TestVNCAuthResponse: the key is the password's bytes bit-reversed (so
// that DES, which ignores each byte's lowest bit, sees VNC's key).
func TestVNCAuthResponse(t *testing.T) {
	challenge := [16]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	got := vncAuthResponse(challenge, "p\x01")
	key := []byte{0x0e, 0x80, 0, 0, 0, 0, 0, 0} // 'p' = 0x70 reversed, 0x01 reversed
	c, _ := des.NewCipher(key)
	want := make([]byte, 16)
	c.Encrypt(want[:8], challenge[:8])
	c.Encrypt(want[8:], challenge[8:])
	if !bytes.Equal(got, want) {
		t.Errorf("vncAuthResponse = % x; want % x", got, want)
	}
	if a, b := vncAuthResponse(challenge, "12345678-more"), vncAuthResponse(challenge, "12345678"); !bytes.Equal(a, b) {
		t.Errorf("vncAuthResponse with a password past 8 bytes differs from its first 8; VNC uses only those")
	}
}

// TestConsoleBootAndNoAgent, on a lab VM of its own behind the emulator:
// the console opened before a reset shows the kernel's boot messages;
// with the guest agent stopped the screen (VNC through vncwebsocket), the
// keys (sendkey) and the console (termproxy) still work; a VM without a
// serial socket says what to set.
func TestConsoleBootAndNoAgent(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "pscreen"})
	e := startEmu(t, pveemu.PVE92(), nil, pveemu.VMSpec{VMID: 130, Node: "pve", Name: "pscreen", Machine: pveemu.NewLabMachine(v)},
		pveemu.VMSpec{VMID: 131, Node: "pve-2", Name: "off"})
	d := newDriver(t, e.cfg)
	h := hypervisortest.Harness{Driver: d, VM: "130", Capabilities: pveCapabilities}
	t.Run("Boot", func(t *testing.T) { hypervisortest.RunConsoleBoot(t, h) })
	h.StopAgent = hypervisortest.StopAgentByExec(h)
	h.ResumeAgent = hypervisortest.ResumeAgentByConsole(h)
	t.Run("WithoutAgent", func(t *testing.T) { hypervisortest.RunWithoutAgent(t, h) })
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := d.ConsoleRead(ctx, "131", hypervisor.ConsoleReadRequest{})
	if !errors.Is(err, hypervisor.ErrNotSupported) || !strings.Contains(err.Error(), "--serial0 socket") {
		t.Errorf("ConsoleRead(a VM without a serial socket) = %v; want ErrNotSupported naming qm set --serial0 socket", err)
	}
}
