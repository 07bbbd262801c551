package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/consolebuf"
)

// The serial console, without QMP or the guest agent. A VM's console is a
// socket chardev (server, one client at a time) with a logfile:
//
//	-chardev socket,id=serial0,path=console.sock,server=on,wait=off,logfile=serial.log
//	-serial chardev:serial0
//
// (the lab's VMs have it; a configured VM names the two paths as console
// and console_log). QEMU logs everything the guest writes to the chardev
// whether a client is connected or not (qemu_chr_write_log in
// chardev/char.c), so the log file is the console's output from the start
// of the QEMU process, and a cursor is a byte offset in it: any number of
// readers, tails and cursors without the driver keeping a buffer. A
// cursor past the file's end means QEMU started again (a new process
// truncates its log): the read starts over with Reset.
//
// Input goes through the socket: the driver connects, writes, waits until
// QEMU has read every byte (SIOCOUTQ on its end of the socket falls to
// zero) and disconnects. Waiting matters: a client that hangs up at once
// can lose what QEMU has not read yet, since QEMU drops the connection on
// the hang-up. QEMU serves one client at a time, so a console held by
// another client (a person's socat) takes the write only once it leaves:
// the write times out then, saying so.
//
// Why not the ringbuf chardev: ringbuf-write puts data into the ring
// itself, beside the guest's output, and never hands it to the guest
// (qmp_ringbuf_write in chardev/char-ringbuf.c calls ringbuf_chr_write, the
// backend's write), so a ringbuf console cannot take input.

var (
	_ hypervisor.ConsoleReader = (*Driver)(nil)
	_ hypervisor.ConsoleWriter = (*Driver)(nil)
)

// Console paths in a lab VM's directory (internal/lab owns the layout).
const (
	labConsoleSocket = "console.sock"
	labConsoleLog    = "serial.log"
)

// consolePaths returns vm's console socket and log ("" when unknown).
func (vm *vmState) consolePaths() (sock, log string) {
	if vm.labDir != "" {
		return filepath.Join(vm.labDir, labConsoleSocket), filepath.Join(vm.labDir, labConsoleLog)
	}
	return vm.consoleSock, vm.consoleLog
}

// ConsoleRead reads vm's console output from its log.
func (d *Driver) ConsoleRead(ctx context.Context, name string, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
	if err := req.Validate(); err != nil {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("qemu: %w", err)
	}
	vm, err := d.lookup("console read", name)
	if err != nil {
		return hypervisor.ConsoleChunk{}, err
	}
	_, logPath := vm.consolePaths()
	if logPath == "" {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("qemu: console read: %w: no console log is configured for %s: give it console_log (the logfile= of its serial chardev)",
			hypervisor.ErrNotSupported, name)
	}
	f, err := consolebuf.OpenLog(logPath)
	if err != nil {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("qemu: console read: %w: the console log: %w", hypervisor.ErrBackend, err)
	}
	defer f.Close()
	c, err := consolebuf.ReadLog(f, req)
	if err != nil {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("qemu: console read: %w: the console log %s: %w", hypervisor.ErrBackend, logPath, err)
	}
	return c, nil
}

// ConsoleWrite sends data to vm's console input through its socket.
func (d *Driver) ConsoleWrite(ctx context.Context, name string, data []byte) error {
	if err := hypervisor.ValidateConsoleWrite(data); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	vm, err := d.lookup("console write", name)
	if err != nil {
		return err
	}
	sock, _ := vm.consolePaths()
	if sock == "" {
		return fmt.Errorf("qemu: console write: %w: no console socket is configured for %s: give it console (the path of its serial chardev socket, server=on)",
			hypervisor.ErrNotSupported, name)
	}
	vm.consoleMu.Lock()
	defer vm.consoleMu.Unlock()
	return writeConsole(ctx, sock, data)
}

// writeConsole connects to a console socket, writes data and waits until
// QEMU has read all of it.
func writeConsole(ctx context.Context, sock string, data []byte) error {
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", sock)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("qemu: console write: %w: nothing listens on the console socket %s", hypervisor.ErrVMNotRunning, sock)
	case err != nil:
		return vmError("console write", err)
	}
	uc := c.(*net.UnixConn)
	defer uc.Close()
	go io.Copy(io.Discard, uc) // what QEMU echoes back; it is in the log
	if dl, ok := ctx.Deadline(); ok {
		uc.SetWriteDeadline(dl)
	}
	if _, err := uc.Write(data); err != nil {
		return vmError("console write", err)
	}
	if err := waitTaken(ctx, uc); err != nil {
		return fmt.Errorf("qemu: console write: %w: QEMU has not read the input within the deadline: another client may hold the console socket %s (QEMU serves one at a time): %w",
			hypervisor.ErrTimeout, sock, err)
	}
	return nil
}

// waitTaken waits until the peer has read everything written on uc: on a
// unix stream socket SIOCOUTQ counts the bytes the peer has not read.
func waitTaken(ctx context.Context, uc *net.UnixConn) error {
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var b hypervisor.Backoff
	for {
		var queued int
		var ierr error
		if err := raw.Control(func(fd uintptr) { queued, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil {
			return err
		}
		if ierr != nil {
			return ierr
		}
		if queued == 0 {
			return nil
		}
		if err := b.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}
