package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/catalog"
)

// Jobs: a command in a session or a one-shot sandbox started with wait:
// false runs as a job of the VM's resident helper (guestctl.Start), which
// keeps its output in a bounded buffer while it runs. vm_agent_exec_status
// reads it from a cursor (since), and finds a job the server's table does
// not know (after a restart) by its exec_id, which is the job's id in the
// guest, once the job's session is the caller's. A command run to its end
// while the client asked for progress runs as a job too, so that each
// progress notification carries its latest output line (runReporting).

// execJob is a job as vm_agent_exec_status looks for it.
type execJob struct {
	ID      string
	Session string // "" for a one-shot sandbox's, or not known yet
}

// startJob starts req as a job and answers its exec_id.
func startJob(e *catalog.Env, c *catalog.Call, h *guestctl.Helper, req guestctl.RunRequest) catalog.Result {
	st, err := h.Start(c.Ctx, c.Name, req)
	if errors.Is(err, guestctl.ErrNotResident) {
		r := catalog.Failure(catalog.TagBackend, "wait: false in a session or sandbox needs vmgate-guest's resident helper, which does not run in this VM ("+
			catalog.CleanReason(catalog.Truncate(h.Road(c.Name).String(), 300))+"); run the command with wait: true, and see vm_status for why", true)
		r.Detail = err.Error()
		return r
	}
	if err != nil {
		return catalog.HelperFailure(err)
	}
	id, err := e.Execs.AddJob(c.Grant.Name, c.VM, st.ID, req.Session, e.Now())
	switch {
	case err != nil && req.Session != "":
		// A session's job is found by its exec_id without the table, as
		// after a restart (jobStatus).
		e.Log.Warn("server: keep a started job", "vm", c.VM, "job", st.ID, "err", err)
		id = catalog.JobExecID(st.ID)
	case err != nil:
		// The command runs but cannot be tracked; say so rather than hide it.
		return catalog.Failure(catalog.TagBackend, fmt.Sprintf("command started as pid %d (started_at %d) in a sandbox of its own but cannot be tracked: %v; "+
			"end it with kill_process if it must not run, and poll your other commands to their end (a command in a session is found by its exec_id all the same)", st.PID, st.StartedAt, err), false)
	}
	out := map[string]any{"exec_id": id, "pid": st.PID, "started_at": st.StartedAt, "job": true}
	if req.Session != "" {
		out["session"] = req.Session
	}
	return catalog.Success(out, fmt.Sprintf("started pid %d (started_at %d); poll vm_agent_exec_status with exec_id %s: "+
		"it shows the output so far, and with since (the next it answered) only what came after", st.PID, st.StartedAt, id))
}

// jobStatus answers vm_agent_exec_status for job; known is whether the
// table had it (otherwise it is adopted when its session is the caller's).
func jobStatus(e *catalog.Env, c *catalog.Call, a *execStatusArgs, job execJob, known bool) catalog.Result {
	h, r := e.Guest.HelperFor(c)
	if r != nil {
		return *r
	}
	req := guestctl.StatusRequest{ID: job.ID}
	if a.Since != nil {
		req.Since = guestctl.Cursor{Stdout: a.Since.Stdout, Stderr: a.Since.Stderr}
	}
	st, err := h.Status(c.Ctx, c.Name, req)
	var he *guestctl.Error
	switch {
	case errors.As(err, &he) && he.Code == wire.CodeNotFound:
		if known { // not another grant's or another VM's entry of the same id
			e.Execs.Remove(a.ExecID)
		}
		return unknownExec()
	case err != nil && !known && errors.Is(err, guestctl.ErrNotResident):
		return unknownExec() // no resident helper: none of its jobs either
	case err != nil:
		return catalog.HelperFailure(err)
	}
	if !known {
		// Only a job of one of the caller's sessions on this VM: another
		// grant's, and a one-shot sandbox's (no session the store keeps),
		// are unknown, as ids that never existed are.
		if st.Session == "" {
			return unknownExec()
		}
		if _, r := e.Guest.OwnedSession(c, st.Session); r != nil {
			return unknownExec()
		}
		job.Session = st.Session
		if _, err := e.Execs.AddJob(c.Grant.Name, c.VM, job.ID, job.Session, e.Now()); err != nil {
			e.Log.Warn("server: keep a job found again", "vm", c.VM, "job", job.ID, "err", err)
		}
	}
	more := st.Stdout.More || st.Stderr.More
	if st.State != wire.JobRunning && !more {
		e.Execs.Remove(a.ExecID) // found again from the guest while it keeps the job
	}
	return jobResult(st, job.Session)
}

// jobResult is a job's status as vm_agent_exec_status answers it: a
// command's result, with the cursor for the next read and what the
// buffer let go.
func jobResult(st guestctl.JobStatus, session string) catalog.Result {
	running := st.State == wire.JobRunning
	er := hypervisor.ExecResult{
		PID: int64(st.PID), Exited: !running, ExitCode: st.ExitCode, Signal: st.Signal,
		Stdout: st.Stdout.Data, Stderr: st.Stderr.Data, TimedOut: st.TimedOut,
		StdoutTruncated: st.Stdout.Dropped > 0, StderrTruncated: st.Stderr.Dropped > 0,
	}
	out := execResult(er, "command killed after its timeout; give it a larger timeout_s next time")
	m, ok := out.Structured.(map[string]any)
	if !ok {
		return out
	}
	m["state"] = st.State
	m["next"] = map[string]any{"stdout": st.Stdout.Next, "stderr": st.Stderr.Next}
	for name, o := range map[string]guestctl.JobOutput{"stdout": st.Stdout, "stderr": st.Stderr} {
		m[name+"_offset"], m[name+"_total"], m[name+"_dropped"] = o.Offset, o.Total, o.Dropped
	}
	more := st.Stdout.More || st.Stderr.More
	m["more"] = more
	if session != "" {
		m["session"] = session
	}
	for k, v := range map[string]string{"last_line": st.LastLine, "note": st.Note} {
		if v != "" {
			m[k] = v
		}
	}
	if st.Canceled {
		m["canceled"] = true
	}
	if st.DurationMS > 0 {
		m["duration_ms"] = st.DurationMS
	}
	switch {
	case st.State == wire.JobLost:
		delete(m, "exit_code") // it has none: the helper that ran it ended
		out.Text = "lost, no exit code: " + st.Note + strings.TrimPrefix(out.Text, fmt.Sprintf("exit %d", st.ExitCode))
	case running && len(st.Stdout.Data)+len(st.Stderr.Data) == 0:
		out.Text = fmt.Sprintf("running (pid %d); no output since the cursor yet", st.PID)
	}
	if running || more {
		out.Text += fmt.Sprintf("\n(poll again with since {\"stdout\": %d, \"stderr\": %d} for what comes after)", st.Stdout.Next, st.Stderr.Next)
	}
	for name, o := range map[string]guestctl.JobOutput{"stdout": st.Stdout, "stderr": st.Stderr} {
		if o.Dropped > 0 {
			out.Text += fmt.Sprintf("\n(%d bytes of %s before this were no longer kept: the guest keeps the last part of a long output)", o.Dropped, name)
		}
	}
	return out
}

// reportWait is how long one status read of runReporting waits for output.
const reportWait = 5 * time.Second

// runReporting runs req to its end as a job, reporting its latest output
// line as the call's progress; its output is kept up to req's cap, as a
// run's is. Where there is no resident helper it runs it as a run.
func runReporting(c *catalog.Call, h *guestctl.Helper, req guestctl.RunRequest) (guestctl.RunResult, error) {
	st, err := h.Start(c.Ctx, c.Name, req)
	if errors.Is(err, guestctl.ErrNotResident) {
		return h.Run(c.Ctx, c.Name, req)
	}
	if err != nil {
		return guestctl.RunResult{}, err
	}
	capped := req.MaxOutputBytes
	if capped <= 0 {
		capped = wire.DefaultMaxOutputBytes
	}
	var res guestctl.RunResult
	var cur guestctl.Cursor
	for {
		js, err := h.Status(c.Ctx, c.Name, guestctl.StatusRequest{ID: st.ID, Since: cur, Wait: reportWait})
		if err != nil {
			// The call ends (its context, or a status it cannot read):
			// so does its command, which no exec_id would reach.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Ctx), guestctl.CommandTimeout)
			_, _ = h.Cancel(ctx, c.Name, st.ID)
			cancel()
			return res, err
		}
		c.Progress.Report(js.LastLine)
		res.Stdout, res.StdoutTruncated = keep(res.Stdout, js.Stdout, capped, res.StdoutTruncated)
		res.Stderr, res.StderrTruncated = keep(res.Stderr, js.Stderr, capped, res.StderrTruncated)
		cur = guestctl.Cursor{Stdout: js.Stdout.Next, Stderr: js.Stderr.Next}
		if js.State != wire.JobRunning && !js.Stdout.More && !js.Stderr.More {
			res.PID, res.ExitCode, res.Signal, res.TimedOut = js.PID, js.ExitCode, js.Signal, js.TimedOut
			res.Killed, res.DurationMS = js.Killed, js.DurationMS
			if js.State == wire.JobLost {
				return res, fmt.Errorf("helper: job %s was lost (the resident helper that ran it ended): %s", st.ID, js.Note)
			}
			return res, nil
		}
	}
}

// keep appends o's data to acc up to limit bytes; truncated says whether
// any was cut or dropped.
func keep(acc []byte, o guestctl.JobOutput, limit int64, truncated bool) ([]byte, bool) {
	truncated = truncated || o.Dropped > 0
	room := max(limit-int64(len(acc)), 0)
	if int64(len(o.Data)) > room {
		return append(acc, o.Data[:room]...), true
	}
	return append(acc, o.Data...), truncated
}
