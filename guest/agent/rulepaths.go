//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// A session's own paths (its workdir, its temporary directory and the
// policy's extra read and write paths) are opened by openRulePath,
// following no symlink in any component, once per confined thread (a
// resident helper's session thread serves many runs and checks the paths
// again before each: thread.go; elsewhere once per run); the Landlock rules
// (landlock_add_rule with the descriptor as parent_fd) and the mounts of
// the run's namespace (open_tree and move_mount of the descriptor) are
// made from those descriptors, never from the names again. A path that
// has become a symlink since the session was created (a session that may
// write its parent can swap it) refuses the run, naming it. The system
// directories, /etc and the device files are ruled by name: they are
// root's, and a session cannot change what their names mean.

// rulePath is one of a session's own paths, open for one run.
type rulePath struct {
	path  string
	fd    int // O_PATH, opened without following a symlink
	dir   bool
	write bool
	// dev and ino identify what fd is open on (pathID).
	dev, ino uint64
}

// rulePaths are a run's open paths; close closes them.
type rulePaths []rulePath

func (ps rulePaths) close() {
	for _, p := range ps {
		unix.Close(p.fd)
	}
}

// find returns the write path p, if open.
func (ps rulePaths) find(p string) (rulePath, bool) {
	for _, r := range ps {
		if r.write && r.path == p {
			return r, true
		}
	}
	return rulePath{}, false
}

// openPaths opens c's Read and Write paths. A missing one is left out (it
// gets no rule, as it had none to get); a symlink refuses the run.
func (c confinement) openPaths() (rulePaths, error) {
	var out rulePaths
	for _, l := range []struct {
		paths []string
		write bool
	}{{c.Read, false}, {c.Write, true}} {
		for _, p := range l.paths {
			if p == "" {
				continue
			}
			fd, st, err := openRulePath(p)
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				out.close()
				return nil, err
			}
			out = append(out, rulePath{path: p, fd: fd, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR, write: l.write, dev: st.Dev, ino: st.Ino})
		}
	}
	return out, nil
}

// pathID is what one of a session's paths (a Read or Write path of a
// confinement, in that order) names: nothing, or a file (dev, ino) in a
// mount (mnt, its id in the guest's mount namespace; 0 where the kernel
// does not say). A confined thread made once for many runs
// (sessionThread) is used only while its paths name what they named when
// it opened them; else a new one is made, as a run of its own would.
type pathID struct {
	missing  bool
	dev, ino uint64
	mnt      uint64
}

// idsOf is the identity of c's paths as paths has them open (a path not
// open was missing).
func (c confinement) idsOf(paths rulePaths) []pathID {
	var out []pathID
	c.eachPath(func(p string, write bool) {
		id := pathID{missing: true}
		for _, r := range paths {
			if r.path == p && r.write == write {
				id = pathID{dev: r.dev, ino: r.ino}
				break
			}
		}
		out = append(out, id)
	})
	return out
}

// pathIDs opens c's paths as openPaths does, in the calling thread's view,
// and returns what they name, with their mounts; a symlink refuses the
// run as openPaths would.
func (c confinement) pathIDs() ([]pathID, error) {
	var out []pathID
	var err error
	c.eachPath(func(p string, _ bool) {
		if err != nil {
			return
		}
		fd, _, oerr := openRulePath(p)
		switch {
		case errors.Is(oerr, unix.ENOENT):
			out = append(out, pathID{missing: true})
			return
		case oerr != nil:
			err = oerr
			return
		}
		defer unix.Close(fd)
		var stx unix.Statx_t
		if serr := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_MNT_ID, &stx); serr != nil {
			err = fmt.Errorf("sandbox path %s: %w", p, serr)
			return
		}
		id := pathID{dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), ino: stx.Ino}
		if stx.Mask&unix.STATX_MNT_ID != 0 {
			id.mnt = stx.Mnt_id
		}
		out = append(out, id)
	})
	return out, err
}

// eachPath calls fn for every Read path, then every Write path ("" left
// out), in order.
func (c confinement) eachPath(fn func(p string, write bool)) {
	for _, p := range c.Read {
		if p != "" {
			fn(p, false)
		}
	}
	for _, p := range c.Write {
		if p != "" {
			fn(p, true)
		}
	}
}

// openRulePath opens p (absolute, clean) O_PATH, following no symlink in
// any component (openat2 with RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS,
// or one O_NOFOLLOW openat per component before Linux 5.6). A symlink is
// a CodeRefused error (ReasonSymlink) naming it; a missing path wraps
// ENOENT.
func openRulePath(p string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	if err := wire.ValidateSandboxPath(p); err != nil {
		return -1, st, invalidf("sandbox path: %v", err)
	}
	fd, err := openNoFollowRaw(p, unix.O_PATH, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			if c := symlinkComponent(p); c != "" {
				return -1, st, pathSymlinkRefusal(p, c)
			}
		}
		return -1, st, fmt.Errorf("sandbox path %s: %w", p, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, fmt.Errorf("sandbox path %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		unix.Close(fd)
		return -1, st, pathSymlinkRefusal(p, p)
	}
	return fd, st, nil
}

func pathSymlinkRefusal(p, component string) error {
	target, _ := os.Readlink(component)
	return refused(wire.ReasonSymlink, "sandbox path %s: %s is a symlink (to %q): a sandbox rule follows no symlink, as it would land on the target, which the policy did not name; "+
		"put a real directory at %s (or create a new session without it)", p, component, target, p)
}

// Landlock access sets, as go-landlock's RODirs, RWDirs, ROFiles and
// RWFiles have them, for rules added by descriptor.
const (
	llRead  = ll.AccessFSExecute | ll.AccessFSReadFile | ll.AccessFSReadDir
	llWrite = ll.AccessFSWriteFile | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSMakeChar |
		ll.AccessFSMakeDir | ll.AccessFSMakeReg | ll.AccessFSMakeSock | ll.AccessFSMakeFifo |
		ll.AccessFSMakeBlock | ll.AccessFSMakeSym | ll.AccessFSTruncate
	llFile = ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSTruncate | ll.AccessFSReadFile
)

// access is what p's rule allows, within handled: read (and execute) a
// read path; read and write a write path, and for a directory move files
// within and between write paths (refer, when handled).
func (p rulePath) access(handled uint64) uint64 {
	a := uint64(llRead)
	if p.write {
		a |= llWrite
		if p.dir {
			a |= ll.AccessFSRefer
		}
	}
	if !p.dir {
		a &= llFile
	}
	return a & handled
}

// addRules adds a rule for every path to the Landlock ruleset rs.
func (ps rulePaths) addRules(rs int, handled uint64) error {
	for _, p := range ps {
		a := p.access(handled)
		if a == 0 {
			continue
		}
		attr := ll.PathBeneathAttr{ParentFd: p.fd, AllowedAccess: a}
		if err := ll.LandlockAddPathBeneathRule(rs, &attr, 0); err != nil {
			return fmt.Errorf("rule for %s: %w", p.path, err)
		}
	}
	return nil
}
