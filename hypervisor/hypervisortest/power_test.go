package hypervisortest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// powerSim is a simulated VM with power state, for RunPower's self-tests.
// Its guest is the host (through localDriver), except that it answers the
// boot id with its own boot counter and refuses exec while not running.
type powerSim struct {
	d *localDriver
	simFaults

	mu      sync.Mutex // guards state, boots, pending
	state   hypervisor.State
	boots   int
	pending int // boot id readings left before a reboot takes effect; -1: none pending
}

// simFaults are a powerSim's broken behaviours.
type simFaults struct {
	resetKeepsBoot bool // reset reports success but does not reboot
	stopIgnored    bool // stop reports success but the VM keeps running
	noStart        bool // start is ErrNotSupported
	rebootLag      int  // a reboot takes effect after this many boot id readings
	rebootNever    bool // a reboot reports success but the guest never boots anew
}

func (p *powerSim) driver() *Fake {
	f := delegate(p.d)
	f.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
		st, err := p.d.Status(ctx, vm)
		p.mu.Lock()
		defer p.mu.Unlock()
		st.State, st.AgentConnected = p.state, p.state == hypervisor.StateRunning
		return st, err
	}
	f.ExecStartFunc = func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
		p.mu.Lock()
		state, boots := p.state, p.boots
		if len(req.Argv) == 2 && strings.HasSuffix(req.Argv[1], "/boot_id") {
			switch {
			case p.pending == 0:
				p.boots, p.pending = p.boots+1, -1
				boots = p.boots
			case p.pending > 0:
				p.pending--
			}
		}
		p.mu.Unlock()
		if state != hypervisor.StateRunning {
			return hypervisor.ExecHandle{}, fmt.Errorf("sim: exec: %w", hypervisor.ErrVMNotRunning)
		}
		if len(req.Argv) == 2 && strings.HasSuffix(req.Argv[1], "/boot_id") {
			req.Argv = []string{"/bin/echo", fmt.Sprintf("%08x-0000-4000-8000-000000000000", boots)}
		}
		return p.d.ExecStart(ctx, vm, req)
	}
	f.PowerFunc = func(ctx context.Context, vm string, a hypervisor.PowerAction) error {
		if err := p.d.check(ctx, vm); err != nil {
			return err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		switch {
		case a == hypervisor.PowerReset && !p.resetKeepsBoot:
			p.boots++
		case a == hypervisor.PowerReboot && !p.rebootNever:
			p.pending = p.rebootLag
		case a == hypervisor.PowerStop && !p.stopIgnored:
			p.state = hypervisor.StateStopped
		case a == hypervisor.PowerStart && p.noStart:
			return fmt.Errorf("sim: start: %w", hypervisor.ErrNotSupported)
		case a == hypervisor.PowerStart:
			p.state = hypervisor.StateRunning
			p.boots++
		}
		return nil
	}
	return f
}

func TestRunPowerOnSimulator(t *testing.T) {
	tests := []struct {
		name        string
		check       func(testing.TB, Harness)
		faults      simFaults
		wantFail    bool
		wantSkip    bool
		wantStopped bool // the VM is left stopped
	}{
		{name: "reset works", check: checkPowerReset},
		{name: "stop and start work", check: checkPowerStopStart},
		{name: "reset does not reboot", check: checkPowerReset, faults: simFaults{resetKeepsBoot: true}, wantFail: true},
		{name: "reboot waits for the new boot", check: checkReboot, faults: simFaults{rebootLag: 3}},
		{name: "reboot never boots anew", check: checkReboot, faults: simFaults{rebootNever: true}, wantFail: true},
		{name: "stop is ignored", check: checkPowerStopStart, faults: simFaults{stopIgnored: true}, wantFail: true},
		{name: "start not supported", check: checkPowerStopStart, faults: simFaults{noStart: true}, wantSkip: true, wantStopped: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sim := &powerSim{d: newLocalDriver(t), simFaults: tt.faults, state: hypervisor.StateRunning, pending: -1}
			h := sim.d.harness(t)
			h.Driver = sim.driver()
			h.PowerTimeout = 2 * time.Second // the failing cases wait this long
			r := record(tt.check, h)
			if r.Failed() != tt.wantFail || r.Skipped() != tt.wantSkip {
				t.Errorf("%s: failed %v, skipped %v; want failed %v, skipped %v. Log:\n%s",
					tt.name, r.Failed(), r.Skipped(), tt.wantFail, tt.wantSkip, strings.Join(r.logs, "\n"))
			}
			sim.mu.Lock()
			stopped := sim.state == hypervisor.StateStopped
			sim.mu.Unlock()
			if stopped != tt.wantStopped {
				t.Errorf("%s: VM left stopped %v; want %v", tt.name, stopped, tt.wantStopped)
			}
		})
	}
}

// checkReboot is RunPowerReboot's check.
func checkReboot(t testing.TB, h Harness) { checkBootWait(t, h, hypervisor.PowerReboot) }

func TestRunPowerSkipsWhenUnsupported(t *testing.T) {
	d := newLocalDriver(t)
	h := d.harness(t)
	for _, check := range []func(testing.TB, Harness){checkPowerReset, checkReboot, checkPowerStopStart} {
		if r := record(check, h); !r.Skipped() || r.Failed() {
			t.Errorf("power check on a driver without power: skipped %v, failed %v; want skipped", r.Skipped(), r.Failed())
		}
	}
}
