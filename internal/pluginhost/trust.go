package pluginhost

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Trust in external plugins. An external plugin runs with the server's
// privileges (root, often), so whoever can change it, or the directory it
// sits in, or any directory above, runs code as the server. As sshd's
// StrictModes does for authorized_keys, the plugin and the whole path to it
// must belong to root or to vmgate's own user and be writable by nobody
// else:
//
//   - the plugin: a regular, executable file, owned by root or this
//     process's user, without group or world write permission;
//   - plugin_dir (the directory the plugin is in): the same, for a
//     directory; a sticky bit does not make group or world write
//     acceptable there, since anyone could then add a file;
//   - every directory above, up to /: owned by root or this user, and not
//     group or world writable, unless it has the sticky bit (as /tmp does).
//     Unlike sshd, which refuses those too, a sticky directory is accepted
//     above plugin_dir: in it an entry can be renamed or removed only by its
//     own owner (who must be root or this user, checked at the next level),
//     the directory's owner (root or this user) or root, so nobody else can
//     put another directory in its place.
//
// Symlinks are resolved first (plugin_dir's real path and the plugin's are
// both checked), and the real path is then walked from / by file descriptor,
// one component at a time without following any symlink, so a symlink
// swapped in after the resolution is refused rather than followed. The
// plugin is opened at the end of that walk and run from that open file
// (/proc/self/fd, see procRunner): what was checked is what runs, whatever
// is renamed into its place between the check and the exec.

// ErrUntrustedPlugin: a plugin, or a directory on its path, could be
// changed by a user other than root and vmgate's own.
var ErrUntrustedPlugin = errors.New("untrusted plugin")

// execFD is the descriptor the child runs its plugin from: the open plugin
// is the child's first extra file (fd 3, after stdin, stdout and stderr).
const execFD = 3

// openTrusted checks the plugin at path (absolute) and the path up to it,
// and returns the plugin opened for reading, to be executed through
// /proc/self/fd. An error wraps ErrUntrustedPlugin (naming the file or
// directory, its owner and mode, and what to do), or says that path is no
// executable file, or is the file system's.
func openTrusted(path string) (*os.File, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%w: %s is not an absolute path", ErrUntrustedPlugin, path)
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	fd, err := walkTrusted(dir, path)
	if err != nil {
		return nil, err
	}
	unix.Close(fd)
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, err
	}
	dirfd, err := walkTrusted(filepath.Dir(real), path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dirfd)
	fd, err = unix.Openat(dirfd, filepath.Base(real), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", real, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat %s: %w", real, err)
	}
	if err := trustedFile(real, path, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), real), nil
}

// walkTrusted opens dir (absolute, with no symlink in it) from / one
// component at a time, following none, and checks each directory on the
// way; dir itself is the plugin's directory. It returns an O_PATH
// descriptor of dir. plugin names the plugin for the errors.
func walkTrusted(dir, plugin string) (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	cur := "/"
	comps := strings.Split(strings.Trim(dir, "/"), "/")
	if dir == "/" {
		comps = nil
	}
	for i := 0; ; i++ {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("stat %s: %w", cur, err)
		}
		if err := trustedDir(cur, plugin, &st, i == len(comps)); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if i == len(comps) {
			return fd, nil
		}
		next, err := unix.Openat(fd, comps[i], unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		cur = filepath.Join(cur, comps[i])
		if err != nil {
			if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				return -1, fmt.Errorf("%w: %s changed while it was checked (a symlink or not a directory); plugin %s not started", ErrUntrustedPlugin, cur, plugin)
			}
			return -1, fmt.Errorf("open %s: %w", cur, err)
		}
		fd = next
	}
}

// trustedOwner reports whether uid may own what a plugin runs from.
func trustedOwner(uid uint32) bool { return uid == 0 || int(uid) == os.Geteuid() }

// trustedDir checks a directory on a plugin's path (its own directory
// when last).
func trustedDir(p, plugin string, st *unix.Stat_t, last bool) error {
	what := "directory " + p + " on the path to plugin " + plugin
	if last {
		what = "plugin directory " + p
	}
	mode := st.Mode & 0o7777
	switch {
	case !trustedOwner(st.Uid):
		return untrusted(what, st, "is owned by neither root nor vmgate's user ("+owner(uint32(os.Geteuid()))+")",
			"chown root "+p+" (and check what is in it)")
	case mode&0o022 != 0 && (last || mode&unix.S_ISVTX == 0):
		return untrusted(what, st, "is writable by "+writers(mode)+", who could put another plugin there",
			"chmod go-w "+p+" (and check what is in it)")
	}
	return nil
}

// trustedFile checks the plugin file itself (real is its real path).
func trustedFile(real, plugin string, st *unix.Stat_t) error {
	what := "plugin " + plugin
	if real != plugin {
		what += " (" + real + ")"
	}
	mode := st.Mode & 0o7777
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%s is not a regular file", what)
	case mode&0o111 == 0:
		return fmt.Errorf("%s is not executable (mode %04o)", what, mode)
	case !trustedOwner(st.Uid):
		return untrusted(what, st, "is owned by neither root nor vmgate's user ("+owner(uint32(os.Geteuid()))+")",
			"chown root "+real+" && chmod go-w "+real+", or remove it")
	case mode&0o022 != 0:
		return untrusted(what, st, "is writable by "+writers(mode)+", who could replace what the server runs",
			"chmod go-w "+real)
	}
	return nil
}

func untrusted(what string, st *unix.Stat_t, why, fix string) error {
	return fmt.Errorf("%w: %s (owner %s, mode %04o) %s; the plugin would run with the server's privileges, so it is not started: %s",
		ErrUntrustedPlugin, what, owner(st.Uid), st.Mode&0o7777, why, fix)
}

// owner names uid: "uid 65534 (nobody)".
func owner(uid uint32) string {
	s := "uid " + strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil && u.Username != "" {
		s += " (" + u.Username + ")"
	}
	return s
}

// writers says who may write a file of mode: "its group", "everyone" or both.
func writers(mode uint32) string {
	switch {
	case mode&0o022 == 0o022:
		return "its group and everyone"
	case mode&0o020 != 0:
		return "its group"
	}
	return "everyone"
}
