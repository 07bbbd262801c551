package pluginhost

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// The test binary is also the plugin: Options.Executable is os.Args[0] with
// the default BuiltinArgs ("plugin", NAME), as `vmgate plugin NAME` would be.
// "hold-plugin" makes it a server that launches a plugin and blocks (for the
// server-killed test).
func TestMain(m *testing.M) {
	if len(os.Args) >= 3 && os.Args[1] == "plugin" {
		if err := ServeBuiltin(testRegistry(), os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if len(os.Args) >= 2 && os.Args[1] == "hold-plugin" {
		holdPlugin()
		return
	}
	os.Exit(labtest.Main(m, lab.Spec{Name: "t1"},
		lab.Spec{Name: "noexec", Cmdline: map[string]string{"QGA_BLOCK": "guest-exec"}}))
}

// testRegistry is the registered drivers of this test binary: the QEMU
// driver plus "sleepy", a fake driver whose commands are `sleep SECONDS`
// (run through ExecStart/ExecStatus inside the plugin), whose one VM is
// named by its settings ({"name": "x"}), and whose VM info reports what the
// plugin process sees of its stdin and environment.
func testRegistry() Registry { return Registered() }

func init() {
	registry.Register("sleepy", newSleepy)
	registry.Register("counting", newCounting)
}

// countingSettings are the counting fake driver's settings: none.
type countingSettings struct{}

func (*countingSettings) Validate() error { return nil }

// newCounting is a fake driver with one VM, vm1, that numbers the calls
// that reach it: Status's Detail and ListVMs's Info are "pid:n" for the
// n-th call to reach this plugin process. Power, FileWrite, FileRead, a
// disk-only snapshot's create, revert and delete, CreateVM and DeleteVM
// succeed (and count too).
func newCounting(context.Context, *countingSettings) (hypervisor.Driver, error) {
	var n atomic.Int64
	next := func() string { return strconv.Itoa(os.Getpid()) + ":" + strconv.FormatInt(n.Add(1), 10) }
	return &hypervisortest.Fake{
		ListVMsFunc: func(context.Context) ([]hypervisor.VM, error) {
			return []hypervisor.VM{{Name: "vm1", State: hypervisor.StateRunning, Info: next()}}, nil
		},
		StatusFunc: func(_ context.Context, vm string) (hypervisor.Status, error) {
			if vm != "vm1" {
				next()
				return hypervisor.Status{}, fmt.Errorf("counting: %w: %q", hypervisor.ErrUnknownVM, vm)
			}
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning, Detail: next()}, nil
		},
		PowerFunc:     func(context.Context, string, hypervisor.PowerAction) error { next(); return nil },
		FileWriteFunc: func(context.Context, string, string, []byte, uint32) error { next(); return nil },
		FileReadFunc: func(context.Context, string, string, int64) (hypervisor.FileContent, error) {
			return hypervisor.FileContent{Data: []byte(next())}, nil
		},
		SnapshotCreateFunc: func(_ context.Context, _ string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
			next()
			return hypervisor.Snapshot{Name: req.Name}, nil
		},
		SnapshotListFunc: func(context.Context, string) ([]hypervisor.Snapshot, error) {
			return []hypervisor.Snapshot{{Name: "s1", ID: "fake:s1"}}, nil
		},
		SnapshotRevertFunc: func(context.Context, string, string) error { next(); return nil },
		SnapshotDeleteFunc: func(context.Context, string, string) error { next(); return nil },
		Modes:              hypervisor.SnapshotModes{DiskOnly: true},
		CreateVMFunc: func(_ context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
			next()
			return hypervisor.CreatedVM{Name: req.Name}, nil
		},
		DeleteVMFunc: func(context.Context, hypervisor.DeleteRequest) error { next(); return nil },
	}, nil
}

// sleepySettings are the fake driver's settings.
type sleepySettings struct {
	Name string `json:"name"`
}

func (s *sleepySettings) Validate() error {
	if s.Name == "" {
		return registry.Fieldf("name", "required")
	}
	return nil
}

func newSleepy(_ context.Context, c *sleepySettings) (hypervisor.Driver, error) {
	stdin, _ := os.Readlink("/proc/self/fd/0")
	info := "stdin=" + stdin + " secret=" + os.Getenv("VMGATE_TEST_SECRET")
	slog.Warn("sleepy configured", "name", c.Name)
	var mu sync.Mutex
	ends := map[string]time.Time{}
	known := func(vm string) error {
		if vm != c.Name {
			return fmt.Errorf("sleepy: %w: %q", hypervisor.ErrUnknownVM, vm)
		}
		return nil
	}
	return &hypervisortest.Fake{
		ListVMsFunc: func(context.Context) ([]hypervisor.VM, error) {
			return []hypervisor.VM{{Name: c.Name, State: hypervisor.StateRunning, Info: info}}, nil
		},
		StatusFunc: func(_ context.Context, vm string) (hypervisor.Status, error) {
			if err := known(vm); err != nil {
				return hypervisor.Status{}, err
			}
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning, Detail: "pid " + strconv.Itoa(os.Getpid())}, nil
		},
		ExecStartFunc: func(_ context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			if err := known(vm); err != nil {
				return hypervisor.ExecHandle{}, err
			}
			if len(req.Argv) != 2 || req.Argv[0] != "sleep" {
				return hypervisor.ExecHandle{}, fmt.Errorf("sleepy: %w: want [sleep SECONDS]", hypervisor.ErrInvalidArgument)
			}
			secs, err := strconv.ParseFloat(req.Argv[1], 64)
			if err != nil {
				return hypervisor.ExecHandle{}, fmt.Errorf("sleepy: %w: %w", hypervisor.ErrInvalidArgument, err)
			}
			slog.Warn("sleepy exec started", "argv", req.Argv) // tests wait for this line in the host's log
			mu.Lock()
			defer mu.Unlock()
			tok := strconv.Itoa(len(ends) + 1)
			ends[tok] = time.Now().Add(time.Duration(secs * float64(time.Second)))
			return hypervisor.ExecHandle{PID: int64(len(ends)), Token: tok, StartedAt: time.Now()}, nil
		},
		ExecStatusFunc: func(_ context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			mu.Lock()
			end, ok := ends[h.Token]
			mu.Unlock()
			if !ok {
				return hypervisor.ExecResult{}, fmt.Errorf("sleepy: %w", hypervisor.ErrUnknownExec)
			}
			done := !time.Now().Before(end)
			res := hypervisor.ExecResult{PID: h.PID, Exited: done}
			if done {
				res.Stdout = []byte("slept\n")
			}
			return res, nil
		},
	}, nil
}

// holdPlugin is the body of the "hold-plugin" helper process: launch a
// plugin, print its pid, block until killed.
func holdPlugin() {
	h := New(Options{Executable: os.Args[0], Registry: testRegistry()})
	d, err := h.Launch(context.Background(), Spec{Driver: "sleepy", Config: []byte(`{"name":"held"}`)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "hold-plugin:", err)
		os.Exit(2)
	}
	fmt.Printf("pid %d\n", d.(*Supervisor).PID())
	select {}
}

// logBuffer is a slog destination tests can read; mu guards buf.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newTestHost returns a Host whose built-ins are this test binary, logging
// into the returned buffer (and the test log on failure), closed at cleanup.
func newTestHost(t *testing.T, opts Options) (*Host, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if opts.Executable == "" {
		opts.Executable = os.Args[0]
	}
	if opts.Registry == nil {
		opts.Registry = testRegistry()
	}
	h := New(opts)
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Host.Close() = %v", err)
		}
		if t.Failed() {
			t.Logf("host log:\n%s", logs.String())
		}
	})
	return h, logs
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// waitLog waits until the host's log holds want (a plugin's stderr reaches
// it), bounded by a minute; it fails the test otherwise.
func waitLog(t *testing.T, logs *logBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(testload.Scale(time.Minute))
	var b hypervisor.Backoff
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the host log never said %q:\n%s", want, logs.String())
		}
		time.Sleep(b.Next())
	}
}

// waitGone waits up to d for pid to be gone.
func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return !alive(pid)
}
