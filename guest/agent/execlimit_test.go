//go:build linux

package agent

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestExecUnderLimitsAllocatesNothing: between the first setrlimit and
// the exec nothing allocates, so a fresh RLIMIT_AS cannot kill the
// runtime there (it did, now and then, when the shims used syscall.Exec).
// The exec of a missing file fails, leaving this process as it was; the
// limit set is a resource's own hard value, which changes nothing.
func TestExecUnderLimitsAllocatesNothing(t *testing.T) {
	same := rlimitSetting{res: -1}
	for _, res := range []int{syscall.RLIMIT_AS, syscall.RLIMIT_FSIZE, syscall.RLIMIT_CPU, syscall.RLIMIT_DATA, syscall.RLIMIT_CORE} {
		var l syscall.Rlimit
		if err := syscall.Getrlimit(res, &l); err == nil && l.Cur == l.Max {
			same = rlimitSetting{res, l.Max}
			break
		}
	}
	if same.res < 0 {
		t.Fatal("no resource here has its soft limit at its hard one")
	}
	missing := t.TempDir() + "/missing"
	img, err := newExecImage(missing, []string{missing, "arg"}, []string{"A=1"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		limits []rlimitSetting
		at     int
		errno  syscall.Errno
		msg    string
	}{
		{"exec fails", []rlimitSetting{same, {syscall.RLIMIT_AS, 0}}, 2, syscall.ENOENT, "exec " + missing + ": no such file or directory"},
		{"setrlimit fails", []rlimitSetting{{1000, 1}, same}, 0, syscall.EINVAL, "setrlimit 1000: invalid argument"},
	}
	for _, tt := range tests {
		var at int
		var errno syscall.Errno
		allocs := testing.AllocsPerRun(20, func() { at, errno = execUnderLimits(img, tt.limits) })
		if allocs != 0 || at != tt.at || errno != tt.errno {
			t.Errorf("%s: execUnderLimits = %d, %v with %v allocations; want %d, %v with none", tt.name, at, errno, allocs, tt.at, tt.errno)
		}
		if err := execFailure(missing, tt.limits, at, errno); err == nil || err.Error() != tt.msg || !errors.Is(err, tt.errno) {
			t.Errorf("%s: execFailure = %v; want %q wrapping %v", tt.name, err, tt.msg, tt.errno)
		}
	}
	// The resources the shims set are named in their errors.
	limits := []rlimitSetting{{unix.RLIMIT_NPROC, 64}, {unix.RLIMIT_AS, 1 << 30}}
	for at, want := range []string{"setrlimit RLIMIT_NPROC: resource temporarily unavailable", "setrlimit RLIMIT_AS: operation not permitted"} {
		errno := []syscall.Errno{syscall.EAGAIN, syscall.EPERM}[at]
		if err := execFailure(missing, limits, at, errno); err == nil || err.Error() != want {
			t.Errorf("execFailure(%v, %d, %v) = %v; want %q", limits, at, errno, err, want)
		}
	}
}

// TestShimsRestoreFileLimit: a command a shim runs sees the soft
// RLIMIT_NOFILE the agent's other commands see, not the one Go raised for
// the shim, and its address-space limit. It changes this process's soft
// RLIMIT_NOFILE while it runs (and puts it back), so it must not run in
// parallel with other tests.
func TestShimsRestoreFileLimit(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	soft := min(orig.Max/2, 1000)
	if soft < 64 {
		t.Fatalf("the hard RLIMIT_NOFILE here is %d: too low to tell a restored soft limit from a raised one", orig.Max)
	}
	// Children of this process inherit soft as it is: Go restores a soft
	// limit of its own only when it raised it.
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: soft, Max: orig.Max}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const as = 1 << 30
	shell := []string{"--", "sh", "-c", "ulimit -Sn; ulimit -v"}
	for _, shim := range [][]string{
		{ShimCommand, "--as", strconv.Itoa(as), "--nproc", "0"},
		{SandboxCommand, `{"uid":-1,"gid":-1,"rlimit_as":` + strconv.Itoa(as) + `}`},
	} {
		cmd := exec.Command(self, append(shim, shell...)...)
		out, err := cmd.CombinedOutput()
		want := strconv.FormatUint(soft, 10) + "\n" + strconv.Itoa(as>>10) + "\n"
		if err != nil || string(out) != want {
			t.Errorf("%s: `ulimit -Sn; ulimit -v` = %q, %v; want %q", strings.Join(shim, " "), out, err, want)
		}
	}
}
