//go:build linux

package agent

import (
	"errors"
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// writeAccess fills Enforced.WriteBlocked: the extra write paths that the
// session's own uid cannot write for the files' own permissions (a policy
// may allow /data, which is root's and mode 0755): the sandbox does not
// stop those writes, Unix does, and create says so, as a refused command's
// note does.
func (c *creation) writeAccess() error {
	if !c.sandboxed() || c.m.Enforced.User != wire.UserSession {
		return nil
	}
	names := &userNames{file: "/etc/passwd"}
	for _, p := range c.m.Sandbox.FS.Write {
		why, err := writeBlocked(p, c.m.Enforced.UID, c.m.Enforced.GID, names)
		if err != nil {
			return fmt.Errorf("checking %s: %w", p, err)
		}
		if why != "" {
			c.m.Enforced.WriteBlocked = append(c.m.Enforced.WriteBlocked, wire.BlockedPath{Path: p, Reason: why})
			c.m.Enforced.NotEnforced = append(c.m.Enforced.NotEnforced, "fs.write "+p+": "+why)
		}
	}
	return nil
}

// writeBlocked asks the kernel whether uid and gid, without supplementary
// groups or capabilities, may write p (and, for a directory, create in it)
// and, when not, says why in words ("" when they may). It runs on a thread
// of its own that takes uid and gid as its file-system ids (setfsuid and
// setfsgid act on the calling thread alone, and leaving uid 0 clears the
// thread's file capabilities), checks with faccessat2(AT_EACCESS), and
// ends with its goroutine.
func writeBlocked(p string, uid, gid int, names *userNames) (string, error) {
	type verdict struct {
		at  string // the path that denied ("" for none)
		err error  // why: EACCES (permissions), EROFS, ...
	}
	done := make(chan verdict, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread and its ids end here
		at, err := accessAs(p, uid, gid)
		done <- verdict{at, err}
	}()
	v := <-done
	switch {
	case v.err == nil, errors.Is(v.err, unix.ENOSYS): // before Linux 5.8: nothing to say
		return "", nil
	case v.at == "":
		return "", v.err // could not ask
	case errors.Is(v.err, unix.EROFS):
		return "the file system holding it is read-only", nil
	case errors.Is(v.err, unix.ENOENT):
		return "it does not exist", nil
	}
	var st unix.Stat_t
	if err := unix.Lstat(v.at, &st); err != nil {
		return "", err
	}
	owner := fmt.Sprintf("owned by %s, mode %04o", names.name(st.Uid), st.Mode&0o7777)
	if v.at != p {
		return fmt.Sprintf("%s is %s: the session's uid cannot reach %s", v.at, owner, p), nil
	}
	return owner + ": the session's uid cannot write", nil
}

// accessAs switches the calling (locked) thread's file-system ids to uid
// and gid and checks search access on every directory above p, then write
// access (and search, for a directory) on p. It returns the path that
// denied and the error, or "" and nil.
func accessAs(p string, uid, gid int) (string, error) {
	for _, sc := range []struct {
		nr, arg uintptr
	}{{unix.SYS_SETGROUPS, 0}, {unix.SYS_SETFSGID, uintptr(gid)}, {unix.SYS_SETFSUID, uintptr(uid)}} {
		if _, _, errno := unix.RawSyscall(sc.nr, sc.arg, 0, 0); errno != 0 {
			return "", fmt.Errorf("switching ids: %w", errno)
		}
	}
	// setfsuid returns the id in force whatever it is given: -1 changes nothing.
	if cur, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); int(cur) != uid {
		return "", fmt.Errorf("switching ids: the file-system uid is %d, not %d", cur, uid)
	}
	dir := ""
	for _, c := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		parent := dir
		if parent == "" {
			parent = "/"
		}
		if err := unix.Faccessat2(unix.AT_FDCWD, parent, unix.X_OK, unix.AT_EACCESS); err != nil {
			return parent, err
		}
		dir += "/" + c
	}
	mode := uint32(unix.W_OK)
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		mode |= unix.X_OK
	}
	if err := unix.Faccessat2(unix.AT_FDCWD, p, mode, unix.AT_EACCESS|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return p, err
	}
	return "", nil
}
