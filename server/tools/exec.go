package tools

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/server/catalog"
)

// Commands: vm_agent_exec (through the driver's guest exec, or through
// vmgate-guest when it runs in a session or a sandbox of its own) and
// vm_agent_exec_status (polling a command started with wait: false).
//
// A command in a session or a one-shot sandbox (sandbox, or a policy that
// requires one: policy/execsandbox.go) runs through vmgate-guest; with
// wait: false it is a job of the resident helper (exec_jobs.go), whose
// output vm_agent_exec_status reads from a cursor while it runs and whose
// exec_id a restarted server finds again. timeout_s goes up to the
// server's cap (limits.max_timeout_s, 600 s by default) unless the grant's
// policy sets its own (max_timeout_s, up to a day).
//
// A cwd means the directory it names, as a file tool's path does
// (tool_files.go): the catalogue takes only an absolute, clean path, and
// before the command runs vmgate-guest checks in the guest that it names a
// directory reached through no symlink (magic links such as /proc/1/root
// included), unless the policy follows symlinks for vm_agent_exec
// (files.follow_symlinks); then the guest resolves it, the policy decides
// again on the real directory, and the command runs there. Where the
// command is started the directory is entered again without following a
// symlink, so one swapped in between is refused there too: the guest
// agent's road (guest/qga's cwd script) compares the directory it entered
// with the one asked for, and vmgate-guest's run (guest/agent/run.go)
// opens it following nothing.

func execTool(l catalog.Limits) *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		// Any command as root: it can change anything in the guest, and reach
		// whatever the guest's network reaches.
		Name: "vm_agent_exec", Title: "Run a command in a VM", Destructive: true, OpenWorld: true,
		Desc: "Run a command in a VM through its guest agent and return exit code, stdout and stderr. " +
			"Give exactly one of command (an argv array, run without a shell) or shell (a string run by /bin/sh -c). " +
			"The command is killed after timeout_s seconds (timed_out: true, partial output kept). " +
			"Output is capped per stream (stdout_truncated/stderr_truncated say so). " +
			"With wait: false it returns an exec_id at once (and the pid with its started_at, as kill_process takes them); poll it with vm_agent_exec_status. " +
			"With session, or sandbox (a one-shot sandbox, as create_session's), the command runs confined through vmgate-guest; " +
			"with wait: false there, vm_agent_exec_status shows its output while it runs.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "command", Kind: catalog.KindStringArray, Desc: "Program and arguments, e.g. [\"ls\", \"-l\", \"/tmp\"]. No shell is involved.", MaxLen: 4096},
			{Name: "shell", Kind: catalog.KindString, Desc: "A shell command line, run as /bin/sh -c SHELL.", MaxLen: 1 << 16},
			{Name: "stdin", Kind: catalog.KindString, Desc: "Text written to the command's standard input, which is then closed.", AllowNUL: true},
			{Name: "env", Kind: catalog.KindStringMap, Desc: "Environment variables to add, name → value. VMGATE_* names are reserved.", MaxLen: 256},
			{Name: "cwd", Kind: catalog.KindString, Desc: "Working directory in the guest: an absolute, clean path (no \".\", \"..\", \"//\" or trailing \"/\"), entered following no symlink unless the policy allows following symlinks.", MaxLen: 4096, GuestPath: true},
			catalog.SessionField(),
			execSandboxField(),
			{Name: "timeout_s", Kind: catalog.KindInteger, Min: 1, Max: policy.MaxExecTimeoutS, Default: l.DefaultTimeoutS,
				Desc: fmt.Sprintf("Seconds before the command is killed (default %d, at most %d unless the grant's policy allows more, up to %d).", l.DefaultTimeoutS, l.MaxTimeoutS, policy.MaxExecTimeoutS)},
			{Name: "max_output_bytes", Kind: catalog.KindInteger, Desc: fmt.Sprintf("Cap for each of stdout and stderr; the server caps it at %d.", l.MaxOutputBytes), Min: 1, Max: math.MaxInt64},
			{Name: "wait", Kind: catalog.KindBoolean, Desc: "Wait for the command to finish (default true). false returns an exec_id to poll.", Default: true},
		},
		ExactlyOne: [][]string{{"command", "shell"}},
		Output: []map[string]any{
			execShape(),
			catalog.OObject(map[string]any{"exec_id": catalog.OString(), "pid": catalog.OInteger(), "started_at": catalog.OInteger(), "session": catalog.OString(), "job": catalog.OBoolean()}, "exec_id", "pid"),
		},
	}, runExec)
}

func execStatusTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_agent_exec_status", Title: "Poll a command", ReadOnly: true,
		Desc: "Poll a command started with vm_agent_exec wait: false. Returns exited: false (no exit_code) while it runs, " +
			"with the output so far when the guest hands it over, then the final exit code and output " +
			"(after which the exec_id is forgotten, but for a command in a session or sandbox, which can be read again while the guest keeps it). " +
			"A command in a session or sandbox shows its output while it runs: pass since (the next of the previous answer) to get only what came after.",
		Fields: []catalog.Field{catalog.VMField(true), {Name: "exec_id", Kind: catalog.KindString, Desc: "The exec_id vm_agent_exec returned.", Required: true, MaxLen: 128},
			{Name: "since", Kind: catalog.KindObject, Desc: "Where to start reading each stream: the next of the previous answer (a command in a session or sandbox only; default: from the start).", Fields: []catalog.Field{
				{Name: "stdout", Kind: catalog.KindInteger, Desc: "Offset in stdout.", Min: 0, Max: math.MaxInt64},
				{Name: "stderr", Kind: catalog.KindInteger, Desc: "Offset in stderr.", Min: 0, Max: math.MaxInt64},
			}}},
		Output: []map[string]any{execShape()},
	}, runExecStatus)
}

// execShape is a command's result as execResult shows it: exit_code only
// once it exited; each stream as text or, when it is not text, base64.
func execShape() map[string]any {
	return catalog.OObject(map[string]any{
		"pid": catalog.OInteger(), "exited": catalog.OBoolean(), "exit_code": catalog.OInteger(), "signal": catalog.OInteger(),
		"stdout": catalog.OString(), "stdout_base64": catalog.OString(), "stderr": catalog.OString(), "stderr_base64": catalog.OString(),
		"stdout_truncated": catalog.OBoolean(), "stderr_truncated": catalog.OBoolean(), "timed_out": catalog.OBoolean(),
		"session": catalog.OString(), "duration_ms": catalog.ONonNeg(), "killed": catalog.ONonNeg(), "sandbox_note": catalog.OString(),
		"sandboxed": catalog.OBoolean(), "state": catalog.OString(), "canceled": catalog.OBoolean(), "note": catalog.OString(), "last_line": catalog.OString(),
		"next":          catalog.OObject(map[string]any{"stdout": catalog.ONonNeg(), "stderr": catalog.ONonNeg()}, "stdout", "stderr"),
		"stdout_offset": catalog.ONonNeg(), "stderr_offset": catalog.ONonNeg(), "stdout_total": catalog.ONonNeg(), "stderr_total": catalog.ONonNeg(),
		"stdout_dropped": catalog.ONonNeg(), "stderr_dropped": catalog.ONonNeg(), "more": catalog.OBoolean(),
	}, "pid", "exited", "stdout_truncated", "stderr_truncated", "timed_out")
}

// execArgs are vm_agent_exec's arguments, read once for both of its roads:
// the driver's own exec, and vmgate-guest's run when session is given.
// Exactly one of Command and Shell is set (the catalogue says so).
type execArgs struct {
	Command []string          `arg:"command"`
	Shell   *string           `arg:"shell"`
	Stdin   *string           `arg:"stdin"`
	Env     map[string]string `arg:"env"`
	Cwd     *string           `arg:"cwd"`
	Session *string           `arg:"session"` // given, even "": the command runs in that session or not at all
	// Sandbox is what the call asked for; the handler runs the policy's
	// answer to it (Call.Rules.Sandbox), never this.
	Sandbox        *sandboxArg `arg:"sandbox"`
	TimeoutS       int64       `arg:"timeout_s"`
	MaxOutputBytes int64       `arg:"max_output_bytes"`
	Wait           *bool       `arg:"wait"`
}

// timeoutS is the command's timeout: timeout_s, or the server's default.
func (a *execArgs) timeoutS(l catalog.Limits) int64 {
	if a.TimeoutS > 0 {
		return a.TimeoutS
	}
	return l.DefaultTimeoutS
}

// Deadline bounds the call: the command's own timeout plus room to collect
// its output (catalog.Deadliner).
func (a *execArgs) Deadline(e *catalog.Env) time.Duration {
	return time.Duration(a.timeoutS(e.Limits))*time.Second + e.Timeouts.ExecGrace
}

// noWait reports whether the caller asked for an exec_id instead of the result.
func (a *execArgs) noWait() bool { return a.Wait != nil && !*a.Wait }

// CheckArgs refuses what the catalogue's validator cannot see
// (catalog.ArgChecker): the gate runs it before the policy decides, so a
// call it refuses parks no approval and reserves nothing.
func (a *execArgs) CheckArgs() error {
	if a.Session != nil && a.Sandbox != nil {
		return errors.New("sandbox cannot be combined with session (a session has its own sandbox, set when it was created)")
	}
	return nil
}

// UndoApplies: a policy's snapshot_before applies to every command
// (catalog.Undoable).
func (a *execArgs) UndoApplies() bool { return true }

// request is a as the driver's exec takes it: a shell runs as /bin/sh -c,
// the environment as sorted NAME=value pairs.
func (a *execArgs) request(e *catalog.Env) hypervisor.ExecRequest {
	req := hypervisor.ExecRequest{
		Argv:           a.Command,
		MaxOutputBytes: e.OutputCap(a.MaxOutputBytes),
		Timeout:        time.Duration(a.timeoutS(e.Limits)) * time.Second,
	}
	if a.Shell != nil {
		req.Argv = []string{"/bin/sh", "-c", *a.Shell}
	}
	if a.Cwd != nil {
		req.Cwd = *a.Cwd
	}
	for k, v := range a.Env {
		req.Env = append(req.Env, k+"="+v)
	}
	slices.Sort(req.Env)
	if a.Stdin != nil {
		req.Stdin = []byte(*a.Stdin)
	}
	return req
}

// runRequest is a as vmgate-guest's run takes it, in session id.
func (a *execArgs) runRequest(e *catalog.Env, id string) guestctl.RunRequest {
	req := guestctl.RunRequest{
		Session:        id,
		Argv:           a.Command,
		MaxOutputBytes: min(e.OutputCap(a.MaxOutputBytes), wire.MaxOutputBytesLimit),
		TimeoutMS:      a.timeoutS(e.Limits) * 1000,
	}
	if a.Shell != nil {
		req.Shell = *a.Shell
	}
	if a.Cwd != nil {
		req.Cwd = *a.Cwd
	}
	if a.Env != nil {
		req.Env = a.Env
	}
	if a.Stdin != nil {
		req.Stdin = []byte(*a.Stdin)
	}
	return req
}

func runExec(e *catalog.Env, c *catalog.Call, a *execArgs) catalog.Result {
	if r := checkTimeout(e, c, a); r != nil {
		return *r
	}
	switch {
	case a.Session != nil:
		return runSessionExec(e, c, a)
	case c.Rules.Sandbox != nil:
		return runSandboxedExec(e, c, a)
	case a.Sandbox != nil: // the policy gave no sandbox for one asked for: never unconfined
		return catalog.Failure(catalog.TagDenied, "the policy gave no sandbox for this command, so it does not run", true)
	}
	if r := resolveCwd(e, c, a); r != nil {
		return *r
	}
	req := a.request(e)
	secs := a.timeoutS(e.Limits)
	if a.noWait() {
		h, err := c.Driver.ExecStart(c.Ctx, c.Name, req)
		if err != nil {
			return catalog.DriverFailure(err)
		}
		id, err := e.Execs.Add(c.Grant.Name, c.VM, h, e.Now())
		if err != nil {
			// The command runs but cannot be tracked; say so rather than hide it.
			return catalog.Failure(catalog.TagBackend, fmt.Sprintf("command started as pid %d but cannot be tracked: %v", h.PID, err), false)
		}
		out := map[string]any{"exec_id": id, "pid": h.PID}
		text := fmt.Sprintf("started pid %d; poll vm_agent_exec_status with exec_id %s", h.PID, id)
		if ms, ok := guestctl.StartedAt(c.Ctx, c.Driver, c.Name, h.PID); ok {
			out["started_at"] = ms
			text += fmt.Sprintf(" (started_at %d: pass it to kill_process with the pid)", ms)
		}
		return catalog.Success(out, text)
	}
	res, err := hypervisor.Run(c.Ctx, c.Driver, c.Name, req)
	if err != nil {
		r := catalog.DriverFailure(err)
		if r.Tag == catalog.TagTimedOut {
			r.Text = noResultText(secs, r.Text)
		}
		return r
	}
	return execResult(res, killedText(e, secs, ""))
}

// runSessionExec is vm_agent_exec with a session: vmgate-guest runs the
// command in the session's workdir and cgroup (or process group and
// marker), kills the whole tree on timeout and caps the output.
func runSessionExec(e *catalog.Env, c *catalog.Call, a *execArgs) catalog.Result {
	g := e.Guest
	h, r := g.HelperFor(c)
	if r != nil {
		return *r
	}
	id := *a.Session
	if _, r := g.LiveSession(c, id); r != nil {
		return *r
	}
	if r := resolveCwd(e, c, a); r != nil {
		return *r
	}
	return runInGuest(e, c, a, h, a.runRequest(e, id))
}

// runSandboxedExec is vm_agent_exec in a sandbox of its own (the policy's
// answer to the call's sandbox, or the sandbox it requires): vmgate-guest
// makes a session for the one command and destroys it, with whatever the
// command left, once it ends.
func runSandboxedExec(e *catalog.Env, c *catalog.Call, a *execArgs) catalog.Result {
	h, r := e.Guest.HelperFor(c)
	if r != nil {
		return *r
	}
	sb, r := wireSandbox(c.Rules.Sandbox)
	if r != nil {
		return *r
	}
	if r := resolveCwd(e, c, a); r != nil {
		return *r
	}
	req := a.runRequest(e, "")
	req.Sandbox = sb
	return runInGuest(e, c, a, h, req)
}

// runInGuest runs req through vmgate-guest: as a job of the resident
// helper with wait: false, else to its end.
func runInGuest(e *catalog.Env, c *catalog.Call, a *execArgs, h *guestctl.Helper, req guestctl.RunRequest) catalog.Result {
	if a.noWait() {
		return startJob(e, c, h, req)
	}
	secs := a.timeoutS(e.Limits)
	var res guestctl.RunResult
	var err error
	if c.Progress != nil {
		res, err = runReporting(c, h, req)
	} else {
		res, err = h.Run(c.Ctx, c.Name, req)
	}
	if err != nil {
		r := catalog.HelperFailure(err)
		if r.Tag == catalog.TagTimedOut {
			r.Text = noResultText(secs, r.Text)
		}
		return r
	}
	er := hypervisor.ExecResult{
		PID: int64(res.PID), Exited: true, ExitCode: res.ExitCode, Signal: res.Signal,
		Stdout: res.Stdout, Stderr: res.Stderr, StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		TimedOut: res.TimedOut,
	}
	out := execResult(er, killedText(e, secs, " (with every process it started)"))
	if m, ok := out.Structured.(map[string]any); ok {
		putGuestRun(m, req)
		m["duration_ms"] = res.DurationMS
		if res.Killed > 0 {
			m["killed"] = res.Killed
		}
		if deniedBySandbox(er) {
			note := SandboxNote + blockedNote(res.WriteBlocked)
			m["sandbox_note"] = note
			out.Text += "\n" + note
		}
	}
	return out
}

// putGuestRun says in m where req ran: its session, or a sandbox of its own.
func putGuestRun(m map[string]any, req guestctl.RunRequest) {
	if req.Session != "" {
		m["session"] = req.Session
	}
	if req.Sandbox != nil {
		m["sandboxed"] = true
	}
}

// checkTimeout refuses a timeout_s over the grant's cap: the policy's
// max_timeout_s, else the server's.
func checkTimeout(e *catalog.Env, c *catalog.Call, a *execArgs) *catalog.Result {
	limit, whose := e.Limits.MaxTimeoutS, "this server's cap (limits.max_timeout_s)"
	if c.Rules.MaxTimeoutS > 0 {
		limit, whose = c.Rules.MaxTimeoutS, "this grant's policy's cap (max_timeout_s)"
	}
	if a.TimeoutS <= limit {
		return nil
	}
	r := catalog.Failure(catalog.TagInvalid, fmt.Sprintf("timeout_s %d is over %s of %d s; a grant's policy can allow up to %d s (tools.vm_agent_exec.max_timeout_s)",
		a.TimeoutS, whose, limit, policy.MaxExecTimeoutS), true)
	return &r
}

// resolveCwd checks a's cwd in the guest (see the top of this file) and
// puts in its place the directory the command is to run in: the same, or
// the real directory the policy allowed when it follows symlinks. A cwd
// that is no directory, or that leads through a symlink the policy does
// not follow, ends the call before anything runs.
func resolveCwd(e *catalog.Env, c *catalog.Call, a *execArgs) *catalog.Result {
	if a.Cwd == nil {
		return nil
	}
	cwd := *a.Cwd
	h, r := e.Guest.HelperFor(c)
	if r != nil {
		return r
	}
	info, err := h.FileStat(c.Ctx, c.Name, cwd, c.FileRules().FollowSymlinks, false)
	if err != nil {
		r := cwdFailure(err)
		return &r
	}
	if info.Type != "dir" {
		r := catalog.Failure(catalog.TagInvalid, fmt.Sprintf("cwd %s is not a directory", info.Path), true)
		return &r
	}
	if info.Path != cwd {
		if r := e.Redecide(c, "cwd", info.Path); r != nil {
			return r
		}
		a.Cwd = &info.Path
	}
	return nil
}

// cwdFailure is fileFailure for a cwd: a symlink on the way is the policy's
// refusal, worded for a working directory.
func cwdFailure(err error) catalog.Result {
	r := fileFailure(err)
	if m, ok := r.Structured.(map[string]any); ok && m["refused"] == wire.ReasonSymlink {
		msg, _, _ := strings.Cut(r.Text, "; vmgate follows")
		r.Text = "cwd " + strings.TrimPrefix(msg, "refused: ") + "; vmgate enters no working directory through a symlink unless the policy lets vm_agent_exec follow symlinks (files.follow_symlinks)"
		m["message"] = r.Text
		return r
	}
	r.Text = "cwd: " + r.Text
	return r
}

// execStatusArgs are vm_agent_exec_status's arguments.
type execStatusArgs struct {
	ExecID string `arg:"exec_id"`
	Since  *struct {
		Stdout int64 `arg:"stdout"`
		Stderr int64 `arg:"stderr"`
	} `arg:"since"`
}

func runExecStatus(e *catalog.Env, c *catalog.Call, a *execStatusArgs) catalog.Result {
	x, ok := e.Execs.Get(a.ExecID, c.Grant.Name, c.VM)
	if !ok {
		if job, isJob := catalog.JobOf(a.ExecID); isJob {
			return jobStatus(e, c, a, execJob{ID: job}, false)
		}
		return unknownExec()
	}
	if x.Job != "" {
		return jobStatus(e, c, a, execJob{ID: x.Job, Session: x.Session}, true)
	}
	if a.Since != nil {
		return catalog.Failure(catalog.TagInvalid, "since is for a command in a session or sandbox, whose output is read while it runs; "+
			"this one runs through the guest agent, which hands its output over when it ends: poll without since", true)
	}
	res, err := c.Driver.ExecStatus(c.Ctx, c.Name, x.Handle)
	if err != nil {
		if errors.Is(err, hypervisor.ErrUnknownExec) {
			e.Execs.Remove(a.ExecID)
		}
		return catalog.DriverFailure(err)
	}
	if res.Exited {
		e.Execs.Remove(a.ExecID)
	}
	return execResult(res, "command killed after its timeout; give it a larger timeout_s next time")
}

// unknownExec is the one answer for an exec_id the caller may not read:
// it names each way a real one stops being known, not which applies (an
// id of another grant's is unknown as one that never existed is).
func unknownExec() catalog.Result {
	return catalog.Failure(catalog.TagInvalid, "unknown exec_id on this VM for this grant: a command run through the guest agent answers its final result once; "+
		"one in a session or sandbox is kept while the guest keeps it after its end, and one in a sandbox of its own is not found again after the server restarted "+
		"(run it in a session to be able to)", true)
}
