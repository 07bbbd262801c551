package hypervisortest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
)

// recorder is a testing.TB that records instead of reporting, so a check
// can be run against a broken driver and its failure asserted. Fatal and
// Skip end the check's goroutine as in package testing. Methods the checks
// do not use are left to the embedded nil TB (and would panic).
type recorder struct {
	testing.TB
	mu       sync.Mutex // guards the fields below
	failed   bool
	skipped  bool
	logs     []string
	cleanups []func()
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return "recorder" }
func (r *recorder) logLocked(args ...any) {
	r.logs = append(r.logs, strings.TrimSuffix(fmt.Sprintln(args...), "\n"))
}
func (r *recorder) Log(args ...any)                 { r.mu.Lock(); r.logLocked(args...); r.mu.Unlock() }
func (r *recorder) Logf(format string, args ...any) { r.Log(fmt.Sprintf(format, args...)) }
func (r *recorder) Fail()                           { r.mu.Lock(); r.failed = true; r.mu.Unlock() }
func (r *recorder) Failed() bool                    { r.mu.Lock(); defer r.mu.Unlock(); return r.failed }
func (r *recorder) Skipped() bool                   { r.mu.Lock(); defer r.mu.Unlock(); return r.skipped }
func (r *recorder) Error(args ...any)               { r.Log(args...); r.Fail() }
func (r *recorder) Errorf(format string, args ...any) {
	r.Logf(format, args...)
	r.Fail()
}
func (r *recorder) FailNow()                       { r.Fail(); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)              { r.Log(args...); r.FailNow() }
func (r *recorder) Fatalf(format string, a ...any) { r.Logf(format, a...); r.FailNow() }
func (r *recorder) SkipNow() {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any)              { r.Log(args...); r.SkipNow() }
func (r *recorder) Skipf(format string, a ...any) { r.Logf(format, a...); r.SkipNow() }
func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}

// record runs check against h on its own goroutine, then its cleanups.
func record(check func(testing.TB, Harness), h Harness) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r, h)
	}()
	<-done
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	return r
}

func TestRunPassesOnLocalDriver(t *testing.T) {
	d := newLocalDriver(t)
	Run(t, d.harness(t))
}

// TestBeforeGroup: Run calls the hook before each group it runs, in order,
// and not again inside a group.
func TestBeforeGroup(t *testing.T) {
	d := newLocalDriver(t)
	h := d.harness(t)
	var got []string
	h.BeforeGroup = func(_ *testing.T, group string) { got = append(got, group) }
	Run(t, h)
	var want []string
	for _, g := range suite {
		if (g.name == "Network" && !h.Capabilities.GuestNetwork) || (g.name == "Metrics" && !h.Capabilities.Metrics) ||
			(g.name == "Screen" && !anyScreenCap(h.Capabilities)) {
			continue
		}
		want = append(want, g.name)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("BeforeGroup saw %q; want %q", got, want)
	}
}

func TestEveryCheckPassesOnLocalDriver(t *testing.T) {
	// The same as Run, through the recorder: proves the recorder does not
	// invent failures, so the failures below are the checks' own.
	d := newLocalDriver(t)
	h := d.harness(t)
	for _, g := range suite {
		for _, c := range g.checks {
			if r := record(c.run, h); r.Failed() || r.Skipped() {
				t.Errorf("%s/%s on the local driver: failed %v, skipped %v; want a pass. Log:\n%s",
					g.name, c.name, r.Failed(), r.Skipped(), strings.Join(r.logs, "\n"))
			}
		}
	}
}

// delegate returns a Fake whose every function calls d: the base a broken
// driver is made from by replacing one function.
func delegate(d hypervisor.Driver) *Fake {
	f := &Fake{
		ListVMsFunc:    d.ListVMs,
		StatusFunc:     d.Status,
		AgentInfoFunc:  d.AgentInfo,
		ExecStartFunc:  d.ExecStart,
		ExecStatusFunc: d.ExecStatus,
		FileReadFunc:   d.FileRead,
		FileWriteFunc:  d.FileWrite,
		PowerFunc:      d.Power,
	}
	if sn, ok := hypervisor.AsSnapshotter(d); ok {
		f.Modes = sn.SnapshotModes()
		f.SnapshotCreateFunc, f.SnapshotListFunc = sn.SnapshotCreate, sn.SnapshotList
		f.SnapshotRevertFunc, f.SnapshotDeleteFunc = sn.SnapshotRevert, sn.SnapshotDelete
	}
	if n, ok := hypervisor.AsGuestNetworker(d); ok {
		f.GuestNetworkFunc = n.GuestNetwork
	}
	if m, ok := hypervisor.AsMetricsReader(d); ok {
		f.VMMetricsFunc = m.VMMetrics
	}
	return f
}

// onResult returns an ExecStatus function that passes final results of d
// through mutate.
func onResult(d hypervisor.Driver, mutate func(*hypervisor.ExecResult)) func(context.Context, string, hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	return func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
		res, err := d.ExecStatus(ctx, vm, h)
		if err == nil && res.Exited {
			mutate(&res)
		}
		return res, err
	}
}

// onRequest returns an ExecStart function that passes requests through mutate.
func onRequest(d hypervisor.Driver, mutate func(*hypervisor.ExecRequest)) func(context.Context, string, hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	return func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
		mutate(&req)
		return d.ExecStart(ctx, vm, req)
	}
}

func TestChecksFailOnBrokenDrivers(t *testing.T) {
	tests := []struct {
		name  string
		check func(testing.TB, Harness)
		// breakIt turns a Fake delegating to a sound local driver into a broken one.
		breakIt func(f *Fake, d *localDriver)
	}{
		{"ListVMs/missing VM", checkListVMs, func(f *Fake, d *localDriver) {
			f.ListVMsFunc = func(ctx context.Context) ([]hypervisor.VM, error) {
				return []hypervisor.VM{{Name: "other", State: hypervisor.StateRunning}}, nil
			}
		}},
		{"ListVMs/wrong state", checkListVMs, func(f *Fake, d *localDriver) {
			f.ListVMsFunc = func(ctx context.Context) ([]hypervisor.VM, error) {
				return []hypervisor.VM{{Name: d.vm, State: hypervisor.StatePaused}}, nil
			}
		}},
		{"Status/agent not connected", checkStatus, func(f *Fake, d *localDriver) {
			f.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
				st, err := d.Status(ctx, vm)
				st.AgentConnected = false
				return st, err
			}
		}},
		{"AgentInfo/no version", checkAgentInfo, func(f *Fake, d *localDriver) {
			f.AgentInfoFunc = func(ctx context.Context, vm string) (hypervisor.AgentInfo, error) {
				info, err := d.AgentInfo(ctx, vm)
				info.Version = ""
				return info, err
			}
		}},
		{"Echo/wrong stdout", checkEcho, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = onResult(d, func(r *hypervisor.ExecResult) { r.Stdout = append(r.Stdout, 'x') })
		}},
		{"ArgvVerbatim/argv through a shell", checkArgvVerbatim, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = onRequest(d, func(r *hypervisor.ExecRequest) {
				r.Argv = []string{"/bin/sh", "-c", strings.Join(r.Argv, " ")}
			})
		}},
		{"ExitCode/always 0", checkExitCode, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = onResult(d, func(r *hypervisor.ExecResult) { r.ExitCode = 0 })
		}},
		{"Stderr/merged into stdout", checkStderr, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = onRequest(d, func(r *hypervisor.ExecRequest) {
				r.Argv = append([]string{"/bin/sh", "-c", `exec "$@" 2>&1`, "sh"}, r.Argv...)
			})
		}},
		{"Stdin/dropped", checkStdin, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = onRequest(d, func(r *hypervisor.ExecRequest) { r.Stdin = nil })
		}},
		{"Stdin/text only", checkStdin, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = onRequest(d, func(r *hypervisor.ExecRequest) {
				r.Stdin = []byte(strings.ToValidUTF8(string(r.Stdin), "?"))
			})
		}},
		{"Env/ignored", checkEnv, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = onRequest(d, func(r *hypervisor.ExecRequest) { r.Env = nil })
		}},
		{"Cwd/silently ignored", checkCwd, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = onRequest(d, func(r *hypervisor.ExecRequest) { r.Cwd = "" })
		}},
		{"Signal/as 128+n", checkSignal, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = onResult(d, func(r *hypervisor.ExecResult) {
				if r.Signal != 0 {
					r.ExitCode, r.Signal = 128+r.Signal, 0
				}
			})
		}},
		{"OutputCap/limit ignored", checkOutputCap, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = onRequest(d, func(r *hypervisor.ExecRequest) { r.MaxOutputBytes = 0 })
		}},
		{"OutputCap/truncation not flagged", checkOutputCap, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = onResult(d, func(r *hypervisor.ExecResult) { r.StdoutTruncated = false })
		}},
		{"OutputCap/stderr flagged too", checkOutputCap, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = onResult(d, func(r *hypervisor.ExecResult) { r.StderrTruncated = r.StdoutTruncated })
		}},
		{"Timeout/not flagged", checkTimeout, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = onResult(d, func(r *hypervisor.ExecResult) { r.TimedOut = false })
		}},
		{"Timeout/no pid", checkTimeout, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = onResult(d, func(r *hypervisor.ExecResult) { r.PID = 0 })
		}},
		{"TimeoutStartPoll/not flagged", checkTimeoutStartPoll, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = onResult(d, func(r *hypervisor.ExecResult) { r.TimedOut = false })
		}},
		{"TimeoutStartPoll/wrong pid", checkTimeoutStartPoll, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = onResult(d, func(r *hypervisor.ExecResult) { r.PID++ })
		}},
		{"TimeoutKillsTree/leader only", checkTimeoutKillsTree, func(f *Fake, d *localDriver) {
			d.killLeaderOnly = true
		}},
		{"StartPoll/exited before it could", checkStartPoll, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
				res, err := d.ExecStatus(ctx, vm, h)
				res.Exited = true
				return res, err
			}
		}},
		{"MissingBinary/reported as success", checkMissingBinary, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
				h, err := d.ExecStart(ctx, vm, req)
				if err != nil {
					return d.ExecStart(ctx, vm, hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "exit 0"}})
				}
				return h, nil
			}
		}},
		{"EmptyArgv/accepted", checkEmptyArgv, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = onRequest(d, func(r *hypervisor.ExecRequest) {
				if len(r.Argv) == 0 || r.Argv[0] == "" {
					r.Argv = []string{"/bin/sh", "-c", "exit 0"}
				}
			})
		}},
		{"BogusHandle/sentinel lost", checkBogusHandle, func(f *Fake, d *localDriver) {
			f.ExecStatusFunc = func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
				res, err := d.ExecStatus(ctx, vm, h)
				if err != nil {
					err = errors.New(err.Error()) // what a careless plugin boundary does
				}
				return res, err
			}
		}},
		{"Concurrent/one exec at a time", checkConcurrent, func(f *Fake, d *localDriver) {
			var mu sync.Mutex
			busy := false
			f.ExecStartFunc = func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
				mu.Lock()
				defer mu.Unlock()
				if busy {
					return hypervisor.ExecHandle{}, errors.New("busy")
				}
				busy = true
				return d.ExecStart(ctx, vm, req)
			}
			f.ExecStatusFunc = onResult(d, func(*hypervisor.ExecResult) { mu.Lock(); busy = false; mu.Unlock() })
		}},
		{"RoundTrip/first chunk only", checkFileRoundTrip, func(f *Fake, d *localDriver) {
			f.FileWriteFunc = func(ctx context.Context, vm, path string, data []byte, mode uint32) error {
				return d.FileWrite(ctx, vm, path, data[:min(len(data), 64<<10)], mode)
			}
		}},
		{"RoundTrip/text only", checkFileRoundTrip, func(f *Fake, d *localDriver) {
			f.FileWriteFunc = func(ctx context.Context, vm, path string, data []byte, mode uint32) error {
				return d.FileWrite(ctx, vm, path, []byte(strings.ToValidUTF8(string(data), "?")), mode)
			}
		}},
		{"Mode/ignored", checkFileMode, func(f *Fake, d *localDriver) {
			f.FileWriteFunc = func(ctx context.Context, vm, path string, data []byte, mode uint32) error {
				return d.FileWrite(ctx, vm, path, data, 0)
			}
		}},
		{"ReadTruncated/off by one", checkFileReadTruncated, func(f *Fake, d *localDriver) {
			f.FileReadFunc = func(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
				c, err := d.FileRead(ctx, vm, path, maxBytes)
				c.Truncated = int64(len(c.Data)) >= maxBytes
				return c, err
			}
		}},
		{"ReadTruncated/limit ignored", checkFileReadTruncated, func(f *Fake, d *localDriver) {
			f.FileReadFunc = func(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
				return d.FileRead(ctx, vm, path, 1<<20)
			}
		}},
		{"ReadMissing/error swallowed", checkFileReadMissing, func(f *Fake, d *localDriver) {
			f.FileReadFunc = func(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
				c, _ := d.FileRead(ctx, vm, path, maxBytes)
				return c, nil
			}
		}},
		{"UnknownVM/sentinel lost in Status", checkUnknownVM, func(f *Fake, d *localDriver) {
			f.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
				st, err := d.Status(ctx, vm)
				if err != nil {
					err = fmt.Errorf("status: %v", err)
				}
				return st, err
			}
		}},
		{"UnknownVM/power on the wrong VM", checkUnknownVM, func(f *Fake, d *localDriver) {
			f.PowerFunc = func(ctx context.Context, vm string, a hypervisor.PowerAction) error { return nil }
		}},
		{"InvalidPowerAction/not validated", checkInvalidPowerAction, func(f *Fake, d *localDriver) {
			f.PowerFunc = func(ctx context.Context, vm string, a hypervisor.PowerAction) error {
				return fmt.Errorf("power: %w", hypervisor.ErrNotSupported)
			}
		}},
		{"ExpiredDeadline/context ignored", checkExpiredDeadline, func(f *Fake, d *localDriver) {
			f.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
				return d.Status(context.Background(), vm)
			}
		}},
		{"NoExecRun/sentinel lost", checkNoExecRun, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
				h, err := d.ExecStart(ctx, vm, req)
				if err != nil {
					err = errors.New(err.Error())
				}
				return h, err
			}
		}},
		{"NoExecRun/unhelpful message", checkNoExecRun, func(f *Fake, d *localDriver) {
			f.ExecStartFunc = func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
				h, err := d.ExecStart(ctx, vm, req)
				if errors.Is(err, hypervisor.ErrCommandDisabled) {
					err = fmt.Errorf("exec failed: %w", hypervisor.ErrCommandDisabled)
				}
				return h, err
			}
		}},
		{"NoExecAgentInfo/claims enabled", checkNoExecAgentInfo, func(f *Fake, d *localDriver) {
			f.AgentInfoFunc = func(ctx context.Context, vm string) (hypervisor.AgentInfo, error) {
				return d.AgentInfo(ctx, d.vm)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newLocalDriver(t)
			f := delegate(d)
			tt.breakIt(f, d)
			h := d.harness(t)
			h.Driver = f
			r := record(tt.check, h)
			if !r.Failed() || r.Skipped() {
				t.Errorf("check %s on a broken driver: failed %v, skipped %v; want a failure. Log:\n%s",
					tt.name, r.Failed(), r.Skipped(), strings.Join(r.logs, "\n"))
			}
			t.Logf("the check reported: %s", strings.Join(r.logs, " | "))
		})
	}
}

func TestNoExecChecksSkipWithoutNoExecVM(t *testing.T) {
	d := newLocalDriver(t)
	h := d.harness(t)
	h.NoExecVM = ""
	for _, check := range []func(testing.TB, Harness){checkNoExecRun, checkNoExecAgentInfo} {
		r := record(check, h)
		if !r.Skipped() || r.Failed() {
			t.Errorf("NoExec check with no NoExecVM: skipped %v, failed %v; want skipped", r.Skipped(), r.Failed())
		}
		if log := strings.Join(r.logs, "\n"); !strings.Contains(log, "CI must provide") {
			t.Errorf("NoExec check skip reason %q; want it to say CI must provide the VM", log)
		}
	}
}

func TestHarnessValidate(t *testing.T) {
	d := &Fake{}
	tests := []struct {
		name string
		h    Harness
		ok   bool
	}{
		{"complete", Harness{Driver: d, VM: "vm1"}, true},
		{"no driver", Harness{VM: "vm1"}, false},
		{"no VM", Harness{Driver: d}, false},
		{"unknown VM is the VM", Harness{Driver: d, VM: "vm1", UnknownVM: "vm1"}, false},
		{"unknown VM is the no-exec VM", Harness{Driver: d, VM: "vm1", NoExecVM: "no-such-vm-xyz"}, false},
	}
	for _, tt := range tests {
		r := record(func(t testing.TB, h Harness) { h.validate(t) }, tt.h)
		if r.Failed() == tt.ok {
			t.Errorf("validate(%s) failed %v; want failed %v", tt.name, r.Failed(), !tt.ok)
		}
	}
}
