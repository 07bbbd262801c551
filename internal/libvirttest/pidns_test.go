package libvirttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// childEnv makes the test binary the killed child of
// TestKilledRunLeavesNoQEMU: its value is the path of the report to write.
const childEnv = "VMGATE_LIBVIRTTEST_KILLED_CHILD"

func TestMain(m *testing.M) {
	if report := os.Getenv(childEnv); report != "" {
		os.Exit(killedChild(report))
	}
	os.Exit(m.Run())
}

// childReport is what the child writes once its domain runs.
type childReport struct {
	Dir     string `json:"dir"`
	Wrapper int    `json:"wrapper"` // libvirtd's unshare wrapper
	QEMU    int    `json:"qemu"`
	Cgroup  string `json:"cgroup"` // QEMU's cgroup, from /proc/PID/cgroup
}

// killedChild starts daemons, boots a domain, reports and then waits to be
// killed. Its exit code says why it did not get that far.
func killedChild(report string) int {
	ctx, cancel := testload.WithTimeout(context.Background(), ReadyTimeout+BootTimeout)
	defer cancel()
	d, err := StartDaemons(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	dom, err := d.Boot(ctx, Spec{Name: Name("killed")}, os.Getenv(childEnv+"_KERNEL"), os.Getenv(childEnv+"_INITRD"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err, d.Close())
		return 3
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", dom.QEMUPID))
	_, wrapper := d.Pids()
	b, _ := json.Marshal(childReport{Dir: d.Dir, Wrapper: wrapper, QEMU: dom.QEMUPID, Cgroup: strings.TrimSpace(string(cg))})
	if err := os.WriteFile(report+".tmp", b, 0o600); err != nil || os.Rename(report+".tmp", report) != nil {
		fmt.Fprintln(os.Stderr, "report:", err, d.Close())
		return 4
	}
	select {} // until killed
}

// TestKilledRunLeavesNoQEMU: a test process killed with SIGKILL after its
// libvirtd started a domain takes libvirtd and the domain's QEMU with it
// (libvirtd's PID namespace, pidns.go). The child is this test binary.
func TestKilledRunLeavesNoQEMU(t *testing.T) {
	Require(t)
	img := labtest.Image(t)
	report := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+report, childEnv+"_KERNEL="+img.Kernel, childEnv+"_INITRD="+img.Initrd)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	var rep childReport
	ctx, cancel := testload.WithTimeout(context.Background(), ReadyTimeout+BootTimeout)
	defer cancel()
	for rep.QEMU == 0 {
		if b, err := os.ReadFile(report); err == nil {
			if err := json.Unmarshal(b, &rep); err != nil || rep.QEMU <= 0 || rep.Wrapper <= 0 {
				t.Fatalf("child's report %s = %+v, %v; want the pids of QEMU and libvirtd's wrapper", b, rep, err)
			}
			break
		}
		select {
		case <-exited:
			t.Fatalf("the child exited before its domain ran: %v\n%s", waitErr, out)
		case <-ctx.Done():
			t.Fatalf("the child's domain did not run: %v\n%s", context.Cause(ctx), out)
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Cleanup(func() { os.RemoveAll(rep.Dir) }) // the child could not remove it
	if !strings.Contains(cmdline(rep.QEMU), "qemu-system") {
		t.Fatalf("pid %d's command line = %q; want the domain's QEMU", rep.QEMU, cmdline(rep.QEMU))
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	for _, p := range []struct {
		what string
		pid  int
	}{{"the domain's QEMU", rep.QEMU}, {"libvirtd's wrapper", rep.Wrapper}} {
		// Gone means reaped (ESRCH): a zombie still holds its cgroup.
		for !errors.Is(syscall.Kill(p.pid, 0), syscall.ESRCH) {
			select {
			case <-ctx.Done():
				t.Fatalf("after the test process's SIGKILL, %s (pid %d: %q) still runs", p.what, p.pid, cmdline(p.pid))
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	removeCgroup(t, rep.Cgroup)
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// removeCgroup removes the (now empty) cgroups libvirt made for the killed
// domain, since nobody else will: in every cgroup hierarchy mounted (v2,
// and v1 ones on a hybrid host), the domain's directory
// (/machine/qemu-N-NAME.libvirt-qemu, or a machine-….scope under
// systemd) and everything below it, leaves first. cgroups is QEMU's
// /proc/PID/cgroup.
func removeCgroup(t *testing.T, cgroups string) {
	domains := map[string]bool{}
	for _, line := range strings.Split(cgroups, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		p := f[2]
		for _, mark := range []string{".libvirt-qemu", ".scope"} {
			if i := strings.Index(p, mark); i > 0 {
				domains[p[:i+len(mark)]] = true
				break
			}
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || (f[2] != "cgroup" && f[2] != "cgroup2") {
			continue
		}
		for d := range domains {
			var dirs []string
			filepath.WalkDir(filepath.Join(f[1], d), func(p string, e os.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
					t.Errorf("rmdir %s: %v", dirs[i], err)
				}
			}
		}
	}
}
