package vboxemu

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
)

// pumpChunk is what one gctlRunPumpOutput reads (IProcess::Read of _64K).
const pumpChunk = 64 << 10

// defaultWaitSpin is World.WaitSpin's default.
const defaultWaitSpin = 200

// waitLine prints the loop's verbose line for one WaitForArray result.
func (r *runner) waitLine(w WaitResult) {
	if r.verbose() {
		r.c.e.printf("%s", r.c.e.v.WaitResultLine(w))
	}
}

// loop is gctlHandleRunCommon's wait loop. The first WaitForArray answers
// Start (the start flag is still set); while the process runs every
// WaitForArray answers WaitFlagNotSupported at once (protocol 2 cannot
// wait for output: GuestProcessImpl.cpp i_waitFlagsToResultEx) and both
// outputs are pumped, so VBoxManage spins; the emulator prints those
// iterations at World.WaitSpin per second while it polls qemu-ga.
func (r *runner) loop() int {
	r.waitLine(waitStart)
	ctx := context.Background()
	poll := 2 * time.Millisecond
	loopStart := time.Now()
	for {
		if r.isCanceled() {
			return r.cancel(ctx)
		}
		left, ok := r.remaining()
		if r.guestDeadlinePassed() {
			return r.guestTimeout(ctx)
		}
		if !ok {
			return r.hostTimeout(ctx)
		}
		st, err := r.c.g.status(ctx, r.pid)
		if err != nil {
			r.c.e.errorf("emulator: waiting for guest process %d: %v", r.pid, err)
			return exitFailure
		}
		if st.Exited {
			return r.finish(st)
		}
		r.spin(loopStart)
		t := time.NewTimer(min(poll, left))
		select {
		case <-t.C:
		case s := <-r.sigs:
			t.Stop()
			r.sigs <- s
		}
		poll = min(2*poll, 50*time.Millisecond)
	}
}

// spin prints the WaitFlagNotSupported iterations the real loop would have
// made since loopStart.
func (r *runner) spin(loopStart time.Time) {
	rate := r.c.e.w.WaitSpin
	if rate <= 0 {
		rate = defaultWaitSpin
	}
	want := time.Since(loopStart).Seconds() * float64(rate)
	for r.spinned+1 <= want {
		r.waitLine(waitFlagNotSupported)
		r.spinned++
	}
}

func (r *runner) isCanceled() bool {
	select {
	case <-r.sigs:
		return true
	default:
		return false
	}
}

// guestDeadlinePassed: VBoxService's own timer (started with the process,
// VBoxServiceControlProcess.cpp vgsvcGstCtrlProcessProcLoop) fires first
// when the machine says so: a moment before VBoxManage's deadline.
func (r *runner) guestDeadlinePassed() bool {
	return r.o.timeout > 0 && r.c.m.GuestTimeoutFirst && time.Since(r.start) >= r.o.timeout-10*time.Millisecond
}

// pump writes the output the loop reads after the process ended, in
// 64 KiB reads of stdout then stderr per iteration; output nobody waits for
// goes to the bit bucket (gctlRunSetupHandle).
func (r *runner) pump(st qga.ExecStatus) {
	e := r.c.e
	out, errb := st.Stdout, st.Stderr
	for len(out) > 0 || len(errb) > 0 {
		r.waitLine(waitFlagNotSupported)
		n := min(len(out), pumpChunk)
		if r.o.waitStdout {
			e.rawOut.Write(out[:n])
		}
		out = out[n:]
		n = min(len(errb), pumpChunk)
		if r.o.waitStderr {
			e.stderr.Write(errb[:n])
		}
		errb = errb[n:]
	}
	// One more round reads end of file; then VBoxService reports the end.
	r.waitLine(waitFlagNotSupported)
}

// finish reports a process that ended by itself.
func (r *runner) finish(st qga.ExecStatus) int {
	e := r.c.e
	r.pump(st)
	r.waitLine(waitTerminate)
	if r.verbose() {
		e.printf("Process terminated\n")
	}
	status, code, text := statusTerminatedNormally, st.ExitCode, "successfully terminated"
	if st.Signal != 0 {
		status, code, text = statusTerminatedSignal, st.Signal, "terminated by signal"
	}
	r.c.setProcess(r.pid, text, r.o.image)
	if r.verbose() {
		e.printf("Exit code=%d (Status=%d [%s])\n", code, status, text)
	}
	return runExitCode(st)
}

// hostTimeout: the loop ends when gctlRunGetRemainingTime reaches 0,
// "Process monitor loop timed out", exit 20; closing the session then
// makes VBoxService terminate the process. The output it wrote before the
// deadline had been pumped by then: the emulator gets it from qemu-ga
// after the kill.
func (r *runner) hostTimeout(ctx context.Context) int {
	st := r.killAndCollect(ctx)
	r.pump(st)
	r.c.setProcess(r.pid, "killed", r.o.image)
	if r.verbose() {
		r.c.e.printf("Process monitor loop timed out\n")
	}
	return exitExecTimeout
}

// guestTimeout: VBoxService terminated the process at its deadline
// (PROC_STS_TOK); WaitForArray answers Timeout, the status is
// TimedOutKilled: "Process timed out (guest side) and was terminated",
// exit 20.
func (r *runner) guestTimeout(ctx context.Context) int {
	st := r.killAndCollect(ctx)
	r.waitLine(waitTimeout)
	r.pump(st)
	r.c.setProcess(r.pid, "timed out", r.o.image)
	if r.verbose() {
		r.c.e.printf("Process timed out (guest side) and was terminated\n")
	}
	return exitExecTimeout
}

// cancel: CTRL+C or SIGTERM set g_fGuestCtrlCanceled: "Process execution
// aborted!", exit 22; the session close terminates the process. The loop
// breaks without another pump, but the output written before the signal
// had been pumped by earlier iterations: as in hostTimeout, the emulator
// gets it from qemu-ga after the kill.
func (r *runner) cancel(ctx context.Context) int {
	r.pump(r.killAndCollect(ctx))
	r.c.setProcess(r.pid, "killed", r.o.image)
	if r.verbose() {
		r.c.e.printf("Process execution aborted!\n")
	}
	return exitExecCanceled
}

// killAndCollect terminates the process (RTProcTerminate: the process, not
// its children) and returns what qemu-ga has of it.
func (r *runner) killAndCollect(ctx context.Context) qga.ExecStatus {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r.c.g.terminate(ctx, r.pid)
	var st qga.ExecStatus
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		s, err := r.c.g.status(ctx, r.pid)
		if err != nil || s.Exited {
			return s
		}
		st = s
		select {
		case <-ctx.Done():
			return st
		case <-time.After(wait):
		}
	}
}

// sscanVersion reads "major.minor" from the front of s.
func sscanVersion(s string, major, minor *int) (int, error) {
	parts := strings.SplitN(s, ".", 3)
	n := 0
	for i, p := range parts[:min(2, len(parts))] {
		end := 0
		for end < len(p) && p[end] >= '0' && p[end] <= '9' {
			end++
		}
		v, err := strconv.Atoi(p[:end])
		if err != nil {
			return n, fmt.Errorf("bad version %q", s)
		}
		if i == 0 {
			*major = v
		} else {
			*minor = v
		}
		n++
	}
	return n, nil
}
