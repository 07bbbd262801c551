package tools

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/catalog"
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

// signals are the signals kill_process accepts.
func signals() []string {
	return []string{"TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT"}
}

// defaultSignal is kill_process's signal when the call gives none.
const defaultSignal = "TERM"

// maxProcessRows bounds the rows list_processes puts in its text (the
// structured result has them all).
const maxProcessRows = 200

func listProcessesTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "list_processes", Title: "List processes", ReadOnly: true, Idempotent: true,
		Desc:   "List the processes in a VM (pid, name, user, start time), optionally only those of one session; other grants' sessions' processes are left out. vmgate installs its vmgate-guest helper in the VM on first use.",
		Fields: []catalog.Field{catalog.VMField(true), catalog.SessionField()},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vm": catalog.OString(), "session": catalog.OString(),
			"processes": catalog.OArray(catalog.OObject(map[string]any{
				"pid": catalog.OInteger(), "ppid": catalog.OInteger(), "user": catalog.OString(), "name": catalog.OString(), "cmdline": catalog.OString(),
				"started_at": catalog.OInteger(), "state": catalog.OString(), "rss_bytes": catalog.ONonNeg(), "cpu_percent": catalog.ONumber(), "session": catalog.OString(),
			}, "pid", "ppid", "name", "started_at", "state")),
		}, "vm", "processes")},
	}, runListProcesses)
}

func killProcessTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "kill_process", Title: "Signal a process", Destructive: true,
		Desc: "Send a signal (default TERM) to a process in a VM and report whether it exited. " +
			"pid 1, kernel threads, the guest agent and vmgate-guest are refused ([INVALID ARGUMENT] refused: <reason>), " +
			"and so is a pid that no longer has the given started_at.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "pid", Kind: catalog.KindInteger, Desc: "Process id in the guest (from list_processes or vm_agent_exec).", Required: true, Min: 1, Max: MaxPID},
			{Name: "signal", Kind: catalog.KindString, Desc: "Signal name without SIG (default TERM).", Enum: signals(), Default: defaultSignal},
			{Name: "started_at", Kind: catalog.KindInteger, Desc: "The process start time in ms since the Unix epoch, as list_processes and vm_agent_exec (wait: false) return it; the kill is refused when the pid now belongs to another process.", Min: 1, Max: math.MaxInt64},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"pid": catalog.OInteger(), "signal": catalog.OString(), "exited": catalog.OBoolean(), "waited_ms": catalog.ONonNeg(), "state": catalog.OString(),
		}, "pid", "signal", "exited")},
	}, runKillProcess)
}

// listProcessesArgs are list_processes' arguments.
type listProcessesArgs struct {
	Session string `arg:"session"` // "": every process
}

func runListProcesses(e *catalog.Env, c *catalog.Call, a *listProcessesArgs) catalog.Result {
	g := e.Guest
	h, r := g.HelperFor(c)
	if r != nil {
		return *r
	}
	session := a.Session
	if session != "" {
		if _, r := g.LiveSession(c, session); r != nil {
			return *r
		}
	}
	procs, err := h.PS(c.Ctx, c.Name, session)
	if err != nil {
		return catalog.HelperFailure(err)
	}
	procs, r = visibleProcesses(g, c, procs)
	if r != nil {
		return *r
	}
	out := map[string]any{"vm": c.VM, "processes": procs}
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
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%s\n", p.PID, p.PPID, p.User, p.State, p.StartedAt, catalog.Truncate(cmd, 120))
	}
	tw.Flush()
	return catalog.Success(out, strings.TrimRight(b.String(), "\n"))
}

// visibleProcesses keeps of procs what c's grant may see: every process
// outside a session, and those of its own sessions on this VM (a deleted
// one's too: a daemon that outlived it). The processes of another grant's
// session, or of a session the store does not know, are left out whole,
// command line and all: another grant's sessions are "unknown" to this one.
func visibleProcesses(g *catalog.Guest, c *catalog.Call, procs []guestctl.Process) ([]guestctl.Process, *catalog.Result) {
	mine := map[string]bool{}
	out := make([]guestctl.Process, 0, len(procs))
	for _, p := range procs {
		if p.Session != "" {
			ok, seen := mine[p.Session]
			if !seen {
				_, r := g.OwnedSession(c, p.Session)
				if r != nil && r.Tag != catalog.TagInvalid { // the store did not answer
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
func runKillProcess(e *catalog.Env, c *catalog.Call, a *killArgs) catalog.Result {
	h, r := e.Guest.HelperFor(c)
	if r != nil {
		return *r
	}
	kr, err := h.Kill(c.Ctx, c.Name, int(a.PID), a.signal(), a.StartedAt)
	if err != nil {
		r := catalog.HelperFailure(err)
		if errors.Is(err, guestctl.ErrNotFound) {
			r.Text = fmt.Sprintf("no process %d in %s", a.PID, c.VM)
		}
		if m, ok := r.Structured.(map[string]any); ok {
			m["pid"] = a.PID
		}
		return r
	}
	out := map[string]any{"pid": kr.PID, "signal": kr.Signal, "exited": kr.Exited, "waited_ms": kr.WaitedMS}
	if kr.State != "" {
		out["state"] = kr.State
	}
	if kr.Exited {
		return catalog.Success(out, fmt.Sprintf("sent SIG%s to %d; it exited", kr.Signal, kr.PID))
	}
	return catalog.Success(out, fmt.Sprintf("sent SIG%s to %d; it is still running (state %s)", kr.Signal, kr.PID, kr.State))
}
