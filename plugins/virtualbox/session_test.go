package virtualbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/internal/vboxemu"
)

// refusedLocked counts the emulator's invocations of command (argv[0])
// that VirtualBox refused because the machine's session was locked. The
// log is read as it is: a line being written is not counted.
func (e *emulator) refusedLocked(t *testing.T, command string) int {
	t.Helper()
	raw, err := os.ReadFile(e.logPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	n := 0
	for line := range bytes.Lines(raw) {
		var l vboxemu.LogEntry
		if json.Unmarshal(line, &l) == nil && len(l.Argv) > 0 && l.Argv[0] == command && l.Code != 0 && sessionLocked(errorText([]byte(l.Stderr))) {
			n++
		}
	}
	return n
}

// endVMProcesses ends the VM processes still holding their machines'
// sessions after a poweroff.
func (e *emulator) endVMProcesses(t *testing.T) {
	t.Helper()
	if err := vboxemu.UpdateWorld(e.world, func(w *vboxemu.World) error {
		for _, m := range w.VMs {
			m.SessionLockedUntil = time.Time{}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestWaitsForTheVMProcess: right after a poweroff the VM process still
// holds the machine's session (VBoxHeadless.cpp TrustedMain unlocks it
// after its event loop ends), so VirtualBox refuses startvm and
// unregistervm for a while. A start after a stop and a delete of a running
// VM wait for the VM process to end, for every release; each refusal was
// seen before the VM process ended.
func TestWaitsForTheVMProcess(t *testing.T) {
	hour := int(time.Hour / time.Millisecond)
	tests := []struct {
		name    string
		command string // the VBoxManage command that waits
		run     func(ctx context.Context, d *Driver) error
		check   func(w *vboxemu.World) bool
	}{
		{name: "start after stop", command: "startvm",
			run: func(ctx context.Context, d *Driver) error {
				if err := d.Power(ctx, "r1", hypervisor.PowerStop); err != nil {
					return err
				}
				return d.Power(ctx, "r1", hypervisor.PowerStart)
			},
			check: func(w *vboxemu.World) bool { return len(w.VMs) == 1 && w.VMs[0].State == "running" }},
		{name: "delete of a running VM", command: "unregistervm",
			run: func(ctx context.Context, d *Driver) error {
				return d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "r1", Mark: testMark})
			},
			check: func(w *vboxemu.World) bool { return len(w.VMs) == 0 }},
	}
	for _, v := range versions {
		for _, tt := range tests {
			t.Run(v+"/"+tt.name, func(t *testing.T) {
				m := &vboxemu.Machine{Name: "r1", UUID: uuidT1, State: "running", StateChange: time.Now(), ExtraData: map[string]string{markKey: testMark}}
				e := newEmulator(t, v, []*vboxemu.Machine{m}, func(w *vboxemu.World) { w.VMProcessTeardownMS = hour })
				d := e.driver(t)
				done := make(chan error, 1)
				go func() { done <- tt.run(ctxT(t), d) }()
				deadline := time.Now().Add(testload.Scale(time.Minute))
				for e.refusedLocked(t, tt.command) == 0 {
					select {
					case err := <-done:
						t.Fatalf("%s returned %v before VirtualBox refused %s for the locked session; want it to wait", tt.name, err, tt.command)
					default:
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: no %s was refused for the locked session within a minute", tt.name, tt.command)
					}
					time.Sleep(5 * time.Millisecond) // poll interval
				}
				e.endVMProcesses(t)
				if err := <-done; err != nil {
					t.Fatalf("%s = %v once the VM process ended; want nil", tt.name, err)
				}
				if w := e.worldNow(t); !tt.check(w) {
					t.Errorf("%s: the machines are %+v afterwards", tt.name, w.VMs)
				}
			})
		}
	}
}

// TestVMProcessWaitEnds: the wait for a VM process to end is bounded by
// the call's context and says what to do; a machine that runs holds its
// session for good, so starting it is refused at once.
func TestVMProcessWaitEnds(t *testing.T) {
	hour := int(time.Hour / time.Millisecond)
	m := &vboxemu.Machine{Name: "r1", UUID: uuidT1, State: "running", StateChange: time.Now()}
	e := newEmulator(t, "7.1", []*vboxemu.Machine{m}, func(w *vboxemu.World) { w.VMProcessTeardownMS = hour })
	d := e.driver(t)
	err := d.Power(ctxT(t), "r1", hypervisor.PowerStart)
	if !errors.Is(err, hypervisor.ErrInvalidArgument) || !strings.Contains(err.Error(), "is running") || e.refusedLocked(t, "startvm") != 1 {
		t.Errorf("Power(r1 running, start) = %v after %d startvm; want %v saying it runs, after one startvm", err, e.refusedLocked(t, "startvm"), hypervisor.ErrInvalidArgument)
	}
	if err := d.Power(ctxT(t), "r1", hypervisor.PowerStop); err != nil {
		t.Fatalf("Power(r1, stop) = %v", err)
	}
	// The caller gives up while the VM process ends (a deadline ends the
	// wait the same way, as ErrTimeout).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := e.refusedLocked(t, "startvm")
	done := make(chan error, 1)
	go func() { done <- d.Power(ctx, "r1", hypervisor.PowerStart) }()
	for e.refusedLocked(t, "startvm") < before+2 { // refused, looked at, and retried
		select {
		case err := <-done:
			t.Fatalf("Power(r1, start) while its VM process ends returned %v before it was refused twice; want it to wait", err)
		default:
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "VM process has not ended") || !strings.Contains(err.Error(), "already locked by a session") {
		t.Errorf("Power(r1, start) given up while its VM process ends = %v; want %v with VirtualBox's reason and what to do", err, context.Canceled)
	}
	if w := e.worldNow(t); w.VMs[0].State != "poweroff" {
		t.Errorf("r1 is %s; want poweroff", w.VMs[0].State)
	}
}
