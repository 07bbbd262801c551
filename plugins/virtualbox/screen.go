package virtualbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/consolebuf"
)

// The display, the keyboard and the serial console through VBoxManage
// (VBoxManageControlVM.cpp handleControlVM, VBoxManageInfo.cpp
// showVMInfo), not the Guest Additions:
//
//   - Screenshot: controlvm VM screenshotpng FILE, FILE in a directory of
//     the driver's own (mode 0700, made for the call and removed after:
//     VBoxManage opens FILE following symlinks and truncating it), read back
//     without following a symlink.
//   - SendKeys: controlvm VM keyboardputscancode with PC XT set 1 codes,
//     text included. keyboardputstring is not used: it drops without a word
//     every character its table lacks, types '`' as an apostrophe (its
//     g_aASCIIChars has 0x28 for it) and puts a space between arguments;
//     the key model refuses what it cannot type instead, before any key.
//     VBoxManage pauses 10 ms after each code (keyboardPutScancodes), so
//     the call takes as long as the typing.
//   - ConsoleRead: the first UART in file mode (modifyvm --uart1 0x3f8 4
//     --uart-mode1 file PATH): showvminfo names the file (uartmode1=
//     "file,PATH"), which VirtualBox appends the guest's output to; the
//     driver reads it by offset, like the QEMU driver's log.
//   - ConsoleWrite: none. A file-mode UART takes no input, and VBoxManage
//     has no command that writes to a serial port. A UART in server mode
//     (a host pipe: --uart-mode1 server PATH) could be written by whoever
//     connects to the pipe, one client at a time and without history; the
//     driver does not (it reads the file mode's whole history instead).

var (
	_ hypervisor.Screener      = (*Driver)(nil)
	_ hypervisor.KeySender     = (*Driver)(nil)
	_ hypervisor.ConsoleReader = (*Driver)(nil)
)

// maxScreenshotBytes bounds the PNG read back.
const maxScreenshotBytes = 64 << 20

// maxScancodesPerCall bounds one keyboardputscancode's argv.
const maxScancodesPerCall = 512

// Screenshot captures the machine's first display as a PNG.
func (d *Driver) Screenshot(ctx context.Context, vm string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
	const op = "screenshot"
	if err := req.Validate(); err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("virtualbox: %w", err)
	}
	if err := d.checkName(op, vm); err != nil {
		return hypervisor.Screenshot{}, err
	}
	dir, err := os.MkdirTemp("", "vmgate-vbox-screen-")
	if err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "screen.png")
	if err := d.vboxOK(ctx, op, "controlvm", vm, "screenshotpng", file); err != nil {
		return hypervisor.Screenshot{}, err
	}
	b, err := readPrivate(file, maxScreenshotBytes)
	if err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	shot, err := hypervisor.ScreenshotFromPNG(b, req.MaxWidth)
	if err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("virtualbox: %w", err)
	}
	return shot, nil
}

// readPrivate reads a regular file of at most max bytes, not following a
// symlink in its last component.
func readPrivate(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > max {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes", path, max)
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// SendKeys presses req's keys with keyboardputscancode.
func (d *Driver) SendKeys(ctx context.Context, vm string, req hypervisor.KeysRequest) error {
	const op = "send keys"
	presses, err := req.Presses()
	if err != nil {
		return fmt.Errorf("virtualbox: %w", err)
	}
	if err := d.checkName(op, vm); err != nil {
		return err
	}
	var codes []string
	flush := func() error {
		if len(codes) == 0 {
			return nil
		}
		err := d.vboxOK(ctx, op, append([]string{"controlvm", vm, "keyboardputscancode"}, codes...)...)
		codes = codes[:0]
		return err
	}
	for _, combo := range presses {
		c := scancodes(combo)
		if len(codes)+len(c) > maxScancodesPerCall {
			if err := flush(); err != nil {
				return err
			}
		}
		codes = append(codes, c...)
	}
	return flush()
}

// scancodes are a combination's make codes in order, then its break codes
// in reverse, as two-digit hex (an extended key's 0xe0 first).
func scancodes(combo hypervisor.KeyCombo) []string {
	var out []string
	code := func(k hypervisor.Key, brk bool) {
		xt := k.XT()
		if xt > 0xff {
			out = append(out, "e0")
		}
		b := byte(xt)
		if brk {
			b |= 0x80
		}
		out = append(out, fmt.Sprintf("%02x", b))
	}
	for _, k := range combo {
		code(k, false)
	}
	for i := len(combo) - 1; i >= 0; i-- {
		code(combo[i], true)
	}
	return out
}

// ConsoleRead reads the machine's first UART's file.
func (d *Driver) ConsoleRead(ctx context.Context, vm string, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
	const op = "console read"
	if err := req.Validate(); err != nil {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("virtualbox: %w", err)
	}
	if err := d.checkName(op, vm); err != nil {
		return hypervisor.ConsoleChunk{}, err
	}
	r, err := d.vbox(ctx, "showvminfo", vm, "--machinereadable")
	if err != nil {
		return hypervisor.ConsoleChunk{}, ctxError(op, err)
	}
	if r.code != 0 {
		return hypervisor.ConsoleChunk{}, vboxError(op, r)
	}
	path, err := uartFile(ParseMachineReadable(r.stdout), vm)
	if err != nil {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	f, err := consolebuf.OpenLog(path)
	if err != nil {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("virtualbox: %s: %w: the UART's file: %w", op, hypervisor.ErrBackend, err)
	}
	defer f.Close()
	c, err := consolebuf.ReadLog(f, req)
	if err != nil {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("virtualbox: %s: %w: the UART's file %s: %w", op, hypervisor.ErrBackend, path, err)
	}
	return c, nil
}

// uartFile is the file of the first UART in file mode (showvminfo's
// uart1 and uartmode1), or what to change.
func uartFile(kv map[string]string, vm string) (string, error) {
	enable := fmt.Sprintf("enable it with the VM powered off: VBoxManage modifyvm %s --uart1 0x3f8 4 --uart-mode1 file /path/to/%s-console.log", vm, vm)
	if kv["uart1"] == "" || kv["uart1"] == "off" {
		return "", fmt.Errorf("%w: the VM's first serial port is off; %s", hypervisor.ErrNotSupported, enable)
	}
	mode := kv["uartmode1"]
	path, ok := strings.CutPrefix(mode, "file,")
	if !ok || path == "" {
		return "", fmt.Errorf("%w: the VM's first serial port is in mode %q; the driver reads a port in file mode: %s", hypervisor.ErrNotSupported, mode, enable)
	}
	return path, nil
}
