package libvirttest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// RequireEnv is the environment variable that turns skips into failures.
const RequireEnv = labtest.RequireEnv

// mu guards every variable below.
var (
	mu       sync.Mutex
	specs    []Spec
	started  bool
	daemons  *Daemons
	startErr error
	bootErrs = map[string]error{}
)

// runID is drawn once per test binary: six characters of [a-z2-7].
var runID = sync.OnceValue(func() string { return strings.ToLower(rand.Text()[:6]) })

// Name returns base followed by "-" and this test binary's run id, for a
// domain name. Domains need names of their own per run, not only per
// libvirtd: libvirt names a domain's cgroup after it
// (machine/qemu-ID-NAME.libvirt-qemu, the ID counting from 1 in every
// daemon), and the cgroup tree is the host's, shared by every daemon.
// base must leave room for the 7 characters added (Spec.Validate allows 48).
func Name(base string) string { return base + "-" + runID() }

// Available reports whether the daemons can run here, and why not.
func Available() (bool, string) {
	for _, b := range []string{LibvirtdBinary, VirtlogdBinary} {
		if _, err := exec.LookPath(b); err != nil {
			return false, b + " is not on PATH"
		}
	}
	if os.Geteuid() != 0 {
		return false, "libvirttest runs a root libvirtd in a mount namespace of its own, which needs root"
	}
	return true, ""
}

// Require skips t when the daemons cannot run here, or fails it when
// RequireEnv is set.
func Require(t testing.TB) {
	t.Helper()
	if ok, why := Available(); !ok {
		if v := os.Getenv(RequireEnv); v != "" {
			t.Fatalf("%s=%s but %s", RequireEnv, v, why)
		}
		t.Skipf("%s (set %s=1 to make this a failure)", why, RequireEnv)
	}
}

// Main registers specs, runs the tests and then stops the daemons and
// their domains. It returns the exit code for os.Exit. Packages that also
// use labtest.Main call Register before it and Stop after it instead.
func Main(m *testing.M, domainSpecs ...Spec) int {
	Register(domainSpecs...)
	code := m.Run()
	if err := Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "libvirttest:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Register declares the domains Env boots. Call it from TestMain before
// the tests run.
func Register(domainSpecs ...Spec) {
	mu.Lock()
	defer mu.Unlock()
	specs = append(specs, domainSpecs...)
}

// Env returns the shared daemons with every registered domain booted,
// starting them on the first call (the lab image comes from labtest.Image).
// It applies the skip rule, and fails t when a daemon or a domain did not
// come up.
func Env(t testing.TB) *Daemons {
	t.Helper()
	Require(t)
	img := labtest.Image(t)
	mu.Lock()
	defer mu.Unlock()
	if !started {
		started = true
		startLocked(img.Kernel, img.Initrd)
	}
	if startErr != nil {
		t.Fatalf("libvirttest: %v", startErr)
	}
	for _, s := range specs {
		if err := bootErrs[s.Name]; err != nil {
			t.Fatalf("libvirttest: %v", err)
		}
	}
	return daemons
}

// startLocked starts the daemons and boots every spec in parallel.
func startLocked(kernel, initrd string) {
	for _, s := range specs {
		if err := s.Validate(); err != nil {
			startErr = err
			return
		}
	}
	ctx, cancel := testload.WithTimeout(context.Background(), ReadyTimeout+BootTimeout)
	defer cancel()
	daemons, startErr = StartDaemons(ctx, nil)
	if startErr != nil {
		return
	}
	var wg sync.WaitGroup
	errs := make([]error, len(specs))
	for i, s := range specs {
		wg.Go(func() {
			_, errs[i] = daemons.Boot(ctx, s, kernel, initrd)
		})
	}
	wg.Wait()
	for i, s := range specs {
		if errs[i] != nil {
			bootErrs[s.Name] = errs[i]
		}
	}
}

// Stop destroys the registered domains and stops the daemons (see
// Daemons.Close). It is safe to call when Env never ran.
func Stop() error {
	mu.Lock()
	defer mu.Unlock()
	if daemons == nil {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- daemons.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(testload.Scale(2 * time.Minute)):
		return errors.New("libvirttest: stopping the daemons took over 2 minutes (scaled by the machine's load)")
	}
}

// Current returns the shared daemons when Env has started them, else nil.
func Current() *Daemons {
	mu.Lock()
	defer mu.Unlock()
	return daemons
}
