package virtualbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// checkGuestFile refuses a guest path that cannot name a file to copy: one
// ending in '/' or whose last element is "." or "..". VBoxManage builds the
// destination from the source's last element (GuestCtrlPrivate.cpp
// GuestPath::BuildDestinationPath) and refuses ".." there.
func checkGuestFile(p string) error {
	if err := checkGuestPath(p); err != nil {
		return err
	}
	if base := path.Base(p); p[len(p)-1] == '/' || base == "." || base == ".." {
		return fmt.Errorf("%w: guest path %q does not name a file", hypervisor.ErrInvalidArgument, p)
	}
	return nil
}

// copyTo writes data into the guest file dst through a 0600 host temp file.
// The destination has no trailing slash, so VBoxManage 7.x uses it as the
// file's name (BuildDestinationPath rule 3) and refuses a directory there.
func (d *Driver) copyTo(ctx context.Context, op, vm string, data []byte, dst string) error {
	dir, err := os.MkdirTemp("", "vmgate-vbox-")
	if err != nil {
		return fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "data")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		return fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	r, err := d.vbox(ctx, "guestcontrol", vm, "copyto",
		"--username", d.cfg.Username, "--passwordfile", d.cfg.PasswordFile,
		src, dst)
	if err != nil {
		return ctxError(op, err)
	}
	if r.code != 0 {
		return vboxError(op, r)
	}
	return nil
}

// FileRead copies path out of the guest into a private host directory and
// returns at most maxBytes of it. The destination is the directory with a
// trailing slash: VBoxManage 7.x then puts the file in it under its own
// name (BuildDestinationPath rule 2); without the slash it takes the
// directory for the file's name and fails "already exists and is a
// directory". 6.1 copies into an existing directory either way.
func (d *Driver) FileRead(ctx context.Context, vm string, p string, maxBytes int64) (hypervisor.FileContent, error) {
	const op = "file read"
	if err := d.checkName(op, vm); err != nil {
		return hypervisor.FileContent{}, err
	}
	if err := checkGuestFile(p); err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	if maxBytes < 0 {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: %w: negative max bytes", op, hypervisor.ErrInvalidArgument)
	}
	if maxBytes == 0 {
		maxBytes = DefaultMaxFileBytes
	}
	dir, err := os.MkdirTemp("", "vmgate-vbox-")
	if err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	defer os.RemoveAll(dir)
	r, err := d.vbox(ctx, "guestcontrol", vm, "copyfrom",
		"--username", d.cfg.Username, "--passwordfile", d.cfg.PasswordFile,
		p, dir+"/")
	if err != nil {
		return hypervisor.FileContent{}, ctxError(op, err)
	}
	if r.code != 0 {
		return hypervisor.FileContent{}, d.disabledOrUnavailable(ctx, op, vm, vboxError(op, r))
	}
	return readCopied(op, filepath.Join(dir, path.Base(p)), maxBytes)
}

// readCopied reads at most maxBytes of the copied file.
func readCopied(op, name string, maxBytes int64) (hypervisor.FileContent, error) {
	f, err := os.Open(name)
	if err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: copyfrom left no file: %w", op, err)
	}
	defer f.Close()
	buf := make([]byte, maxBytes+1)
	n, err := readFull(f, buf)
	if err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	if int64(n) > maxBytes {
		return hypervisor.FileContent{Data: buf[:maxBytes], Truncated: true}, nil
	}
	return hypervisor.FileContent{Data: buf[:n]}, nil
}

func readFull(f *os.File, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return n, err
			}
			return n, nil // EOF
		}
	}
	return n, nil
}

// FileWrite copies data into the guest file p (copyto), then applies mode
// with chmod through guestcontrol run. A new file gets VBoxService's
// default mode (0600) when mode is 0.
func (d *Driver) FileWrite(ctx context.Context, vm string, p string, data []byte, mode uint32) error {
	const op = "file write"
	if err := d.checkName(op, vm); err != nil {
		return err
	}
	if err := checkGuestFile(p); err != nil {
		return fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	if mode > 0o7777 {
		return fmt.Errorf("virtualbox: %s: %w: mode %#o", op, hypervisor.ErrInvalidArgument, mode)
	}
	if err := d.copyTo(ctx, op, vm, data, p); err != nil {
		return d.disabledOrUnavailable(ctx, op, vm, err)
	}
	if mode == 0 {
		return nil
	}
	s := runSpec{argv: []string{"/bin/chmod", strconv.FormatUint(uint64(mode), 8), "--", p}, timeout: time.Minute, limit: 4096}
	res, err := d.runOnce(ctx, op, vm, s)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Signal != 0 {
		return fmt.Errorf("virtualbox: %s: chmod: exit %d: %s", op, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return nil
}
