package guestctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
)

// Roads: how a Helper reaches vmgate-guest in a VM.
//
//   - resident, virtio-serial: the driver has a channel of its own to the
//     guest (hypervisor.HelperCaller: QEMU, libvirt) and the resident
//     helper (`vmgate-guest serve`) answers on it: a command costs one
//     exchange on the port, no process start.
//   - resident, agent exec + socket: the driver has no such channel
//     (Proxmox, VirtualBox): the guest agent's exec runs
//     `vmgate-guest call ARGS`, which hands the command to the resident
//     helper over its unix socket. Used for jobs on those backends (a job
//     needs a helper that stays), and for every command when the Helper
//     was built WithCallRoad (see docs/performance.md, row 8e, for which
//     is faster).
//   - per command: today's road and the fallback: the guest agent's exec
//     runs `vmgate-guest ARGS`, one process per command.
//
// The first call to a VM decides its road: a hello on the channel, which
// the resident helper answers with its build's SHA-256. A helper that does
// not answer is started (`vmgate-guest serve --detach`, through the agent's
// exec, after pushing the binary if needed); one that runs another build
// is replaced (`serve --detach --replace`: it ends its jobs). A VM whose
// helper cannot run gets the per-command road, with the reason (Road.Why),
// and is looked at again after roadRecheck. A resident road that stops
// answering before a call was sent is decided again at once (which
// restarts the helper) and the call is sent once more; a call lost in
// flight is not sent again (ErrHelperLost: it may have run).

// Road kinds and ways (Road.Kind, Road.Via).
const (
	RoadResident   = "resident"
	RoadPerCommand = "per-command"
	ViaChannel     = "virtio-serial"
	ViaCall        = "guest agent exec + unix socket"
)

// NoChannelWhy is Road.Why on a backend without a channel of its own to
// the guest (no hypervisor.HelperCaller: Proxmox, VirtualBox).
const NoChannelWhy = "this backend has no channel of its own to the guest"

// roadLockKey prefixes a VM's name for its road lock among vmLocks.
const roadLockKey = "road\x00"

// roadRecheck is how long a per-command road stands before the next call
// looks for a resident helper again.
const roadRecheck = time.Minute

// helloTimeout bounds a hello on the channel (the driver's own dial and
// hello wait are shorter).
const helloTimeout = 10 * time.Second

// ErrNotResident: the VM has no resident helper (jobs need one: wait:
// false, live output).
var ErrNotResident = errors.New("no resident vmgate-guest in this VM")

// errNotSent: the resident road did not take the call (nothing answered
// before it was sent); deciding the road again is safe. notSent wraps the
// reason with it, saying only the reason.
var errNotSent = errors.New("the resident helper did not take the call")

type notSent struct{ err error }

func (e notSent) Error() string   { return e.err.Error() }
func (e notSent) Unwrap() []error { return []error{errNotSent, e.err} }
func notSentf(err error) error    { return notSent{err} }

// Road says how a Helper reaches vmgate-guest in one VM.
type Road struct {
	// Kind is RoadResident or RoadPerCommand; "" before the first call.
	Kind string `json:"kind"`
	// Via is, for RoadResident, ViaChannel or ViaCall.
	Via string `json:"via,omitempty"`
	// Why says, for RoadPerCommand, why no resident helper serves; for
	// RoadResident through ViaCall, why not over a channel.
	Why string `json:"why,omitempty"`
	// Jobs is how jobs reach the resident helper (ViaChannel, ViaCall),
	// "" while none has been started or when they cannot.
	Jobs string `json:"jobs,omitempty"`
	// Helper is the resident helper's hello.
	Helper *wire.Hello `json:"helper,omitempty"`
	// Checked is when the road was decided.
	Checked time.Time `json:"checked"`
}

// String is the road in a few words: "resident (virtio-serial)",
// "per-command: <why>", "undecided".
func (r Road) String() string {
	switch r.Kind {
	case RoadResident:
		if r.Why != "" {
			return "resident (" + r.Via + "; " + r.Why + ")"
		}
		return "resident (" + r.Via + ")"
	case RoadPerCommand:
		return "per-command: " + r.Why
	}
	return "undecided (no helper call yet)"
}

// Road reports vm's road as last decided, without I/O.
func (h *Helper) Road(vm string) Road {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.roads[vm]; ok {
		return *r
	}
	return Road{}
}

// CheckRoad decides vm's road now when it is undecided or due for another
// look, and reports it.
func (h *Helper) CheckRoad(ctx context.Context, vm string) Road {
	return h.road(ctx, vm)
}

// road returns vm's road, deciding it when needed (one decision per VM at
// a time, under the VM's road lock, which is taken before, never while
// holding, the lock Ensure takes).
func (h *Helper) road(ctx context.Context, vm string) Road {
	if r, ok := h.decided(vm); ok {
		return r
	}
	unlock, err := h.vmLocks.Lock(ctx, roadLockKey+vm)
	if err != nil {
		// Not stored: the next call decides.
		return Road{Kind: RoadPerCommand, Why: "waiting for another look for the resident helper: " + err.Error()}
	}
	defer unlock()
	if r, ok := h.decided(vm); ok {
		return r
	}
	r := h.decide(ctx, vm)
	r.Checked = time.Now()
	h.mu.Lock()
	h.roads[vm] = &r
	h.mu.Unlock()
	return r
}

// decided returns vm's road when it stands.
func (h *Helper) decided(vm string) (Road, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.roads[vm]
	if !ok || r.Kind == RoadPerCommand && time.Since(r.Checked) > roadRecheck {
		return Road{}, false
	}
	return *r, true
}

// dropRoad forgets vm's road if it is still r (a call found it broken).
func (h *Helper) dropRoad(vm string, r Road) {
	h.mu.Lock()
	if cur, ok := h.roads[vm]; ok && cur.Checked.Equal(r.Checked) {
		delete(h.roads, vm)
	}
	h.mu.Unlock()
}

// decide finds vm's road: the channel, then (WithCallRoad) the agent's
// exec to the helper's socket, else per command.
func (h *Helper) decide(ctx context.Context, vm string) Road {
	why := NoChannelWhy
	if hc, ok := hypervisor.AsHelperCaller(h.d); ok {
		hello, err := h.residentHello(ctx, vm, ViaChannel, hc)
		if err == nil {
			return Road{Kind: RoadResident, Via: ViaChannel, Jobs: ViaChannel, Helper: hello}
		}
		why = err.Error()
	}
	if h.callRoad {
		hello, err := h.residentHello(ctx, vm, ViaCall, nil)
		if err == nil {
			// Why says why not the channel (vm_status shows it).
			return Road{Kind: RoadResident, Via: ViaCall, Why: why, Jobs: ViaCall, Helper: hello}
		}
		why += "; and through the agent's exec: " + err.Error()
	}
	return Road{Kind: RoadPerCommand, Why: why}
}

// residentHello gets a hello of this build's resident helper by way of
// via, starting the helper (or replacing another build) once when needed.
func (h *Helper) residentHello(ctx context.Context, vm, via string, hc hypervisor.HelperCaller) (*wire.Hello, error) {
	hello, err := h.hello(ctx, vm, via, hc)
	if errors.Is(err, hypervisor.ErrNoHelperChannel) && via == ViaChannel {
		return nil, err
	}
	if err == nil {
		if ok, cerr := h.current(hello); cerr != nil || ok {
			return hello, cerr
		}
	}
	// Absent, or another build: start this one (replacing the other).
	if serr := h.startResident(ctx, vm, hello != nil); serr != nil {
		if err != nil {
			return nil, fmt.Errorf("%w; starting it: %w", err, serr)
		}
		return nil, serr
	}
	// The driver's connection may predate the new helper: its first call
	// then tells it to dial again (not sent), so try a few times.
	for range 3 {
		if hello, err = h.hello(ctx, vm, via, hc); !errors.Is(err, errNotSent) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("started, but: %w", err)
	}
	if ok, cerr := h.current(hello); cerr != nil || !ok {
		return nil, errors.Join(cerr, fmt.Errorf("the resident helper runs sha256 %s after it was replaced", hello.SHA256))
	}
	return hello, nil
}

// current reports whether hello is this build's.
func (h *Helper) current(hello *wire.Hello) (bool, error) {
	bin, err := h.bins.Binary(hello.GOARCH)
	if err != nil {
		return false, fmt.Errorf("helper: %w", err)
	}
	return hello.SHA256 == bin.SHA256, nil
}

// hello asks the resident helper for its hello by way of via. No answer
// is an error; an answer from a helper that is not resident, or speaks
// another protocol, is the hello and an error (that helper is replaced).
func (h *Helper) hello(ctx context.Context, vm, via string, hc hypervisor.HelperCaller) (*wire.Hello, error) {
	ctx, cancel := context.WithTimeout(ctx, helloTimeout)
	defer cancel()
	res, err := h.viaResident(ctx, vm, via, hc, []string{"hello"}, nil, helloTimeout, 1<<16)
	if err != nil {
		return nil, err
	}
	var hello wire.Hello
	if err := decodeReply("hello", res, res.Stdout, &hello); err != nil {
		return nil, err
	}
	if !hello.Resident || hello.Proto != wire.Proto {
		return &hello, fmt.Errorf("helper: hello from pid %d: resident %v, protocol %d; want a resident helper of protocol %d", hello.PID, hello.Resident, hello.Proto, wire.Proto)
	}
	return &hello, nil
}

// startResident makes sure the binary is this build and starts the
// resident helper through the agent's exec (replacing a running one).
func (h *Helper) startResident(ctx context.Context, vm string, replace bool) error {
	h.forgetBinary(vm) // checked afresh: the helper must start from this build
	if err := h.Ensure(ctx, vm); err != nil {
		return err
	}
	args := []string{"serve", "--detach"}
	if replace {
		args = append(args, "--replace")
	}
	req := hypervisor.ExecRequest{Argv: append([]string{GuestPath}, args...), Timeout: CommandTimeout, MaxOutputBytes: 1 << 16}
	res, err := h.exec(ctx, vm, req)
	if err != nil {
		return fmt.Errorf("helper: serve %s: %w", vm, err)
	}
	var s wire.Serving
	return decodeReply("serve", res, res.Stdout, &s)
}

// viaResident sends one command to the resident helper by way of via. A
// call the helper did not take is errNotSent.
func (h *Helper) viaResident(ctx context.Context, vm, via string, hc hypervisor.HelperCaller, args []string, stdin []byte, timeout time.Duration, maxOut int64) (hypervisor.ExecResult, error) {
	if timeout == 0 {
		timeout = CommandTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	if via == ViaCall {
		return h.viaCall(ctx, vm, args, stdin, timeout, maxOut)
	}
	if hc == nil {
		var ok bool
		if hc, ok = hypervisor.AsHelperCaller(h.d); !ok {
			return hypervisor.ExecResult{}, notSentf(fmt.Errorf("%w: this backend has none", hypervisor.ErrNoHelperChannel))
		}
	}
	rep, err := hc.HelperCall(ctx, vm, hypervisor.HelperCall{Args: args, Stdin: stdin, Timeout: timeout})
	switch {
	case err == nil:
		return hypervisor.ExecResult{Exited: true, ExitCode: rep.Exit, Stdout: rep.Stdout}, nil
	case errors.Is(err, hypervisor.ErrHelperUnavailable) || errors.Is(err, hypervisor.ErrNoHelperChannel):
		return hypervisor.ExecResult{}, notSentf(err)
	case ctx.Err() != nil && !errors.Is(err, hypervisor.ErrTimeout):
		return hypervisor.ExecResult{}, fmt.Errorf("%w: %s ran longer than %v: %w", hypervisor.ErrTimeout, args[0], timeout, err)
	}
	return hypervisor.ExecResult{}, err
}

// viaCall runs `vmgate-guest call ARGS` through the agent's exec.
func (h *Helper) viaCall(ctx context.Context, vm string, args []string, stdin []byte, timeout time.Duration, maxOut int64) (hypervisor.ExecResult, error) {
	req := hypervisor.ExecRequest{Argv: append([]string{GuestPath, "call"}, args...), Stdin: stdin, Timeout: timeout + 2*time.Second, MaxOutputBytes: maxOut}
	res, err := h.exec(ctx, vm, req)
	if err != nil {
		return res, err
	}
	if res.ExitCode == 127 || res.ExitCode == wire.ExitNoHelper && replyReason(res.Stdout) == wire.ReasonNoHelper {
		return res, notSentf(fmt.Errorf("vmgate-guest call exited %d: %s", res.ExitCode, truncate(append(res.Stdout, res.Stderr...), 300)))
	}
	if res.StdoutTruncated {
		return res, &ReplyError{Op: args[0], ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, Cause: errors.New("reply truncated")}
	}
	return res, nil
}

// replyReason is the reason of an error reply, "" for anything else.
func replyReason(b []byte) string {
	var r struct {
		Error *wire.Error `json:"error"`
	}
	if json.Unmarshal(b, &r) != nil || r.Error == nil {
		return ""
	}
	return r.Error.Reason
}
