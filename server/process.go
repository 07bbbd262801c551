package server

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/guest/helper"
	"github.com/vmgate/vmgate/hypervisor"
)

// maxProcessRows bounds the rows list_processes puts in its text (the
// structured result has them all).
const maxProcessRows = 200

func (s *Server) runListProcesses(c *call) result {
	g := s.guest
	h, r := g.helperFor(c)
	if r != nil {
		return *r
	}
	session, _ := c.args["session"].(string)
	if session != "" {
		if _, r := g.liveSession(c, session); r != nil {
			return *r
		}
	}
	procs, err := h.PS(c.ctx, c.name, session)
	if err != nil {
		return helperFailure(err)
	}
	if procs == nil {
		procs = []helper.Process{}
	}
	out := map[string]any{"vm": c.vm, "processes": procs}
	if session != "" {
		out["session"] = session
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d process(es)", len(procs))
	if session != "" {
		fmt.Fprintf(&b, " in session %s", session)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 1, ' ', 0)
	fmt.Fprintln(tw, "PID\tPPID\tUSER\tSTATE\tSTARTED_AT\tCOMMAND")
	for i, p := range procs {
		if i == maxProcessRows {
			fmt.Fprintf(tw, "…\t%d more in the structured result\n", len(procs)-i)
			break
		}
		cmd := p.Cmdline
		if cmd == "" {
			cmd = "[" + p.Name + "]"
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%s\n", p.PID, p.PPID, p.User, p.State, p.StartedAt, truncate(cmd, 120))
	}
	tw.Flush()
	return success(out, strings.TrimRight(b.String(), "\n"))
}

func (s *Server) runKillProcess(c *call) result {
	pid := c.args["pid"].(int64)
	sig := "TERM"
	if v, ok := c.args["signal"].(string); ok {
		sig = v
	}
	if pid < 2 {
		return refused(pid, wire.ReasonInit)
	}
	startedAt, _ := c.args["started_at"].(int64)
	if !s.guest.available() {
		// Without the helper the guarded shell script is the fallback; it
		// cannot check a start time.
		if startedAt != 0 {
			return failure(TagBackend, "started_at checks need the vmgate-guest helper: "+errNoHelper, true)
		}
		return s.runKill(c, pid, sig)
	}
	h := s.guest.helpers[c.backend]
	kr, err := h.Kill(c.ctx, c.name, int(pid), sig, startedAt)
	if err != nil {
		r := helperFailure(err)
		if errors.Is(err, helper.ErrNotFound) {
			r.text = fmt.Sprintf("no process %d in %s", pid, c.vm)
		}
		if m, ok := r.structured.(map[string]any); ok {
			m["pid"] = pid
		}
		return r
	}
	out := map[string]any{"pid": kr.PID, "signal": kr.Signal, "exited": kr.Exited, "waited_ms": kr.WaitedMS}
	if kr.State != "" {
		out["state"] = kr.State
	}
	if kr.Exited {
		return success(out, fmt.Sprintf("sent SIG%s to %d; it exited", kr.Signal, kr.PID))
	}
	return success(out, fmt.Sprintf("sent SIG%s to %d; it is still running (state %s)", kr.Signal, kr.PID, kr.State))
}

// refused is a guard's refusal found on the host.
func refused(pid int64, reason string) result {
	r := failure(TagInvalid, "refused: "+reason, true)
	r.structured = map[string]any{"error": strings.Trim(TagInvalid, "[]"), "message": r.text, "refused": reason, "pid": pid}
	return r
}

// runSessionExec is vm_agent_exec with a session: vmgate-guest runs the
// command in the session's workdir and cgroup (or process group and
// marker), kills the whole tree on timeout and caps the output.
func (s *Server) runSessionExec(c *call) result {
	g := s.guest
	h, r := g.helperFor(c)
	if r != nil {
		return *r
	}
	id := c.args["session"].(string)
	if wait, ok := c.args["wait"].(bool); ok && !wait {
		return failure(TagInvalid, "wait: false cannot be combined with session (commands in a session run to completion)", true)
	}
	req := helper.RunRequest{Session: id, MaxOutputBytes: min(s.outputCap(c.args["max_output_bytes"]), wire.MaxOutputBytesLimit)}
	if cmd, ok := c.args["command"].([]any); ok {
		for _, a := range cmd {
			req.Argv = append(req.Argv, a.(string))
		}
	} else {
		req.Shell = c.args["shell"].(string)
	}
	if cwd, ok := c.args["cwd"].(string); ok {
		if !strings.HasPrefix(cwd, "/") {
			return failure(TagInvalid, "cwd must be an absolute path", true)
		}
		req.Cwd = cwd
	}
	if env, ok := c.args["env"].(map[string]any); ok {
		req.Env = make(map[string]string, len(env))
		for k, v := range env {
			if k == "VMGATE_SESSION" {
				return failure(TagInvalid, "env: VMGATE_SESSION is set by vmgate", true)
			}
			req.Env[k] = v.(string)
		}
	}
	if stdin, ok := c.args["stdin"].(string); ok {
		req.Stdin = []byte(stdin)
	}
	secs := s.limits.DefaultTimeoutS
	if v, ok := c.args["timeout_s"].(int64); ok {
		secs = v
	}
	req.TimeoutMS = secs * 1000
	if _, r := g.liveSession(c, id); r != nil {
		return *r
	}
	res, err := h.Run(c.ctx, c.name, req)
	if err != nil {
		r := helperFailure(err)
		if r.tag == TagTimedOut {
			r.text = fmt.Sprintf("no result from the guest within %d s", secs)
		}
		return r
	}
	er := hypervisor.ExecResult{
		PID: int64(res.PID), Exited: true, ExitCode: res.ExitCode, Signal: res.Signal,
		Stdout: res.Stdout, Stderr: res.Stderr, StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		TimedOut: res.TimedOut,
	}
	out := execResult(er, fmt.Sprintf("command killed after %d s (with every process it started)", secs))
	if m, ok := out.structured.(map[string]any); ok {
		m["session"] = id
		m["duration_ms"] = res.DurationMS
		if res.Killed > 0 {
			m["killed"] = res.Killed
		}
	}
	return out
}
