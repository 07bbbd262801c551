package hypervisortest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

// RunPower runs the power suite against h.VM, which the calling test must
// own: it resets the VM through hypervisor.PowerWait (which must return
// only once the guest runs a new boot: the very next command sees a new
// boot id), then stops and starts it. Each step is observed through Status
// and the guest's boot id. An action the driver answers with
// hypervisor.ErrNotSupported skips its subtest with the reason; when stop
// works but start is not supported the VM is left stopped. Graceful
// shutdown is not exercised (it depends on the guest handling ACPI
// events); a reboot is RunPowerReboot's. Waits are bounded by
// h.PowerTimeout.
//
// RunPower leaves the VM running, but after start it may be a new process
// that the driver launched (the QEMU driver daemonizes it), unknown to
// whatever launched the VM first: the caller must stop it when done, for
// example with Power(stop) in a t.Cleanup registered before RunPower.
func RunPower(t *testing.T, h Harness) {
	t.Helper()
	h.validate(t)
	t.Run("Reset", func(t *testing.T) { checkPowerReset(t, h) })
	t.Run("StopStart", func(t *testing.T) { checkPowerStopStart(t, h) })
}

// waitFor polls cond until it returns true or h.PowerTimeout passes.
// cond reports what it saw, for the failure message.
func waitFor(t testing.TB, h Harness, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), h.powerTimeout())
	defer cancel()
	var b hypervisor.Backoff
	for {
		callCtx, callCancel := testload.WithTimeout(ctx, 30*time.Second)
		ok, saw := cond(callCtx)
		callCancel()
		if ok {
			return
		}
		if b.Sleep(ctx, 0) != nil {
			t.Fatalf("waiting for %s: %v: last saw %s", what, context.Cause(ctx), saw)
		}
	}
}

func bootID(ctx context.Context, h Harness) (string, error) {
	res, err := hypervisor.Run(ctx, h.Driver, h.VM, hypervisor.ExecRequest{Argv: []string{"cat", "/proc/sys/kernel/random/boot_id"}})
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 || res.Signal != 0 {
		return "", fmt.Errorf("cat boot_id: exit %d, signal %d, stderr %q", res.ExitCode, res.Signal, res.Stderr)
	}
	id := strings.TrimSpace(string(res.Stdout))
	if id == "" {
		return "", errors.New("cat boot_id: empty output")
	}
	return id, nil
}

// upAgain waits until the VM is running with its agent answering and its
// boot id differs from before (when before is not empty).
func upAgain(t testing.TB, h Harness, before string) {
	t.Helper()
	waitFor(t, h, "the VM running with its agent answering", func(ctx context.Context) (bool, string) {
		st, err := h.Driver.Status(ctx, h.VM)
		if err != nil {
			return false, fmt.Sprintf("Status error %v", err)
		}
		if st.State != hypervisor.StateRunning || !st.AgentConnected {
			return false, fmt.Sprintf("state %q, agent connected %v", st.State, st.AgentConnected)
		}
		id, err := bootID(ctx, h)
		if err != nil {
			return false, fmt.Sprintf("boot id: %v", err)
		}
		if id == before {
			return false, fmt.Sprintf("boot id still %s", id)
		}
		return true, ""
	})
}

// RunPowerReboot reboots h.VM through hypervisor.PowerWait, which must
// return only once the guest runs a new boot: the very next command sees
// a new boot id. A reboot goes through the guest (its agent, or ACPI), so
// it needs a guest that handles one, as the lab guest does; the driver's
// hypervisor.ErrNotSupported skips it. The wait is bounded by
// h.PowerTimeout.
func RunPowerReboot(t *testing.T, h Harness) {
	t.Helper()
	h.validate(t)
	t.Run("RebootWaits", func(t *testing.T) { checkBootWait(t, h, hypervisor.PowerReboot) })
}

func checkPowerReset(t testing.TB, h Harness) { checkBootWait(t, h, hypervisor.PowerReset) }

// checkBootWait performs action (reset or reboot) through PowerWait and
// checks that it returned in the new boot, and said so.
func checkBootWait(t testing.TB, h Harness, action hypervisor.PowerAction) {
	ctx, cancel := testload.WithTimeout(context.Background(), h.powerTimeout())
	defer cancel()
	before, err := bootID(ctx, h)
	if err != nil {
		t.Fatalf("boot id before %s: %v", action, err)
	}
	out, err := hypervisor.PowerWait(ctx, h.Driver, h.VM, action)
	if errors.Is(err, hypervisor.ErrNotSupported) {
		t.Skipf("PowerWait(%q, %s): %v", h.VM, action, err)
	}
	if err != nil {
		t.Fatalf("PowerWait(%q, %s) = %+v, %v", h.VM, action, out, err)
	}
	if out.WaitedFor != hypervisor.WaitedForNewBoot || !out.BootIDChanged || out.BootIDBefore != before || out.BootIDAfter == before {
		t.Errorf("PowerWait(%q, %s) = %+v; want it to have waited for a new boot after %s", h.VM, action, out, before)
	}
	// No wait here: the first command after the call reaches the new boot.
	after, err := bootID(ctx, h)
	if err != nil || after == before || after != out.BootIDAfter {
		t.Fatalf("first command after PowerWait(%q, %s): boot id %q, %v; want the new boot's %s (before: %s)", h.VM, action, after, err, out.BootIDAfter, before)
	}
	upAgain(t, h, before)
}

func checkPowerStopStart(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	before, err := bootID(ctx, h)
	if err != nil {
		t.Fatalf("boot id before stop: %v", err)
	}
	err = h.Driver.Power(ctx, h.VM, hypervisor.PowerStop)
	if errors.Is(err, hypervisor.ErrNotSupported) {
		t.Skipf("Power(%q, stop): %v", h.VM, err)
	}
	if err != nil {
		t.Fatalf("Power(%q, stop) error: %v", h.VM, err)
	}
	waitFor(t, h, "the VM stopped", func(ctx context.Context) (bool, string) {
		st, err := h.Driver.Status(ctx, h.VM)
		if err != nil {
			return false, fmt.Sprintf("Status error %v", err)
		}
		return st.State == hypervisor.StateStopped, fmt.Sprintf("state %q", st.State)
	})
	runCtx, cancel := testload.WithTimeout(context.Background(), 30*time.Second)
	res, err := hypervisor.Run(runCtx, h.Driver, h.VM, hypervisor.ExecRequest{Argv: []string{"/bin/echo", "x"}})
	cancel()
	if err == nil {
		t.Errorf("Run(%q) on a stopped VM = %+v; want an error", h.VM, res)
	}
	// The waits above may have outlived ctx: the start gets its own bound.
	err = h.Driver.Power(h.ctx(t), h.VM, hypervisor.PowerStart)
	if errors.Is(err, hypervisor.ErrNotSupported) {
		t.Skipf("Power(%q, start): %v (the VM is left stopped)", h.VM, err)
	}
	if err != nil {
		t.Fatalf("Power(%q, start) error: %v", h.VM, err)
	}
	upAgain(t, h, before)
}
