package vboxemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/qmp"
)

// The display, the keyboard and the serial port of a machine, from
// VBoxManageControlVM.cpp handleControlVM (screenshotpng,
// keyboardputscancode, keyboardputstring) and VBoxManageInfo.cpp
// showVMInfo (the UART lines), in 6.1.38, 7.0.18 and 7.1.6 alike. The lab
// VM behind the machine stands in for its devices:
//
//   - IDisplay::TakeScreenShotToArray(PNG) is QMP screendump with format
//     png of the lab VM's VGA display;
//   - IKeyboard::PutScancode is one QMP input-send-event of the scan code
//     (PC XT set 1, 0xe0 prefixing an extended key), VBoxManage's 10 ms
//     pause after each (keyboardPutScancodes: "Typing too fast causes
//     lost characters") kept: QEMU's PS/2 keyboard queue is as short;
//   - a UART in file mode writes what the guest sends to a host file: the
//     machine's UARTPath is the lab VM's console log (its serial chardev's
//     logfile), which QEMU writes as the guest sends.

// UART is a machine's first serial port (ISerialPort of slot 0).
type UART struct {
	// Mode is the host mode as modifyvm --uart-mode1 names it:
	// "disconnected", "file", "server", "client", "tcpserver", "tcpclient".
	Mode string `json:"mode"`
	// Path is the file, pipe or address of the mode.
	Path string `json:"path,omitempty"`
}

// serialPortCount is ISystemProperties/IPlatformProperties SerialPortCount.
const serialPortCount = 4

// showUARTs is showVMInfo's machine-readable UART section: uart1 from the
// machine's UART (I/O base 0x3f8, IRQ 4, a 16550A, as modifyvm --uart1
// 0x3f8 4 and the default UART type give), the others off.
func (e *emu) showUARTs(m *Machine) {
	for n := 1; n <= serialPortCount; n++ {
		if n != 1 || m.UART1 == nil {
			e.printf("uart%d=\"off\"\n", n)
			continue
		}
		e.printf("uart%d=\"0x%04x,%d\"\n", n, 0x3f8, 4) // RTPrintf's %#06x: the width counts the 0x
		switch u := m.UART1; u.Mode {
		case "file":
			e.printf("uartmode%d=\"file,%s\"\n", n, u.Path)
		case "server", "client":
			e.printf("uartmode%d=\"%s,%s\"\n", n, u.Mode, u.Path)
		case "tcpserver", "tcpclient":
			e.printf("uartmode%d=\"%s,%s\"\n", n, u.Mode, u.Path)
		default:
			e.printf("uartmode%d=\"disconnected\"\n", n)
		}
		e.printf("uarttype%d=\"16550A\"\n", n)
	}
}

// controlScreen runs the display and keyboard subcommands of controlvm
// for a running machine; ok is false for any other subcommand.
func (e *emu) controlScreen(m *Machine, args []string) (code int, ok bool) {
	switch args[1] {
	case "screenshotpng":
		return e.screenshotPNG(m, args), true
	case "keyboardputscancode":
		if len(args) <= 2 {
			return e.syntaxError("Missing argument to '%s'. Expected IBM PC AT set 2 keyboard scancode(s).", args[1]), true
		}
		codes, code := e.parseScancodes(args[2:])
		if code >= 0 {
			return code, true
		}
		return e.putScancodes(m, codes), true
	case "keyboardputstring":
		if len(args) <= 2 {
			return e.syntaxError("Missing argument to '%s'. Expected ASCII string(s).", args[1]), true
		}
		return e.putScancodes(m, stringScancodes(args[2:])), true
	}
	return 0, false
}

// parseScancodes is keyboardputscancode's argument loop: each argument
// exactly two hex digits ("'%s' is not a hex byte!" otherwise, and
// nothing is sent).
func (e *emu) parseScancodes(args []string) ([]byte, int) {
	codes := make([]byte, 0, len(args))
	for _, a := range args {
		if len(a) != 2 || !isXDigit(a[0]) || !isXDigit(a[1]) {
			e.errorf("'%s' is not a hex byte!", a)
			return nil, exitFailure
		}
		v, _ := strconv.ParseUint(a, 16, 8)
		codes = append(codes, byte(v))
	}
	return codes, -1
}

func isXDigit(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// asciiTable is keyboardputstring's g_aASCIIChars (VBoxManageControlVM.cpp,
// the same in 6.1.38, 7.0.18 and 7.1.6), written as char:code, "s" for
// shift: the set 1 make code of each ASCII character the table types. The
// other characters (control characters but tab and newline, DEL, bytes
// past 0x7f) have none and are skipped without a word. The table is the US
// layout but for one entry: '`' (0x60) is 0x28, the apostrophe's key, where
// a US keyboard has it on 0x29 (which '~' uses, shifted).
const asciiTable = "09:0f 0a:1c 20:39 21:02s 22:28s 23:04s 24:05s 25:06s 26:08s 27:28 28:0as 29:0bs 2a:09s 2b:0ds " +
	"2c:33 2d:0c 2e:34 2f:35 30:0b 31:02 32:03 33:04 34:05 35:06 36:07 37:08 38:09 39:0a 3a:27s 3b:27 3c:33s " +
	"3d:0d 3e:34s 3f:35s 40:03s 41:1es 42:30s 43:2es 44:20s 45:12s 46:21s 47:22s 48:23s 49:17s 4a:24s 4b:25s " +
	"4c:26s 4d:32s 4e:31s 4f:18s 50:19s 51:10s 52:13s 53:1fs 54:14s 55:16s 56:2fs 57:11s 58:2ds 59:15s 5a:2cs " +
	"5b:1a 5c:2b 5d:1b 5e:07s 5f:0cs 60:28 61:1e 62:30 63:2e 64:20 65:12 66:21 67:22 68:23 69:17 6a:24 6b:25 " +
	"6c:26 6d:32 6e:31 6f:18 70:19 71:10 72:13 73:1f 74:14 75:16 76:2f 77:11 78:2d 79:15 7a:2c 7b:1as 7c:2bs " +
	"7d:1bs 7e:29s"

// asciiScancode is g_aASCIIChars[c]: 0 when the table has no code for c.
func asciiScancode(c byte) (code byte, shift bool) {
	for _, e := range strings.Fields(asciiTable) {
		ch, v, _ := strings.Cut(e, ":")
		if n, _ := strconv.ParseUint(ch, 16, 8); byte(n) == c {
			k, _ := strconv.ParseUint(v[:2], 16, 8)
			return byte(k), strings.HasSuffix(v, "s")
		}
	}
	return 0, false
}

// stringScancodes is keyboardPutString: the strings' characters as make
// and break codes, a space between two arguments, shift pressed and
// released only when the next character needs it otherwise, and released
// at the end.
func stringScancodes(args []string) []byte {
	var codes []byte
	shift := false
	for i, s := range args {
		if i > 0 && len(codes) > 0 {
			codes = append(codes, 0x39, 0x39|0x80)
		}
		for j := 0; j < len(s); j++ {
			code, needShift := asciiScancode(s[j])
			if code == 0 {
				continue
			}
			if shift != needShift {
				shift = needShift
				if shift {
					codes = append(codes, 0x2a)
				} else {
					codes = append(codes, 0x2a|0x80)
				}
			}
			codes = append(codes, code, code|0x80)
		}
	}
	if shift {
		codes = append(codes, 0x2a|0x80)
	}
	return codes
}

// putScancodes is keyboardPutScancodes: one IKeyboard::PutScancode per
// code, 10 ms apart.
func (e *emu) putScancodes(m *Machine, codes []byte) int {
	if m.QMPSocket == "" {
		e.errorf("emulator: no lab VM behind machine %q: nothing to type on", m.Name)
		return exitFailure
	}
	extended := false
	for _, c := range codes {
		if c == 0xe0 {
			extended = true
		} else {
			// QEMU's "number" key is its qnum: the make code, with 0x80
			// for an extended key (ui/input-keymap.c qcode_to_number).
			num := int(c & 0x7f)
			if extended {
				num |= 0x80
			}
			extended = false
			ev := map[string]any{"type": "key", "data": map[string]any{"down": c&0x80 == 0,
				"key": map[string]any{"type": "number", "data": num}}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := qmp.Call(ctx, m.QMPSocket, "input-send-event", map[string]any{"events": []any{ev}})
			cancel()
			if err != nil {
				e.errorf("Failed to send a scancode.")
				return exitFailure
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return exitSuccess
}

// screenshotPNG is controlvm screenshotpng FILE [DISPLAY]: the display's
// PNG, written to FILE (created mode 0600 or truncated, RTFileOpen's
// OPEN_CREATE|WRITE|TRUNCATE).
func (e *emu) screenshotPNG(m *Machine, args []string) int {
	if len(args) <= 2 || len(args) > 4 {
		return e.syntaxError("Incorrect number of parameters.")
	}
	if len(args) == 4 {
		n, err := strconv.ParseUint(args[3], 0, 32)
		if err != nil {
			return e.syntaxError("Error parsing display number '%s'.", args[3])
		}
		if n != 0 {
			// Display::GetScreenResolution: aScreenId >= mcMonitors.
			e.errorf("emulator: the machine has one display; display %d is out of range", n)
			return exitFailure
		}
	}
	png, err := e.screendump(m)
	if err != nil {
		e.errorf("emulator: screenshot: %v", err)
		return exitFailure
	}
	f, err := os.OpenFile(args[2], os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		e.errorf("Failed to create file '%s' (%s).", args[2], rtErr(err))
		return exitFailure
	}
	_, err = f.Write(png)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		e.errorf("Failed to write screenshot to file '%s' (%s).", args[2], rtErr(err))
		return exitFailure
	}
	return exitSuccess
}

// rtErr names an error as IPRT's %Rrc would, roughly.
func rtErr(err error) string {
	switch {
	case os.IsNotExist(err):
		return "VERR_PATH_NOT_FOUND"
	case os.IsPermission(err):
		return "VERR_ACCESS_DENIED"
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

// screendump takes the lab VM's display as a PNG.
func (e *emu) screendump(m *Machine) ([]byte, error) {
	if m.QMPSocket == "" {
		return nil, fmt.Errorf("no lab VM behind machine %q", m.Name)
	}
	dir, err := os.MkdirTemp("", "vboxemu-screen-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "screen.png")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := qmp.Call(ctx, m.QMPSocket, "screendump", map[string]any{"filename": file, "format": "png"}); err != nil {
		return nil, err
	}
	return os.ReadFile(file)
}
