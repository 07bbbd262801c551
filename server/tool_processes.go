package server

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
)

// Processes: list_processes and kill_process, through vmgate-guest, whose
// kill guards (pid 1, kernel threads, the guest agent, vmgate-guest itself,
// a reused pid) answer "[INVALID ARGUMENT] refused: <reason>" with the
// reason in the structured result's "refused" field.

// MaxPID is the largest pid a Linux guest can have (PID_MAX_LIMIT).
const MaxPID = 4194304

// Signals are the signals kill_process accepts.
var Signals = []string{"TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT"}

// maxProcessRows bounds the rows list_processes puts in its text (the
// structured result has them all).
const maxProcessRows = 200

func listProcessesTool() *toolSpec {
	return newTool(toolSpec{
		name: "list_processes", title: "List processes", readOnly: true, idempotent: true,
		desc:   "List the processes in a VM (pid, name, user, start time), optionally only those of one session. vmgate installs its vmgate-guest helper in the VM on first use.",
		fields: []field{vmField(true), sessionField()},
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
			{name: "signal", kind: kindString, desc: "Signal name without SIG (default TERM).", enum: Signals},
			{name: "started_at", kind: kindInteger, desc: "The process start time from list_processes (ms since the Unix epoch); the kill is refused when the pid now belongs to another process.", min: 1, max: math.MaxInt64},
		},
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
	if procs == nil {
		procs = []guestctl.Process{}
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

// killArgs are kill_process's arguments.
type killArgs struct {
	PID       int64  `arg:"pid"`
	Signal    string `arg:"signal"`     // "": TERM
	StartedAt int64  `arg:"started_at"` // 0: not checked
}

// signal is the signal to send: signal, or TERM.
func (a *killArgs) signal() string {
	if a.Signal == "" {
		return "TERM"
	}
	return a.Signal
}

func (s *Server) runKillProcess(c *call, a *killArgs) result {
	pid, sig, startedAt := a.PID, a.signal(), a.StartedAt
	if pid < 2 {
		return refused(pid, wire.ReasonInit)
	}
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
		if errors.Is(err, guestctl.ErrNotFound) {
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

// killScript runs in the guest as /bin/sh -c killScript vmgate-kill PID SIG
// WAIT: the pid and signal are positional parameters, never spliced into
// the script. It refuses kernel threads (PF_KTHREAD in /proc/PID/stat) and
// the guest agents, sends the signal, then polls up to WAIT tenths of a
// second for the process to go (or become a zombie).
const killScript = `pid=$1 sig=$2 tries=$3
st=$(cat /proc/$pid/stat 2>/dev/null) || { echo nosuch; exit 0; }
set -- ${st##*) }
if [ $(( $7 & 2097152 )) -ne 0 ]; then echo kthread; exit 0; fi
case "$(cat /proc/$pid/comm 2>/dev/null)" in qemu-ga|vmgate-guest) echo agent; exit 0;; esac
kill -"$sig" "$pid" 2>/dev/null || { echo killfail; exit 0; }
i=0
while :; do
  st=$(cat /proc/$pid/stat 2>/dev/null) || { echo exited; exit 0; }
  set -- ${st##*) }
  [ "$1" = Z ] && { echo exited; exit 0; }
  [ $i -ge $tries ] && { echo running; exit 0; }
  sleep 0.1 2>/dev/null || sleep 1
  i=$((i+1))
done`

// runKill is kill_process without the helper: runKillProcess falls back
// to it on a host without vmgate-guest builds, with pid (already checked
// to be above 1) and sig (defaulted) taken from the call's arguments.
func (s *Server) runKill(c *call, pid int64, sig string) result {
	tries := "30"
	if sig == "STOP" || sig == "CONT" {
		tries = "0"
	}
	req := hypervisor.ExecRequest{
		Argv:           []string{"/bin/sh", "-c", killScript, "vmgate-kill", strconv.FormatInt(pid, 10), sig, tries},
		Timeout:        20 * time.Second,
		MaxOutputBytes: 4096,
	}
	res, err := hypervisor.Run(c.ctx, c.driver, c.name, req)
	if err != nil {
		return driverFailure(err)
	}
	word := strings.TrimSpace(string(res.Stdout))
	out := map[string]any{"pid": pid, "signal": sig}
	switch word {
	case "nosuch":
		return failure(TagInvalid, fmt.Sprintf("no process %d in %s", pid, c.vm), true)
	case "kthread":
		return refused(pid, wire.ReasonKernelThread)
	case "agent":
		return refused(pid, wire.ReasonGuestAgent)
	case "killfail":
		return failure(TagBackend, fmt.Sprintf("kill -%s %d failed in the guest", sig, pid), true)
	case "exited":
		out["exited"] = true
		return success(out, fmt.Sprintf("sent SIG%s to %d; it exited", sig, pid))
	case "running":
		out["exited"] = false
		return success(out, fmt.Sprintf("sent SIG%s to %d; it is still running", sig, pid))
	}
	r := failure(TagBackend, "unexpected answer from the guest", false)
	r.detail = fmt.Sprintf("kill script: exit %d stdout %q stderr %q", res.ExitCode, truncate(string(res.Stdout), 200), truncate(string(res.Stderr), 200))
	return r
}
