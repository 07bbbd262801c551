//go:build linux

package agent

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Both shims (RlimitExec and SandboxMain) end the same way: set the
// session's rlimits on themselves, then replace themselves with the
// command. Under a fresh RLIMIT_AS the Go runtime may find no room to map
// memory, and dies ("fatal error: runtime: cannot allocate memory") if it
// must. So everything that allocates happens first (execImage), and the
// steps after the limits (execUnderLimits) allocate nothing.

// execImage is a command's path, argv and environment as the NUL-ended C
// strings execve(2) reads, built before any limit is set.
type execImage struct {
	path *byte
	argv []*byte
	envv []*byte
}

// newExecImage builds the C strings for execve(path, argv, envv).
func newExecImage(path string, argv, envv []string) (execImage, error) {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return execImage{}, fmt.Errorf("exec %s: %w", path, err)
	}
	a, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return execImage{}, fmt.Errorf("exec %s: argv: %w", path, err)
	}
	e, err := syscall.SlicePtrFromStrings(envv)
	if err != nil {
		return execImage{}, fmt.Errorf("exec %s: environment: %w", path, err)
	}
	return execImage{path: p, argv: a, envv: e}, nil
}

// rlimitSetting is one resource limit a shim sets, soft and hard alike;
// a zero val leaves the resource as it is.
type rlimitSetting struct {
	res int
	val uint64
}

// execUnderLimits sets limits in order and replaces the process with img.
// It returns only on failure: the index into limits of the first limit
// that could not be set and its errno, or len(limits) and the execve's
// errno. Nothing in it allocates, so a limit on the address space cannot
// kill the runtime between the setrlimit and the exec. Put RLIMIT_AS
// last, so that a failure to set an earlier limit leaves the caller room
// to report it.
func execUnderLimits(img execImage, limits []rlimitSetting) (int, syscall.Errno) {
	for i, l := range limits {
		if l.val == 0 {
			continue
		}
		lim := syscall.Rlimit{Cur: l.val, Max: l.val}
		_, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, 0, uintptr(l.res),
			uintptr(unsafe.Pointer(&lim)), 0, 0, 0)
		if errno != 0 {
			return i, errno
		}
	}
	_, _, errno := syscall.RawSyscall(syscall.SYS_EXECVE, uintptr(unsafe.Pointer(img.path)),
		uintptr(unsafe.Pointer(&img.argv[0])), uintptr(unsafe.Pointer(&img.envv[0])))
	return len(limits), errno
}

// restoreFileLimit puts back the soft RLIMIT_NOFILE this process started
// with. Go raises that limit for itself at start-up and keeps the original
// inside package syscall, where only its exec and fork paths read it:
// syscall.Exec restores it before it calls execve(2). An exec of the
// empty path fails there (ENOENT) and changes nothing else, so it leaves
// just that restore behind. Commands run by the shims then see the same
// limit as the agent's other commands (os/exec restores it for them), not
// Go's raised one: old software that select(2)s on descriptors counts on
// 1024. When Go raised nothing, nothing changes. It allocates: call it
// before the limits.
func restoreFileLimit() {
	_ = syscall.Exec("", nil, nil)
}

// limitedExec replaces the process with path, argv and this process's
// environment under limits, with the open-files limit of the process
// before Go (restoreFileLimit). It returns only on failure.
func limitedExec(path string, argv []string, limits []rlimitSetting) error {
	img, err := newExecImage(path, argv, os.Environ())
	if err != nil {
		return err
	}
	restoreFileLimit()
	at, errno := execUnderLimits(img, limits)
	return execFailure(path, limits, at, errno)
}

// execFailure is the reason execUnderLimits returned, in words.
func execFailure(path string, limits []rlimitSetting, at int, errno syscall.Errno) error {
	if at < len(limits) {
		return fmt.Errorf("setrlimit %s: %w", rlimitName(limits[at].res), errno)
	}
	return fmt.Errorf("exec %s: %w", path, errno)
}

// rlimitName names the resources the shims set, for their errors.
func rlimitName(res int) string {
	switch res {
	case unix.RLIMIT_AS:
		return "RLIMIT_AS"
	case unix.RLIMIT_NPROC:
		return "RLIMIT_NPROC"
	}
	return strconv.Itoa(res)
}
