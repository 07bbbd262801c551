package guestctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/libvirttest"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// guestDir holds the vmgate-guest builds TestMain makes.
var guestDir string

// labVMs: one guest with cgroup v2 mounted, one without (marker tracking),
// both with the resident helper's port; and one without the port, whose
// helper commands take the per-command road (the fallback).
var labVMs = []string{"cg", "nocg", "noport"}

func TestMain(m *testing.M) {
	// The test binary doubles as the QEMU driver's plugin (files_kill_vm_test.go).
	if len(os.Args) > 2 && os.Args[1] == "plugin" {
		if err := pluginhost.ServeBuiltin(pluginhost.Registered(), os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "vmgate-guest-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper test:", err)
		os.Exit(2)
	}
	guestDir = dir
	code := func() int {
		defer os.RemoveAll(dir)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, FileName("amd64")), "github.com/vmgate/vmgate/cmd/vmgate-guest")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "helper test: building vmgate-guest: %v\n%s", err, out)
			return 2
		}
		// A libvirt domain for the file commands through libvirt
		// (files_backends_vm_test.go) and the roads' conformance
		// (conformance_vm_test.go), with the helper's port; it boots
		// only when a test asks.
		libvirttest.Register(libvirttest.Spec{Name: libvirtVM, MemoryMiB: 512, HelperPort: true})
		code := labtest.Main(m,
			lab.Spec{Name: "cg", MemoryMB: 512}, // 512: the 64 MiB file tests hold it twice in tmpfs
			lab.Spec{Name: "nocg", Cmdline: map[string]string{"CGROUP2": "0"}},
			lab.Spec{Name: "noport", NoHelperPort: true},
		)
		if err := libvirttest.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "libvirttest.Stop:", err)
			code = max(code, 1)
		}
		return code
	}()
	os.Exit(code)
}

// labHelper boots (or reuses) the named lab VM and returns a Helper over
// the real QEMU driver, with a push counter.
func labHelper(t testing.TB, name string) (*Helper, *atomic.Int32) {
	t.Helper()
	v := labtest.VM(t, name)
	d, err := qemu.New(qemu.Config{LabDir: filepath.Dir(v.Dir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("qemu.New() = %v; want nil", err)
	}
	t.Cleanup(func() { d.Close() })
	h := New(d, &DirBinaries{Dirs: []string{guestDir}})
	var pushes atomic.Int32
	h.pushHook = func(string) { pushes.Add(1) }
	return h, &pushes
}

// testCtx bounds a lab call by d, scaled with the machine's load.
func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := testload.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// sh runs a shell line in the guest straight through the driver (not the helper).
func sh(t testing.TB, ctx context.Context, h *Helper, vm, line string) hypervisor.ExecResult {
	t.Helper()
	return shWithin(t, ctx, h, vm, line, time.Minute)
}

// shWithin is sh with its own timeout in the guest, for setup that moves
// much data (a TCG guest on a loaded machine takes minutes for 64 MiB).
func shWithin(t testing.TB, ctx context.Context, h *Helper, vm, line string, timeout time.Duration) hypervisor.ExecResult {
	t.Helper()
	res, err := hypervisor.Run(ctx, h.d, vm, hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", line}, Timeout: timeout})
	if err != nil {
		t.Fatalf("sh %q on %s: %v", line, vm, err)
	}
	return res
}

// matching returns the ps rows whose cmdline contains s.
func matching(t testing.TB, ctx context.Context, h *Helper, vm, session, s string) []Process {
	t.Helper()
	ps, err := h.PS(ctx, vm, session)
	if err != nil {
		t.Fatalf("PS(%s, %q) = %v; want nil", vm, session, err)
	}
	var out []Process
	for _, p := range ps {
		if strings.Contains(p.Cmdline, s) {
			out = append(out, p)
		}
	}
	return out
}

func newSession(t testing.TB, ctx context.Context, h *Helper, vm string) Session {
	t.Helper()
	s, err := h.SessionCreate(ctx, vm, SessionCreate{ID: NewSessionID(), TTLS: 3600})
	if err != nil {
		t.Fatalf("SessionCreate(%s) = %v; want nil", vm, err)
	}
	t.Cleanup(func() { _, _ = h.SessionDestroy(context.Background(), vm, s.ID) })
	return s
}

func wantTracking(vm string) wire.Tracking {
	if vm == "nocg" {
		return wire.TrackMarker
	}
	return wire.TrackCgroup
}

func TestLabPushMissingAndChanged(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, pushes := labHelper(t, vm)
			ctx := testCtx(t, 3*time.Minute)
			// A resident helper (an earlier test's) would serve without
			// its binary: end it, so that the helper must start again.
			endResident(t, ctx, h, vm)
			sh(t, ctx, h, vm, "rm -f "+GuestPath)
			if _, err := h.PS(ctx, vm, ""); err != nil {
				t.Fatalf("PS with the helper missing = %v; want nil (pushed)", err)
			}
			if got := pushes.Load(); got != 1 {
				t.Errorf("pushes after first use = %d; want 1", got)
			}
			bin, err := h.bins.Binary("amd64")
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Fields(string(sh(t, ctx, h, vm, "sha256sum "+GuestPath).Stdout)); len(got) == 0 || got[0] != bin.SHA256 {
				t.Errorf("guest sha256 = %v; want %s", got, bin.SHA256)
			}
			// Cached: a second call does not check again.
			if _, err := h.PS(ctx, vm, ""); err != nil || pushes.Load() != 1 {
				t.Errorf("second PS = %v, pushes %d; want nil, 1", err, pushes.Load())
			}
			// Changed helper: garbage in place (renamed over it: a running
			// resident helper keeps the file busy for writing); a new Helper
			// (fresh cache) replaces it.
			if err := h.d.FileWrite(ctx, vm, GuestPath+".garbage", []byte("#!/bin/sh\necho garbage\n"), 0o755); err != nil {
				t.Fatalf("FileWrite garbage = %v", err)
			}
			sh(t, ctx, h, vm, "mv -f "+GuestPath+".garbage "+GuestPath)
			h.Forget(vm)
			if err := h.Ensure(ctx, vm); err != nil {
				t.Fatalf("Ensure over garbage = %v; want nil", err)
			}
			if got := pushes.Load(); got != 2 {
				t.Errorf("pushes after garbage = %d; want 2", got)
			}
			if got := strings.Fields(string(sh(t, ctx, h, vm, "sha256sum "+GuestPath).Stdout)); len(got) == 0 || got[0] != bin.SHA256 {
				t.Errorf("guest sha256 after replace = %v; want %s", got, bin.SHA256)
			}
			if out := sh(t, ctx, h, vm, "ls /usr/local/bin").Stdout; strings.Contains(string(out), ".tmp-") {
				t.Errorf("temporary push files left: %q", out)
			}
			// Removed behind the cache's back (and the resident helper
			// gone): the failure re-pushes.
			endResident(t, ctx, h, vm)
			sh(t, ctx, h, vm, "rm -f "+GuestPath)
			if _, err := h.SessionList(ctx, vm); err != nil {
				t.Fatalf("SessionList after removal = %v; want nil (re-pushed)", err)
			}
			if got := pushes.Load(); got != 3 {
				t.Errorf("pushes after removal = %d; want 3", got)
			}
		})
	}
}

func TestLabDestroyDaemonized(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 3*time.Minute)
			s := newSession(t, ctx, h, vm)
			if s.Tracking != wantTracking(vm) {
				t.Errorf("Tracking = %q; want %q", s.Tracking, wantTracking(vm))
			}
			res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, TimeoutMS: 20000,
				Shell: `echo data > file; setsid sh -c "sleep 1010 &" ; sleep 1011 &`})
			if err != nil || res.ExitCode != 0 || res.TimedOut {
				t.Fatalf("Run = %+v, %v; want exit 0", res, err)
			}
			if got := len(matching(t, ctx, h, vm, s.ID, "sleep 101")); got != 2 {
				t.Fatalf("session sleeps before destroy = %d; want 2", got)
			}
			d, err := h.SessionDestroy(ctx, vm, s.ID)
			if err != nil || !d.Existed || d.Killed < 2 {
				t.Fatalf("SessionDestroy = %+v, %v; want existed, killed >= 2", d, err)
			}
			if got := matching(t, ctx, h, vm, "", "sleep 101"); len(got) != 0 {
				t.Errorf("processes left after destroy: %+v", got)
			}
			if out := sh(t, ctx, h, vm, "ls -A "+filepath.Dir(s.Workdir)+"; ls /var/lib/vmgate/meta; ls /sys/fs/cgroup/vmgate 2>/dev/null").Stdout; strings.Contains(string(out), s.ID) {
				t.Errorf("files of %s left after destroy: %q", s.ID, out)
			}
			d2, err := h.SessionDestroy(ctx, vm, s.ID)
			if err != nil || d2.Existed {
				t.Errorf("second SessionDestroy = %+v, %v; want existed false, nil", d2, err)
			}
			if _, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Argv: []string{"true"}}); !errors.Is(err, ErrNotFound) {
				t.Errorf("Run in destroyed session = %v; want ErrNotFound", err)
			}
		})
	}
}

func TestLabDestroySymlinks(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 3*time.Minute)
			before := string(sh(t, ctx, h, vm, "ls -A /etc | wc -l; ls -A / | wc -l").Stdout)
			s := newSession(t, ctx, h, vm)
			if _, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: "ln -s /etc etc && ln -s / root && mkdir d && ln -s /etc d/etc2 && echo x > d/f"}); err != nil {
				t.Fatalf("Run = %v", err)
			}
			if _, err := h.SessionDestroy(ctx, vm, s.ID); err != nil {
				t.Fatalf("SessionDestroy = %v", err)
			}
			after := string(sh(t, ctx, h, vm, "ls -A /etc | wc -l; ls -A / | wc -l").Stdout)
			if after != before || strings.TrimSpace(before) == "" {
				t.Errorf("/etc and / entries after destroy = %q; want %q", after, before)
			}
			if res := sh(t, ctx, h, vm, "test -e "+s.Workdir+" || test -L "+s.Workdir); res.ExitCode == 0 {
				t.Errorf("workdir %s still exists", s.Workdir)
			}
		})
	}
}

func TestLabRunTimeoutKillsTree(t *testing.T) {
	for _, vm := range labVMs {
		for _, inSession := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/session=%v", vm, inSession), func(t *testing.T) {
				h, _ := labHelper(t, vm)
				ctx := testCtx(t, 3*time.Minute)
				req := RunRequest{TimeoutMS: 2000, Shell: `trap "" TERM; echo before; echo err >&2; ` +
					`(trap "" TERM; sleep 1020) & setsid sh -c 'trap "" TERM; sleep 1021 & sleep 1022' & sleep 1023`}
				if inSession {
					req.Session = newSession(t, ctx, h, vm).ID
				}
				res, err := h.Run(ctx, vm, req)
				if err != nil {
					t.Fatalf("Run = %v", err)
				}
				if !res.TimedOut || string(res.Stdout) != "before\n" || string(res.Stderr) != "err\n" {
					t.Errorf("Run = timed_out %v, stdout %q, stderr %q; want true, %q, %q", res.TimedOut, res.Stdout, res.Stderr, "before\n", "err\n")
				}
				if res.Killed < 4 {
					t.Errorf("Run killed %d processes; want at least 4", res.Killed)
				}
				if got := matching(t, ctx, h, vm, "", "sleep 102"); len(got) != 0 {
					t.Errorf("processes left after the timeout: %+v", got)
				}
			})
		}
	}
}

func TestLabRunOutputCap(t *testing.T) {
	h, _ := labHelper(t, "cg")
	ctx := testCtx(t, 2*time.Minute)
	res, err := h.Run(ctx, "cg", RunRequest{Argv: []string{"sh", "-c", "i=0; while [ $i -lt 100 ]; do echo 0123456789; i=$((i+1)); done; exit 3"}, MaxOutputBytes: 25, Stdin: []byte("in")})
	if err != nil || res.ExitCode != 3 || len(res.Stdout) != 25 || !res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("Run = %+v, %v; want exit 3, 25 bytes, stdout truncated", res, err)
	}
	res, err = h.Run(ctx, "cg", RunRequest{Argv: []string{"cat"}, Stdin: []byte("hello"), Env: map[string]string{"A": "b"}, Cwd: "/tmp"})
	if err != nil || string(res.Stdout) != "hello" {
		t.Errorf("Run(cat) = %q, %v; want %q", res.Stdout, err, "hello")
	}
}

func TestLabKillGuards(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 3*time.Minute)
			ps, err := h.PS(ctx, vm, "")
			if err != nil {
				t.Fatalf("PS = %v", err)
			}
			qga := -1
			for _, p := range ps {
				if p.Name == "qemu-ga" {
					qga = int(p.PID)
				}
			}
			if qga < 0 {
				t.Fatalf("no qemu-ga in ps %+v", ps)
			}
			// Every guard is the guest's: the host passes these on.
			for _, tt := range []struct {
				pid    int
				reason string
			}{{1, wire.ReasonInit}, {2, wire.ReasonKernelThread}, {qga, wire.ReasonGuestAgent}} {
				_, err := h.Kill(ctx, vm, tt.pid, "KILL", 0)
				var e *Error
				if !errors.As(err, &e) || !errors.Is(err, ErrRefused) || e.Reason != tt.reason {
					t.Errorf("Kill(%d) = %v; want refused %q", tt.pid, err, tt.reason)
				}
			}
			var e *Error
			s := newSession(t, ctx, h, vm)
			if _, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: "sleep 1030 &"}); err != nil {
				t.Fatalf("Run = %v", err)
			}
			sl := matching(t, ctx, h, vm, s.ID, "sleep 1030")
			if len(sl) != 1 {
				t.Fatalf("session sleeps = %+v; want 1", sl)
			}
			p := sl[0]
			if _, err := h.Kill(ctx, vm, int(p.PID), "TERM", p.StartedAt-1000); !errors.As(err, &e) || e.Reason != wire.ReasonPidReused {
				t.Errorf("Kill with stale started_at = %v; want refused %q", err, wire.ReasonPidReused)
			}
			if got := matching(t, ctx, h, vm, s.ID, "sleep 1030"); len(got) != 1 {
				t.Fatalf("refused kill changed the process: %+v", got)
			}
			kr, err := h.Kill(ctx, vm, int(p.PID), "TERM", p.StartedAt)
			if err != nil || !kr.Exited {
				t.Errorf("Kill(sleep) = %+v, %v; want exited", kr, err)
			}
			if got := matching(t, ctx, h, vm, "", "sleep 1030"); len(got) != 0 {
				t.Errorf("sleep still there after kill: %+v", got)
			}
		})
	}
}
