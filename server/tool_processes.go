package server

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/vmgate/vmgate/internal/guestctl"
)

// Processes: list_processes and kill_process, through vmgate-guest. The
// kill guards (pid 1, kernel threads, the guest agent, vmgate-guest itself
// and its ancestors, a reused pid) live in the guest agent only
// (guest/agent/kill.go), which knows what a process is; their refusals are
// not policy decisions but "[INVALID ARGUMENT] refused: <reason>", with the
// reason in the structured result's "refused" field. Without vmgate-guest
// there is no kill_process: it says what is needed.

// MaxPID is the largest pid a Linux guest can have (PID_MAX_LIMIT).
const MaxPID = 4194304

// Signals are the signals kill_process accepts.
var Signals = []string{"TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT"}

// defaultSignal is kill_process's signal when the call gives none.
const defaultSignal = "TERM"

// maxProcessRows bounds the rows list_processes puts in its text (the
// structured result has them all).
const maxProcessRows = 200

func listProcessesTool() *toolSpec {
	return newTool(toolSpec{
		name: "list_processes", title: "List processes", readOnly: true, idempotent: true,
		desc:   "List the processes in a VM (pid, name, user, start time), optionally only those of one session; other grants' sessions' processes are left out. vmgate installs its vmgate-guest helper in the VM on first use.",
		fields: []field{vmField(true), sessionField()},
		output: []map[string]any{oObject(map[string]any{
			"vm": oString, "session": oString,
			"processes": oArray(oObject(map[string]any{
				"pid": oInteger, "ppid": oInteger, "user": oString, "name": oString, "cmdline": oString,
				"started_at": oInteger, "state": oString, "rss_bytes": oNonNeg, "cpu_percent": oNumber, "session": oString,
			}, "pid", "ppid", "name", "started_at", "state")),
		}, "vm", "processes")},
	}, (*Server).runListProcesses)
}

func killProcessTool() *toolSpec {
	return newTool(toolSpec{
		name: "kill_process", title: "Signal a process", destructive: true,
		desc: "Send a signal (default TERM) to a process in a VM and report whether it exited. " +
			"pid 1, kernel threads, the guest agent and vmgate-guest are refused ([INVALID ARGUMENT] refused: <reason>), " +
			"and so is a pid that no longer has the given started_at.",
		fields: []field{
			vmField(true),
			{name: "pid", kind: kindInteger, desc: "Process id in the guest (from list_processes or vm_agent_exec).", required: true, min: 1, max: MaxPID},
			{name: "signal", kind: kindString, desc: "Signal name without SIG (default TERM).", enum: Signals, def: defaultSignal},
			{name: "started_at", kind: kindInteger, desc: "The process start time in ms since the Unix epoch, as list_processes and vm_agent_exec (wait: false) return it; the kill is refused when the pid now belongs to another process.", min: 1, max: math.MaxInt64},
		},
		output: []map[string]any{oObject(map[string]any{
			"pid": oInteger, "signal": oString, "exited": oBoolean, "waited_ms": oNonNeg, "state": oString,
		}, "pid", "signal", "exited")},
	}, (*Server).runKillProcess)
}

// listProcessesArgs are list_processes' arguments.
type listProcessesArgs struct {
	Session string `arg:"session"` // "": every process
}

func (s *Server) runListProcesses(c *call, a *listProcessesArgs) result {
	g := s.guest
	h, r := g.helperFor(c)
	if r != nil {
		return *r
	}
	session := a.Session
	if session != "" {
		if _, r := g.liveSession(c, session); r != nil {
			return *r
		}
	}
	procs, err := h.PS(c.ctx, c.name, session)
	if err != nil {
		return helperFailure(err)
	}
	procs, r = g.visibleProcesses(c, procs)
	if r != nil {
		return *r
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

// visibleProcesses keeps of procs what c's grant may see: every process
// outside a session, and those of its own sessions on this VM (a deleted
// one's too: a daemon that outlived it). The processes of another grant's
// session, or of a session the store does not know, are left out whole,
// command line and all: another grant's sessions are "unknown" to this one.
func (g *guestTools) visibleProcesses(c *call, procs []guestctl.Process) ([]guestctl.Process, *result) {
	mine := map[string]bool{}
	out := make([]guestctl.Process, 0, len(procs))
	for _, p := range procs {
		if p.Session != "" {
			ok, seen := mine[p.Session]
			if !seen {
				_, r := g.ownedSession(c, p.Session)
				if r != nil && r.tag != TagInvalid { // the store did not answer
					return nil, r
				}
				ok = r == nil
				mine[p.Session] = ok
			}
			if !ok {
				continue
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// killArgs are kill_process's arguments.
type killArgs struct {
	PID       int64  `arg:"pid"`
	Signal    string `arg:"signal"`     // "": TERM
	StartedAt int64  `arg:"started_at"` // 0: not checked
}

// signal is the signal to send: signal, or its default.
func (a *killArgs) signal() string {
	if a.Signal == "" {
		return defaultSignal
	}
	return a.Signal
}

// runKillProcess asks vmgate-guest to signal the process. The guards are
// the guest's (guest/agent/kill.go): the host only validated the arguments
// (pid range, signal name, started_at), and maps a refusal to its tag.
func (s *Server) runKillProcess(c *call, a *killArgs) result {
	h, r := s.guest.helperFor(c)
	if r != nil {
		return *r
	}
	kr, err := h.Kill(c.ctx, c.name, int(a.PID), a.signal(), a.StartedAt)
	if err != nil {
		r := helperFailure(err)
		if errors.Is(err, guestctl.ErrNotFound) {
			r.text = fmt.Sprintf("no process %d in %s", a.PID, c.vm)
		}
		if m, ok := r.structured.(map[string]any); ok {
			m["pid"] = a.PID
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
