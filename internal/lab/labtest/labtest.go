// Package labtest boots lab VMs once per test package:
//
//	func TestMain(m *testing.M) {
//		os.Exit(labtest.Main(m, lab.Spec{Name: "t1"},
//			lab.Spec{Name: "noexec", Cmdline: map[string]string{"QGA_BLOCK": "guest-exec"}}))
//	}
//
//	func TestSomething(t *testing.T) {
//		vm := labtest.VM(t, "t1") // skips or fails per the rule below
//		...
//	}
//
// The VMs boot in parallel, on the first call to VM (so a -run that selects
// no VM test boots nothing), in a temporary state directory, from the image
// cached in the real state directory (lab.DefaultStateDir), so the image is
// built once per machine. Main stops every VM by pid after the tests. QEMU
// runs in the foreground with Pdeathsig, so a test binary that panics or
// times out takes its VMs with it.
//
// The rule: when qemu-system-x86_64 is not on PATH, VM skips the test
// unless VMGATE_REQUIRE_VM is set, in which case it fails; a VM that failed
// to boot always fails the test.
package labtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/image"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/testload"
)

// BootTimeout bounds building the image and booting all VMs on an idle
// machine; the wait scales with the machine's load (package testload).
const BootTimeout = 4 * time.Minute

// RequireEnv is the environment variable that turns skips into failures.
const RequireEnv = "VMGATE_REQUIRE_VM"

// mu guards every variable below after Main has set specs.
var (
	mu       sync.Mutex
	mainRan  bool
	specs    []lab.Spec
	booted   bool
	stateDir string
	img      *image.Image
	imgErr   error
	vms      = map[string]*lab.VM{}
	bootErrs = map[string]error{}
	extra    []*lab.VM // started by Start, stopped by Main as a backstop
)

// Main runs the tests of a package whose TestMain declares lab VMs, then
// stops every VM and removes the temporary state directory. It returns
// the exit code for os.Exit.
func Main(m *testing.M, vmSpecs ...lab.Spec) int {
	mu.Lock()
	mainRan = true
	specs = vmSpecs
	mu.Unlock()
	defer cleanup()
	return m.Run()
}

func cleanup() {
	mu.Lock()
	defer mu.Unlock()
	all := append([]*lab.VM{}, extra...)
	for _, v := range vms {
		all = append(all, v)
	}
	for _, v := range all {
		ctx, cancel := testload.WithTimeout(context.Background(), 10*time.Second)
		if err := v.Stop(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "labtest: %v\n", err)
		}
		cancel()
	}
	if stateDir != "" {
		os.RemoveAll(stateDir)
	}
}

// Available reports whether lab VMs can run here, and why not.
func Available() (bool, string) {
	if _, err := exec.LookPath(lab.QEMUBinary); err != nil {
		return false, lab.QEMUBinary + " is not on PATH"
	}
	if _, err := exec.LookPath(lab.QEMUImgBinary); err != nil {
		return false, lab.QEMUImgBinary + " is not on PATH (Debian package qemu-utils)"
	}
	return true, ""
}

// RequireQEMU skips t when QEMU is absent, or fails it when RequireEnv is set.
func RequireQEMU(t testing.TB) {
	t.Helper()
	if ok, why := Available(); !ok {
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("%s=%s but %s", RequireEnv, os.Getenv(RequireEnv), why)
		}
		t.Skipf("%s (set %s=1 to make this a failure)", why, RequireEnv)
	}
}

// VM returns the running VM named in Main's specs, booting all of them on
// the first call.
func VM(t testing.TB, name string) *lab.VM {
	t.Helper()
	RequireQEMU(t)
	mu.Lock()
	defer mu.Unlock()
	if !mainRan {
		t.Fatalf("labtest.VM(%q): TestMain must call labtest.Main", name)
	}
	if !booted {
		booted = true
		bootLocked()
	}
	if err := bootErrs[name]; err != nil {
		t.Fatalf("labtest.VM(%q): %v", name, err)
	}
	v, ok := vms[name]
	if !ok {
		t.Fatalf("labtest.VM(%q): not declared in labtest.Main (have %v)", name, namesLocked())
	}
	select {
	case <-v.Done():
		t.Fatalf("labtest.VM(%q): qemu (pid %d) has exited; see %s", name, v.PID, v.SerialLog)
	default:
	}
	return v
}

// Image returns the lab image the VMs boot, building it on first use.
func Image(t testing.TB) image.Image {
	t.Helper()
	RequireQEMU(t)
	mu.Lock()
	defer mu.Unlock()
	ctx, cancel := testload.WithTimeout(context.Background(), BootTimeout)
	defer cancel()
	if err := imageLocked(ctx); err != nil {
		t.Fatalf("labtest: %v", err)
	}
	return *img
}

// Start boots one more VM for t alone (in the package's temporary state
// directory, from the shared image) and stops it when t ends. Use it for
// tests that power a VM off or reboot it.
func Start(t testing.TB, spec lab.Spec) *lab.VM {
	t.Helper()
	im := Image(t)
	mu.Lock()
	spec.StateDir, spec.Image = stateDir, &im
	mu.Unlock()
	ctx, cancel := testload.WithTimeout(context.Background(), BootTimeout)
	defer cancel()
	v, err := lab.Start(ctx, spec)
	if err != nil {
		t.Fatalf("labtest.Start(%q): %v", spec.Name, err)
	}
	mu.Lock()
	extra = append(extra, v)
	mu.Unlock()
	t.Cleanup(func() {
		ctx, cancel := testload.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := v.Stop(ctx); err != nil {
			t.Errorf("labtest: %v", err)
		}
	})
	return v
}

// imageLocked builds or finds the image and creates the temporary state
// directory. The image lives in the real state directory so it is built
// once per machine; if that is not writable, in the temporary one.
func imageLocked(ctx context.Context) error {
	if img != nil || imgErr != nil {
		return imgErr
	}
	if stateDir == "" {
		d, err := os.MkdirTemp("", "vmgate-lab-")
		if err != nil {
			imgErr = fmt.Errorf("state dir: %w", err)
			return imgErr
		}
		stateDir = d
	}
	real, err := lab.DefaultStateDir()
	if err == nil {
		err = os.MkdirAll(real, lab.DirMode)
	}
	if err != nil {
		real = stateDir
	}
	built, err := image.Build(ctx, image.Options{StateDir: real})
	if err != nil {
		imgErr = fmt.Errorf("build image: %w", err)
		return imgErr
	}
	img = &built
	return nil
}

// bootLocked boots every spec in parallel.
func bootLocked() {
	ctx, cancel := testload.WithTimeout(context.Background(), BootTimeout)
	defer cancel()
	if err := imageLocked(ctx); err != nil {
		for _, s := range specs {
			bootErrs[s.Name] = err
		}
		return
	}
	type result struct {
		name string
		vm   *lab.VM
		err  error
	}
	results := make(chan result, len(specs))
	seen := map[string]bool{}
	n := 0
	for _, s := range specs {
		if seen[s.Name] {
			bootErrs[s.Name] = errors.New("declared twice in labtest.Main")
			continue
		}
		seen[s.Name] = true
		s.StateDir, s.Image, s.Daemonize = stateDir, img, false
		n++
		go func() {
			v, err := lab.Start(ctx, s)
			results <- result{s.Name, v, err}
		}()
	}
	for range n {
		r := <-results
		if r.err != nil {
			bootErrs[r.name] = r.err
			continue
		}
		vms[r.name] = r.vm
		fmt.Fprintf(os.Stderr, "labtest: %s booted in %.1fs\n", r.name, r.vm.BootTime.Seconds())
	}
}

func namesLocked() []string {
	var ns []string
	for _, s := range specs {
		ns = append(ns, s.Name)
	}
	sort.Strings(ns)
	return ns
}
