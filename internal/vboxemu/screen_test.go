package vboxemu

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// TestASCIITableIsUSButBacktick: keyboardputstring's table types what the
// US layout of the key model does, but '`', which upstream's table puts on
// the apostrophe's key.
func TestASCIITableIsUSButBacktick(t *testing.T) {
	for c := byte(0); c < 0x80; c++ {
		code, shift := asciiScancode(c)
		presses, err := hypervisor.KeysRequest{Text: string(rune(c))}.Presses()
		switch {
		case c == '`':
			if code != 0x28 || shift {
				t.Errorf("asciiScancode('`') = %#x, shift %v; want upstream's 0x28 without shift", code, shift)
			}
		case err != nil:
			if code != 0 {
				t.Errorf("asciiScancode(%#x) = %#x; want none (not typed)", c, code)
			}
		default:
			p := presses[0]
			if code != byte(p[len(p)-1].XT()) || shift != (len(p) == 2) {
				t.Errorf("asciiScancode(%q) = %#x, shift %v; the US layout says %v", c, code, shift, p)
			}
		}
	}
}

func TestStringScancodes(t *testing.T) {
	tests := []struct {
		args []string
		want []byte
	}{
		// 'H' needs shift: pressed before it, released before 'i'.
		{[]string{"Hi"}, []byte{0x2a, 0x23, 0xa3, 0xaa, 0x17, 0x97}},
		// Two arguments: a space between them; shift held across "AB" and
		// released at the end.
		{[]string{"a", "AB"}, []byte{0x1e, 0x9e, 0x39, 0xb9, 0x2a, 0x1e, 0x9e, 0x30, 0xb0, 0xaa}},
		// Characters the table lacks are skipped without a word.
		{[]string{"a\x1bé\n"}, []byte{0x1e, 0x9e, 0x1c, 0x9c}},
	}
	for _, tt := range tests {
		if got := stringScancodes(tt.args); !bytes.Equal(got, tt.want) {
			t.Errorf("stringScancodes(%q) = % x; want % x", tt.args, got, tt.want)
		}
	}
}

// TestScreenKeyboardUART: on a machine backed by a lab VM, screenshotpng
// writes the VM's display as a PNG, keyboardputscancode checks its
// arguments as VBoxManage does, and showvminfo names the UART's file.
func TestScreenKeyboardUART(t *testing.T) {
	vm := labtest.VM(t, "emu")
	m := &Machine{Name: "s", UUID: uuid1, State: "running", StateChange: time.Now(), QGASocket: vm.QGASocket, QMPSocket: vm.QMPSocket,
		UART1: &UART{Mode: "file", Path: vm.SerialLog}}
	h := newTestHost(t, &World{Version: "7.1", VMs: []*Machine{m}})
	file := filepath.Join(t.TempDir(), "shot.png")
	if code, _, errs := h.run("controlvm", "s", "screenshotpng", file); code != 0 {
		t.Fatalf("controlvm screenshotpng: exit %d, %q", code, errs)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := png.DecodeConfig(bytes.NewReader(b)); err != nil || cfg.Width < 640 {
		t.Errorf("screenshotpng wrote %d bytes: %v, %+v; want the lab VM's display", len(b), err, cfg)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("screenshotpng file mode %v (%v); want 0600", fi.Mode(), err)
	}
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"screenshotpng"}, 2, "Incorrect number of parameters."},
		{[]string{"screenshotpng", file, "x"}, 2, "Error parsing display number 'x'."},
		{[]string{"keyboardputscancode"}, 2, "Expected IBM PC AT set 2 keyboard scancode(s)."},
		{[]string{"keyboardputscancode", "1e", "zz"}, 1, "'zz' is not a hex byte!"},
		{[]string{"keyboardputscancode", "1e9e"}, 1, "'1e9e' is not a hex byte!"},
		{[]string{"keyboardputstring"}, 2, "Expected ASCII string(s)."},
		{[]string{"keyboardputscancode", "2a", "aa"}, 0, ""},
		{[]string{"keyboardputstring", "ok"}, 0, ""},
	} {
		code, _, errs := h.run(append([]string{"controlvm", "s"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errs, tc.err) {
			t.Errorf("controlvm s %q: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.err)
		}
	}
	_, out, _ := h.run("showvminfo", "s", "--machinereadable")
	for _, want := range []string{`uart1="0x03f8,4"`, `uartmode1="file,` + vm.SerialLog + `"`, `uarttype1="16550A"`, `uart2="off"`} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("showvminfo has no %s line:\n%s", want, out)
		}
	}
}
