//go:build linux

package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Staging: data too large for the exec channel's stdin (Proxmox relays at
// most 64 KiB) comes through the driver's file channel into a staging file
// that file stage creates in <Root>/xfer (0700, this user's, no symlink on
// the way), and file write --from copies it to its destination with all the
// checks of a write, then removes it. Only the destination is the agent's
// path; the staging path is vmgate's own.

// stageTTL: stage removes staging files older than this (a host that died
// between stage and write).
const stageTTL = time.Hour

var stageName = regexp.MustCompile(`^x-[0-9a-f]{32}$`)

func (a *Agent) xferDir() string { return filepath.Join(a.cfg.Root, "xfer") }

// checkXferDir makes sure the staging directory exists, is a real directory
// of this user and no one else's to enter.
func (a *Agent) checkXferDir(op string) error {
	dir := a.xferDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fileErr(op, dir, err)
	}
	fd, err := openNoFollow(op, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileErr(op, dir, err)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return refused(wire.ReasonNotRegular, "%s: refused: staging directory %s is not private (uid %d, mode %#o)", op, dir, st.Uid, st.Mode&0o7777)
	}
	return nil
}

// FileStage creates an empty private staging file and returns its path.
func (a *Agent) FileStage(ctx context.Context) (wire.FileInfo, error) {
	const op = "file stage"
	if err := a.checkXferDir(op); err != nil {
		return wire.FileInfo{}, err
	}
	a.removeStale()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	p := filepath.Join(a.xferDir(), "x-"+hex.EncodeToString(b))
	fd, err := openNoFollow(op, p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return wire.FileInfo{}, err
	}
	unix.Close(fd)
	return wire.FileInfo{Path: p, Exists: true, Type: "file", Mode: 0o600}, nil
}

func (a *Agent) removeStale() {
	ents, err := os.ReadDir(a.xferDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		if info, err := e.Info(); err == nil && stageName.MatchString(e.Name()) && time.Since(info.ModTime()) > stageTTL {
			_ = os.Remove(filepath.Join(a.xferDir(), e.Name()))
		}
	}
}

// openStaged opens a staging file file stage made, for reading, and removes
// its name (the open descriptor keeps the data).
func (a *Agent) openStaged(op, p string, size int64) (*os.File, error) {
	if filepath.Clean(p) != p || filepath.Dir(p) != a.xferDir() || !stageName.MatchString(filepath.Base(p)) {
		return nil, invalidf("%s: --from %q is not a staging file of file stage", op, p)
	}
	if err := a.checkXferDir(op); err != nil {
		return nil, err
	}
	fd, err := openNoFollow(op, p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	_ = os.Remove(p)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fileErr(op, p, err)
	}
	if typeOf(&st) != "file" || st.Size != size {
		f.Close()
		return nil, invalidf("%s: staging file %s holds %d bytes (type %s); want %d", op, p, st.Size, typeOf(&st), size)
	}
	return f, nil
}
