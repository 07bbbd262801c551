package guestctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
)

// Jobs: commands the resident helper runs in the background (wait:
// false), whose output is read while they run, from a cursor, and which a
// restarted server finds again by id (they live in the guest's helper).
// Only a resident helper has jobs: on a VM without one, ErrNotResident.

// The job wire types, re-exported.
type (
	JobStarted = wire.JobStarted
	JobStatus  = wire.JobStatus
	JobOutput  = wire.JobOutput
	Hello      = wire.Hello
)

// Cursor is where a status read starts in each output stream: the Next of
// the previous read (0 for the start).
type Cursor struct {
	Stdout, Stderr int64
}

// StatusRequest is one status read.
type StatusRequest struct {
	ID    string
	Since Cursor
	// Wait, up to wire.MaxJobWaitMS, holds the answer until output past
	// Since arrives or the job ends (0: answer at once).
	Wait time.Duration
	// MaxBytes bounds each stream's data in the answer; 0 means
	// wire.DefaultJobReadBytes.
	MaxBytes int64
}

// Start starts req as a job of vm's resident helper and returns its id at
// once (the command runs until it ends, its timeout, Cancel, or its
// session's destroy).
func (h *Helper) Start(ctx context.Context, vm string, req RunRequest) (JobStarted, error) {
	stdin, err := checkRun(req)
	if err != nil {
		return JobStarted{}, err
	}
	var out JobStarted
	err = h.jobCall(ctx, vm, "job start", []string{"job", "start"}, stdin, 0, &out)
	return out, err
}

// Status reads job id's state and its output past the cursor.
func (h *Helper) Status(ctx context.Context, vm string, r StatusRequest) (JobStatus, error) {
	if err := wire.ValidateJobID(r.ID); err != nil {
		return JobStatus{}, invalid("job status", "%v", err)
	}
	if r.Since.Stdout < 0 || r.Since.Stderr < 0 || r.MaxBytes < 0 || r.MaxBytes > wire.MaxFileReadBytes ||
		r.Wait < 0 || r.Wait > wire.MaxJobWaitMS*time.Millisecond {
		return JobStatus{}, invalid("job status", "cursor %+v, max_bytes %d, wait %v out of range", r.Since, r.MaxBytes, r.Wait)
	}
	args := []string{"job", "status", "--id", r.ID,
		"--stdout-since", strconv.FormatInt(r.Since.Stdout, 10), "--stderr-since", strconv.FormatInt(r.Since.Stderr, 10)}
	if r.MaxBytes > 0 {
		args = append(args, "--max-bytes", strconv.FormatInt(r.MaxBytes, 10))
	}
	if r.Wait > 0 {
		args = append(args, "--wait-ms", strconv.FormatInt(r.Wait.Milliseconds(), 10))
	}
	var out JobStatus
	err := h.jobCall(ctx, vm, "job status", args, nil, r.Wait+CommandTimeout, &out)
	return out, err
}

// Cancel ends job id's whole tree and returns its final status.
func (h *Helper) Cancel(ctx context.Context, vm, id string) (JobStatus, error) {
	if err := wire.ValidateJobID(id); err != nil {
		return JobStatus{}, invalid("job cancel", "%v", err)
	}
	var out JobStatus
	err := h.jobCall(ctx, vm, "job cancel", []string{"job", "cancel", "--id", id}, nil, 0, &out)
	return out, err
}

// Jobs lists vm's jobs (running, and ended ones the helper still keeps),
// without their output.
func (h *Helper) Jobs(ctx context.Context, vm string) ([]JobStatus, error) {
	var out []JobStatus
	err := h.jobCall(ctx, vm, "job list", []string{"job", "list"}, nil, 0, &out)
	return out, err
}

// Hello is vm's resident helper's hello (ErrNotResident without one).
func (h *Helper) Hello(ctx context.Context, vm string) (Hello, error) {
	var out Hello
	err := h.jobCall(ctx, vm, "hello", []string{"hello"}, nil, 0, &out)
	return out, err
}

// jobCall sends a command that only the resident helper serves: by vm's
// resident road, else through the agent's exec to the helper's socket
// (starting the helper there when needed). A call the helper did not take
// decides the road again (which starts the helper) and is sent once more,
// as run does.
func (h *Helper) jobCall(ctx context.Context, vm, op string, args []string, stdin []byte, timeout time.Duration, out any) error {
	var res hypervisor.ExecResult
	for attempt := 0; ; attempt++ {
		via, err := h.jobRoad(ctx, vm)
		if err != nil {
			return fmt.Errorf("helper: %s: %w", op, err)
		}
		res, err = h.viaResident(ctx, vm, via, nil, args, stdin, timeout, replyCap(wire.MaxFileReadBytes))
		if errors.Is(err, errNotSent) {
			h.dropRoad(vm, h.Road(vm))
			if attempt == 0 {
				continue
			}
			return fmt.Errorf("helper: %s: %w: %w", op, ErrNotResident, err)
		}
		if err != nil {
			return fmt.Errorf("helper: %s: %w", op, err)
		}
		break
	}
	err := decodeReply(op, res, res.Stdout, out)
	var he *Error
	if errors.As(err, &he) && he.Reason == wire.ReasonNotResident {
		return fmt.Errorf("%w: %w", ErrNotResident, err)
	}
	return err
}

// jobRoad is how jobs reach vm's resident helper.
func (h *Helper) jobRoad(ctx context.Context, vm string) (string, error) {
	r := h.road(ctx, vm)
	if r.Jobs != "" {
		return r.Jobs, nil
	}
	unlock, err := h.vmLocks.Lock(ctx, roadLockKey+vm)
	if err != nil {
		return "", fmt.Errorf("%w (%s; waiting for another look for it: %w)", ErrNotResident, r, err)
	}
	defer unlock()
	if cur := h.Road(vm); cur.Jobs != "" {
		return cur.Jobs, nil
	}
	hello, err := h.residentHello(ctx, vm, ViaCall, nil)
	if err != nil {
		return "", fmt.Errorf("%w (%s; through the agent's exec: %w)", ErrNotResident, r, err)
	}
	h.mu.Lock()
	if cur, ok := h.roads[vm]; ok {
		cur.Jobs = ViaCall
		if cur.Helper == nil {
			cur.Helper = hello
		}
	}
	h.mu.Unlock()
	return ViaCall, nil
}

// checkRun validates a run request on the host and encodes it.
func checkRun(req RunRequest) ([]byte, error) {
	if (len(req.Argv) == 0) == (req.Shell == "") {
		return nil, invalid("run", "exactly one of argv and shell must be set")
	}
	if req.Session != "" {
		if err := wire.ValidateSessionID(req.Session); err != nil {
			return nil, invalid("run", "%v", err)
		}
	}
	if req.Sandbox != nil {
		if req.Session != "" {
			return nil, invalid("run", "sandbox and session are exclusive (a session has its own sandbox)")
		}
		if err := req.Sandbox.Validate(); err != nil {
			return nil, invalid("run", "%v", err)
		}
	}
	if req.TimeoutMS < 0 || req.TimeoutMS > wire.MaxRunTimeoutMS {
		return nil, invalid("run", "timeout_ms %d out of range 0..%d", req.TimeoutMS, wire.MaxRunTimeoutMS)
	}
	if req.MaxOutputBytes < 0 || req.MaxOutputBytes > wire.MaxOutputBytesLimit {
		return nil, invalid("run", "max_output_bytes %d out of range 0..%d", req.MaxOutputBytes, wire.MaxOutputBytesLimit)
	}
	stdin, err := json.Marshal(req)
	if err != nil {
		return nil, invalid("run", "%v", err)
	}
	return stdin, nil
}
