//go:build linux

package agent

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Atomic replacement: a whole file is written to a temporary file in the
// same directory, synced, given its mode and owner, and only then given
// the final name, so a reader sees the old file or the new one, never a
// mix, and a write that fails (an error, a kill, a guest agent that stops
// answering, a power cut) leaves the old file as it was.
//
// The temporary file is unnamed where the filesystem can (O_TMPFILE: a
// write killed half-way leaves nothing behind) and otherwise named
// .vmgate-tmp-<16 hex digits> (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, under
// the directory's no-follow descriptor). A new file is linked to its name
// (linkat, which fails when the name appeared meanwhile) or renamed to it
// with RENAME_NOREPLACE; an existing one is replaced by renameat, from a
// temporary name. The writer holds an flock on the temporary file while it
// has a temporary name; cleanTemps removes the named ones a killed write left: only
// recognisable names, regular files of this user with one link, unlocked
// and untouched for tempAge.

// tempPrefix starts the name of every named temporary file.
const tempPrefix = ".vmgate-tmp-"

var tempName = regexp.MustCompile(`^\.vmgate-tmp-[0-9a-f]{16}$`)

// tempAge is how long a temporary file must be untouched before cleanTemps
// removes it (the flock protects a live writer; the age covers the moment
// between a named file's creation and its lock).
const tempAge = time.Minute

// fileFaults inject failures into writes: tests only; the zero value
// injects nothing.
type fileFaults struct {
	// fsync, when set, runs before each fsync ("file", "dir") and syncfs
	// ("fs") and fails it with what it returns.
	fsync func(what string) error
	// rename, when set, runs just before a whole-file write (or an
	// archive's file) checks the old file again and links or renames the
	// new one into place, and fails the write with what it returns.
	rename func() error
	// noTmpfile makes every temporary file a named one.
	noTmpfile bool
	// tempAge replaces tempAge when positive.
	tempAge time.Duration
	// archiveBatch replaces batchFiles when positive.
	archiveBatch int
}

func (a *Agent) fsync(what string, fd int) error {
	if a.faults.fsync != nil {
		if err := a.faults.fsync(what); err != nil {
			return err
		}
	}
	return unix.Fsync(fd)
}

// tempFile is the temporary file of one atomic write in directory dfd.
type tempFile struct {
	a    *Agent
	f    *os.File
	dfd  int
	name string // "" while unnamed (O_TMPFILE)
	done bool   // linked or renamed into place
}

// newTemp creates a temporary file in dfd, mode 0600; a named one locked
// (an unnamed one is locked when it gets a temporary name, in replace).
func (a *Agent) newTemp(op, p string, dfd int) (*tempFile, error) {
	t := &tempFile{a: a, dfd: dfd}
	fd := -1
	var err error
	if !a.faults.noTmpfile {
		fd, err = unix.Openat(dfd, ".", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	}
	if a.faults.noTmpfile || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) {
		t.name = tempPrefix + randomHex(8)
		fd, err = unix.Openat(dfd, t.name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY, 0o600)
	}
	if err != nil {
		return nil, fileErr(op, filepath.Dir(p), err)
	}
	t.f = os.NewFile(uintptr(fd), p)
	if t.name == "" {
		return t, nil
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.discard()
		return nil, fileErr(op, p, err)
	}
	return t, nil
}

// linkTo gives the temporary file the name name in its directory, when
// nothing has that name: unix.EEXIST otherwise.
func (t *tempFile) linkTo(name string) error {
	if t.name != "" {
		if err := unix.Renameat2(t.dfd, t.name, t.dfd, name, unix.RENAME_NOREPLACE); err != nil {
			return err
		}
	} else if err := t.link(name); err != nil {
		return err
	}
	t.done = true
	return nil
}

// link links the unnamed file to name: by descriptor where this process
// may (CAP_DAC_READ_SEARCH), else through /proc/self/fd.
func (t *tempFile) link(name string) error {
	err := unix.Linkat(int(t.f.Fd()), "", t.dfd, name, unix.AT_EMPTY_PATH)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) {
		proc := filepath.Join(t.a.cfg.ProcDir, "self/fd", strconv.Itoa(int(t.f.Fd())))
		err = unix.Linkat(unix.AT_FDCWD, proc, t.dfd, name, unix.AT_SYMLINK_FOLLOW)
	}
	return err
}

// replace puts the temporary file in place of name, whatever is there
// (a directory excepted): the one step that changes what name means.
func (t *tempFile) replace(name string) error {
	if t.name == "" {
		// An unnamed file needs a name to be renamed from, and the lock
		// that keeps cleanTemps off that name.
		if err := unix.Flock(int(t.f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			return err
		}
		tmp := tempPrefix + randomHex(8)
		if err := t.link(tmp); err != nil {
			return err
		}
		t.name = tmp
	}
	if err := unix.Renameat(t.dfd, t.name, t.dfd, name); err != nil {
		return err
	}
	t.done = true
	return nil
}

// discard closes the temporary file and, unless it was put in place,
// removes its name (when the name is still this file).
func (t *tempFile) discard() {
	if t.f == nil {
		return
	}
	if !t.done && t.name != "" {
		removeIfSame(t.dfd, t.name, t.f)
	}
	t.f.Close()
	t.f = nil
}

// cleanTemps removes the temporary files killed writes left in dfd.
func (a *Agent) cleanTemps(dfd int) {
	age := tempAge
	if a.faults.tempAge > 0 {
		age = a.faults.tempAge
	}
	dir, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(dir), ".")
	defer f.Close()
	for {
		names, err := f.Readdirnames(1024)
		for _, n := range names {
			if tempName.MatchString(n) {
				a.removeTemp(dfd, n, age)
			}
		}
		if err != nil || len(names) == 0 {
			return
		}
	}
}

// removeTemp removes the temporary file name in dfd if it is one this
// user's write left: a regular file, one link, unlocked, older than age.
func (a *Agent) removeTemp(dfd int, name string, age time.Duration) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || typeOf(&st) != "file" || int(st.Uid) != os.Geteuid() || st.Nlink != 1 {
		return
	}
	if time.Since(time.Unix(st.Mtim.Unix())) < age {
		return
	}
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
		return // a live write holds it
	}
	removeIfSame(dfd, name, f)
}
