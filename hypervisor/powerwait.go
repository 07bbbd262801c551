package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// A reboot or reset is done, for whoever runs the next command, when the
// guest runs its next boot: until then a command still reaches the old
// boot (a reboot through the guest agent returns at once and the guest
// shuts down in its own time), or fails while the guest is down. The
// drivers' Power returns when the backend took the action; PowerWait adds
// the wait, the same for every backend: it reads the guest's boot id
// (BootIDPath, a random UUID the Linux kernel makes at every boot) through
// the guest agent before the action and returns once the guest answers
// with another. Where the boot id cannot be read before the action (no
// agent, a guest that is not Linux, exec and file reads both refused), it
// performs the action and says it did not wait (PowerOutcome.NoWait).

// BootIDPath is the file whose content a Linux guest draws anew at every
// boot (random(4): /proc/sys/kernel/random/boot_id).
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// WaitedForNewBoot is PowerOutcome.WaitedFor of a reboot or reset that
// returned once the guest answered with a new boot id.
const WaitedForNewBoot = "new boot"

// bootIDProbe bounds one reading of the boot id, so that a hung agent
// call leaves the rest of the deadline to the next one.
const bootIDProbe = 10 * time.Second

// bootIDRE is the form of a boot id: a UUID as the kernel prints it.
var bootIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// PowerOutcome is what PowerWait did beyond the action.
type PowerOutcome struct {
	// WaitedFor is WaitedForNewBoot when the call returned only once the
	// guest answered with a boot id other than the one read before the
	// action; empty when it did not wait (an action that boots nothing,
	// or NoWait).
	WaitedFor string `json:"waited_for,omitempty"`
	// BootIDChanged is true when the guest was seen with a new boot id.
	BootIDChanged bool `json:"boot_id_changed"`
	// NoWait says why a reboot or reset did not wait: its boot id could
	// not be read before the action. Empty otherwise.
	NoWait string `json:"no_wait,omitempty"`
	// BootIDBefore and BootIDAfter are the guest's boot ids read before the
	// action and the new one; empty when not read.
	BootIDBefore string `json:"boot_id_before,omitempty"`
	BootIDAfter  string `json:"boot_id_after,omitempty"`
	// Waited is how long the wait for the new boot took (after Power
	// returned).
	Waited time.Duration `json:"-"`
}

// BootsAnew reports whether action starts a new boot of a running guest
// (the actions PowerWait waits after).
func BootsAnew(action PowerAction) bool {
	return action == PowerReboot || action == PowerReset
}

// PowerWait performs action on vm through d (d.Power) and, for reboot and
// reset, returns only once the guest runs a new boot: its boot id, read
// through the guest agent before the action, has changed. ctx bounds the
// whole call, the wait included: when it ends before the guest answers
// with a new boot id, the error wraps ErrTimeout and says the action was
// done. Other actions are d.Power alone (a zero PowerOutcome).
//
// A reboot or reset whose boot id cannot be read first (within a quarter
// of ctx's time left, at most 10 s) is still performed; the outcome's
// NoWait then says why it did not wait.
func PowerWait(ctx context.Context, d Driver, vm string, action PowerAction) (PowerOutcome, error) {
	if !BootsAnew(action) {
		return PowerOutcome{}, d.Power(ctx, vm, action)
	}
	var out PowerOutcome
	before, err := readBootIDWithin(ctx, d, vm, probeBefore(ctx))
	if err != nil {
		out.NoWait = fmt.Sprintf("the guest's boot id could not be read before the %s (%v), so the call returned without waiting for the new boot", action, err)
		return out, d.Power(ctx, vm, action)
	}
	out.BootIDBefore = before
	if err := d.Power(ctx, vm, action); err != nil {
		return out, err
	}
	start := time.Now()
	after, err := awaitNewBoot(ctx, d, vm, before)
	out.Waited = time.Since(start)
	if err != nil {
		return out, fmt.Errorf("power %s: %w: the %s was done, but the guest did not answer with a new boot id in %s (%v)",
			action, ErrTimeout, action, out.Waited.Round(time.Second), err)
	}
	out.WaitedFor, out.BootIDChanged, out.BootIDAfter = WaitedForNewBoot, true, after
	return out, nil
}

// probeBefore bounds the reading before the action: a quarter of ctx's
// time left, at most bootIDProbe.
func probeBefore(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return min(bootIDProbe, time.Until(dl)/4)
	}
	return bootIDProbe
}

// awaitNewBoot reads vm's boot id until it is not before, or ctx ends
// (then the error says what the last reading saw).
func awaitNewBoot(ctx context.Context, d Driver, vm, before string) (string, error) {
	var b Backoff
	last := errors.New("no reading yet")
	for {
		id, err := readBootIDWithin(ctx, d, vm, bootIDProbe)
		switch {
		case err == nil && id != before:
			return id, nil
		case err == nil:
			last = fmt.Errorf("boot id still %s", id)
		default:
			last = err
		}
		if b.Sleep(ctx, 0) != nil {
			return "", last
		}
	}
}

// readBootIDWithin is ReadBootID bounded by limit.
func readBootIDWithin(ctx context.Context, d Driver, vm string, limit time.Duration) (string, error) {
	pctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return ReadBootID(pctx, d, vm)
}

// ReadBootID reads vm's boot id (BootIDPath) through its guest agent:
// with `cat` through exec, else (exec refused, or no boot id in its
// output) with the agent's own file read. An error says why neither gave
// one.
func ReadBootID(ctx context.Context, d Driver, vm string) (string, error) {
	res, err := Run(ctx, d, vm, ExecRequest{Argv: []string{"cat", BootIDPath}, MaxOutputBytes: 4096})
	if err == nil {
		if id, ok := parseBootID(res.Stdout); ok && res.ExitCode == 0 && res.Signal == 0 {
			return id, nil
		}
		err = fmt.Errorf("cat %s: exit %d, signal %d, output %.80q", BootIDPath, res.ExitCode, res.Signal, res.Stdout)
	}
	if ctx.Err() != nil {
		return "", err
	}
	fc, ferr := d.FileRead(ctx, vm, BootIDPath, 4096)
	if ferr == nil {
		if id, ok := parseBootID(fc.Data); ok {
			return id, nil
		}
		ferr = fmt.Errorf("read %s: no boot id in %.80q", BootIDPath, fc.Data)
	}
	return "", fmt.Errorf("boot id: %w; %w", err, ferr)
}

// parseBootID returns the boot id in b (the file's content, a newline
// after it).
func parseBootID(b []byte) (string, bool) {
	id := strings.TrimSpace(string(b))
	return id, bootIDRE.MatchString(id)
}
