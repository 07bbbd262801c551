package libvirttest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// libvirtd runs in a PID namespace of its own, so that its QEMU processes
// end with the test process even when that is killed with SIGKILL. QEMU
// under libvirt has no Pdeathsig (libvirtd daemonizes it), so before this a
// test binary killed mid-run (go test's -timeout panics and exits, a
// developer's kill -9) left its domains' QEMU running. Now the chain is:
//
//	test thread ─Pdeathsig→ unshare ─--kill-child→ sh (pid 1) ─(namespace)→ libvirtd, QEMU
//
// When the init of a PID namespace dies the kernel kills every process in
// it. The init is a shell rather than libvirtd itself because a namespace's
// init inherits its orphans: QEMU, double-forked by libvirtd, is one, and
// must be reaped when it exits, or libvirtd (which checks kill(pid, 0)
// after SIGTERM and SIGKILL) would see its zombie as a QEMU that will not
// die. The shell's wait reaps any child, its own or inherited. --mount-proc
// gives the namespace a /proc of its own (in a mount namespace nested in
// the private one of namespace.go), so libvirtd's view of QEMU's pid (its
// pid file, /proc/PID) agrees with itself; the test process translates
// those pids with hostPID.
const unshareBinary = "unshare"

// pidNSArgv wraps argv so it runs under a reaping shell that is the init
// of a new PID namespace, killed with SIGKILL when unshare dies.
func pidNSArgv(argv ...string) ([]string, error) {
	unshare, err := exec.LookPath(unshareBinary)
	if err != nil {
		return nil, fmt.Errorf("libvirttest: %w (Debian package util-linux)", err)
	}
	return append([]string{unshare, "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
		"--", "/bin/sh", "-c", `"$0" "$@" & wait $!`}, argv...), nil
}

// children returns the child pids of pid (its main thread's children).
func children(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// nsInit returns the host pid of the init (the shell) of the PID namespace
// that the unshare process wrapper made, or 0 when it is not (or no
// longer) there.
func nsInit(wrapper int) int {
	if c := children(wrapper); len(c) == 1 {
		return c[0]
	}
	return 0
}

// hostPID returns the pid, as this process sees it, of the process whose
// pid is nspid in the PID namespace of the process init (a host pid), or 0
// when there is none. It scans /proc: NSpid lists a process's pid in each
// namespace from this one inwards.
func hostPID(init, nspid int) int {
	if init <= 0 || nspid <= 0 {
		return 0
	}
	if nspid == 1 {
		return init
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", init))
	if err != nil {
		return 0
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || l != ns {
			continue
		}
		if ids := nsPIDs(pid); len(ids) >= 2 && ids[len(ids)-1] == nspid {
			return pid
		}
	}
	return 0
}

// nsPIDs returns the NSpid line of /proc/PID/status.
func nsPIDs(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "NSpid:")
		if !ok {
			continue
		}
		var ids []int
		for _, f := range strings.Fields(rest) {
			n, err := strconv.Atoi(f)
			if err != nil {
				return nil
			}
			ids = append(ids, n)
		}
		return ids
	}
	return nil
}
