package server

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
)

// Commands: vm_agent_exec (through the driver's guest exec, or through
// vmgate-guest when it runs in a session) and vm_agent_exec_status (polling
// a command started with wait: false).
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

func execTool(l Limits) *toolSpec {
	return newTool(toolSpec{
		// Any command as root: it can change anything in the guest, and reach
		// whatever the guest's network reaches.
		name: "vm_agent_exec", title: "Run a command in a VM", destructive: true, openWorld: true,
		desc: "Run a command in a VM through its guest agent and return exit code, stdout and stderr. " +
			"Give exactly one of command (an argv array, run without a shell) or shell (a string run by /bin/sh -c). " +
			"The command is killed after timeout_s seconds (timed_out: true, partial output kept). " +
			"Output is capped per stream (stdout_truncated/stderr_truncated say so). " +
			"With wait: false it returns an exec_id at once (and the pid with its started_at, as kill_process takes them); poll it with vm_agent_exec_status.",
		fields: []field{
			vmField(true),
			{name: "command", kind: kindStringArray, desc: "Program and arguments, e.g. [\"ls\", \"-l\", \"/tmp\"]. No shell is involved.", maxLen: 4096},
			{name: "shell", kind: kindString, desc: "A shell command line, run as /bin/sh -c SHELL.", maxLen: 1 << 16},
			{name: "stdin", kind: kindString, desc: "Text written to the command's standard input, which is then closed.", allowNUL: true},
			{name: "env", kind: kindStringMap, desc: "Environment variables to add, name → value. VMGATE_* names are reserved.", maxLen: 256},
			{name: "cwd", kind: kindString, desc: "Working directory in the guest: an absolute, clean path (no \".\", \"..\", \"//\" or trailing \"/\"), entered following no symlink unless the policy allows following symlinks.", maxLen: 4096, guestPath: true},
			sessionField(),
			{name: "timeout_s", kind: kindInteger, desc: fmt.Sprintf("Seconds before the command is killed (default %d).", l.DefaultTimeoutS), min: 1, max: l.MaxTimeoutS, def: l.DefaultTimeoutS},
			{name: "max_output_bytes", kind: kindInteger, desc: fmt.Sprintf("Cap for each of stdout and stderr; the server caps it at %d.", l.MaxOutputBytes), min: 1, max: math.MaxInt64},
			{name: "wait", kind: kindBoolean, desc: "Wait for the command to finish (default true). false returns an exec_id to poll.", def: true},
		},
		exactlyOne: [][]string{{"command", "shell"}},
		output: []map[string]any{
			execShape(),
			oObject(map[string]any{"exec_id": oString, "pid": oInteger, "started_at": oInteger}, "exec_id", "pid"),
		},
	}, (*Server).runExec)
}

func execStatusTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_agent_exec_status", title: "Poll a command", readOnly: true,
		desc: "Poll a command started with vm_agent_exec wait: false. Returns exited: false (no exit_code) while it runs, " +
			"with the output so far when the guest agent hands it over, then the final exit code and output " +
			"(after which the exec_id is forgotten).",
		fields: []field{vmField(true), {name: "exec_id", kind: kindString, desc: "The exec_id vm_agent_exec returned.", required: true, maxLen: 128}},
		output: []map[string]any{execShape()},
	}, (*Server).runExecStatus)
}

// execShape is a command's result as execResult shows it: exit_code only
// once it exited; each stream as text or, when it is not text, base64.
func execShape() map[string]any {
	return oObject(map[string]any{
		"pid": oInteger, "exited": oBoolean, "exit_code": oInteger, "signal": oInteger,
		"stdout": oString, "stdout_base64": oString, "stderr": oString, "stderr_base64": oString,
		"stdout_truncated": oBoolean, "stderr_truncated": oBoolean, "timed_out": oBoolean,
		"session": oString, "duration_ms": oNonNeg, "killed": oNonNeg, "sandbox_note": oString,
	}, "pid", "exited", "stdout_truncated", "stderr_truncated", "timed_out")
}

// execArgs are vm_agent_exec's arguments, read once for both of its roads:
// the driver's own exec, and vmgate-guest's run when session is given.
// Exactly one of Command and Shell is set (the catalogue says so).
type execArgs struct {
	Command        []string          `arg:"command"`
	Shell          *string           `arg:"shell"`
	Stdin          *string           `arg:"stdin"`
	Env            map[string]string `arg:"env"`
	Cwd            *string           `arg:"cwd"`
	Session        *string           `arg:"session"` // given, even "": the command runs in that session or not at all
	TimeoutS       int64             `arg:"timeout_s"`
	MaxOutputBytes int64             `arg:"max_output_bytes"`
	Wait           *bool             `arg:"wait"`
}

// timeoutS is the command's timeout: timeout_s, or the server's default.
func (a *execArgs) timeoutS(l Limits) int64 {
	if a.TimeoutS > 0 {
		return a.TimeoutS
	}
	return l.DefaultTimeoutS
}

// deadline bounds the call: the command's own timeout plus room to collect
// its output (see toolSpec.deadline).
func (a *execArgs) deadline(l Limits) time.Duration {
	return time.Duration(a.timeoutS(l))*time.Second + execGrace
}

// noWait reports whether the caller asked for an exec_id instead of the result.
func (a *execArgs) noWait() bool { return a.Wait != nil && !*a.Wait }

// invalid is the first problem of a the catalogue's validator cannot see,
// or "".
func (a *execArgs) invalid() string {
	if a.Session != nil && a.noWait() {
		return "wait: false cannot be combined with session (commands in a session run to completion)"
	}
	return ""
}

// request is a as the driver's exec takes it: a shell runs as /bin/sh -c,
// the environment as sorted NAME=value pairs.
func (a *execArgs) request(s *Server) hypervisor.ExecRequest {
	req := hypervisor.ExecRequest{
		Argv:           a.Command,
		MaxOutputBytes: s.outputCap(a.MaxOutputBytes),
		Timeout:        time.Duration(a.timeoutS(s.limits)) * time.Second,
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
func (a *execArgs) runRequest(s *Server, id string) guestctl.RunRequest {
	req := guestctl.RunRequest{
		Session:        id,
		Argv:           a.Command,
		MaxOutputBytes: min(s.outputCap(a.MaxOutputBytes), wire.MaxOutputBytesLimit),
		TimeoutMS:      a.timeoutS(s.limits) * 1000,
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

func (s *Server) runExec(c *call, a *execArgs) result {
	if a.Session != nil {
		return s.runSessionExec(c, a)
	}
	if msg := a.invalid(); msg != "" {
		return failure(TagInvalid, msg, true)
	}
	if r := s.resolveCwd(c, a); r != nil {
		return *r
	}
	req := a.request(s)
	secs := a.timeoutS(s.limits)
	if a.noWait() {
		h, err := c.driver.ExecStart(c.ctx, c.name, req)
		if err != nil {
			return driverFailure(err)
		}
		id, err := s.execs.add(c.grant.Name, c.vm, h, s.now())
		if err != nil {
			// The command runs but cannot be tracked; say so rather than hide it.
			return failure(TagBackend, fmt.Sprintf("command started as pid %d but cannot be tracked: %v", h.PID, err), false)
		}
		out := map[string]any{"exec_id": id, "pid": h.PID}
		text := fmt.Sprintf("started pid %d; poll vm_agent_exec_status with exec_id %s", h.PID, id)
		if ms, ok := guestStartedAt(c, h.PID); ok {
			out["started_at"] = ms
			text += fmt.Sprintf(" (started_at %d: pass it to kill_process with the pid)", ms)
		}
		return success(out, text)
	}
	res, err := hypervisor.Run(c.ctx, c.driver, c.name, req)
	if err != nil {
		r := driverFailure(err)
		if r.tag == TagTimedOut {
			r.text = noResultText(secs, r.text)
		}
		return r
	}
	return execResult(res, s.killedText(secs, ""))
}

// runSessionExec is vm_agent_exec with a session: vmgate-guest runs the
// command in the session's workdir and cgroup (or process group and
// marker), kills the whole tree on timeout and caps the output.
func (s *Server) runSessionExec(c *call, a *execArgs) result {
	g := s.guest
	h, r := g.helperFor(c)
	if r != nil {
		return *r
	}
	if msg := a.invalid(); msg != "" {
		return failure(TagInvalid, msg, true)
	}
	id := *a.Session
	if _, r := g.liveSession(c, id); r != nil {
		return *r
	}
	if r := s.resolveCwd(c, a); r != nil {
		return *r
	}
	req := a.runRequest(s, id)
	secs := a.timeoutS(s.limits)
	res, err := h.Run(c.ctx, c.name, req)
	if err != nil {
		r := helperFailure(err)
		if r.tag == TagTimedOut {
			r.text = noResultText(secs, r.text)
		}
		return r
	}
	er := hypervisor.ExecResult{
		PID: int64(res.PID), Exited: true, ExitCode: res.ExitCode, Signal: res.Signal,
		Stdout: res.Stdout, Stderr: res.Stderr, StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		TimedOut: res.TimedOut,
	}
	out := execResult(er, s.killedText(secs, " (with every process it started)"))
	if m, ok := out.structured.(map[string]any); ok {
		m["session"] = id
		m["duration_ms"] = res.DurationMS
		if res.Killed > 0 {
			m["killed"] = res.Killed
		}
		if deniedBySandbox(er) {
			note := sandboxNote + blockedNote(res.WriteBlocked)
			m["sandbox_note"] = note
			out.text += "\n" + note
		}
	}
	return out
}

// resolveCwd checks a's cwd in the guest (see the top of this file) and
// puts in its place the directory the command is to run in: the same, or
// the real directory the policy allowed when it follows symlinks. A cwd
// that is no directory, or that leads through a symlink the policy does
// not follow, ends the call before anything runs.
func (s *Server) resolveCwd(c *call, a *execArgs) *result {
	if a.Cwd == nil {
		return nil
	}
	cwd := *a.Cwd
	h, r := s.guest.helperFor(c)
	if r != nil {
		return r
	}
	info, err := h.FileStat(c.ctx, c.name, cwd, c.fileRules().FollowSymlinks, false)
	if err != nil {
		r := cwdFailure(err)
		return &r
	}
	if info.Type != "dir" {
		r := failure(TagInvalid, fmt.Sprintf("cwd %s is not a directory", info.Path), true)
		return &r
	}
	if info.Path != cwd {
		if r := s.redecide(c, "cwd", info.Path); r != nil {
			return r
		}
		a.Cwd = &info.Path
	}
	return nil
}

// cwdFailure is fileFailure for a cwd: a symlink on the way is the policy's
// refusal, worded for a working directory.
func cwdFailure(err error) result {
	r := fileFailure(err)
	if m, ok := r.structured.(map[string]any); ok && m["refused"] == wire.ReasonSymlink {
		msg, _, _ := strings.Cut(r.text, "; vmgate follows")
		r.text = "cwd " + strings.TrimPrefix(msg, "refused: ") + "; vmgate enters no working directory through a symlink unless the policy lets vm_agent_exec follow symlinks (files.follow_symlinks)"
		m["message"] = r.text
		return r
	}
	r.text = "cwd: " + r.text
	return r
}

// sandboxNote explains a refusal a session's command met.
const sandboxNote = "note: sessions are sandboxed: a command may write only in the session's workdir and " +
	"temporary directory (and the policy's extra paths), as an unprivileged user, without network unless the " +
	"policy allows it; create_session and list_sessions say what this guest enforces"

// blockedNote names the write paths the guest says the session's uid
// cannot write for their own permissions (guest data: bounded, and quoted
// so that no control or bidirectional character reaches the agent raw).
func blockedNote(blocked []wire.BlockedPath) string {
	if len(blocked) == 0 {
		return ""
	}
	var parts []string
	for i, b := range blocked {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("and %d more", len(blocked)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%q (%q)", clip(b.Path, 256), clip(b.Reason, 200)))
	}
	return "; the policy lets it write " + strings.Join(parts, ", ") +
		", but the guest's own file permissions do not: change the owner or mode there (vm_agent_exec), or write elsewhere"
}

// clip cuts s to at most n bytes.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// deniedBySandbox reports whether a failed command's stderr says it was
// refused an access, which in a session is most likely the sandbox.
func deniedBySandbox(res hypervisor.ExecResult) bool {
	if res.ExitCode == 0 || res.TimedOut {
		return false
	}
	for _, s := range []string{"Permission denied", "Operation not permitted", "Read-only file system", "Network is unreachable"} {
		if bytes.Contains(res.Stderr, []byte(s)) {
			return true
		}
	}
	return false
}

// noResultText is the [TIMED OUT] text of a command whose result did not
// come back in time; reason is driverFailure's.
func noResultText(secs int64, reason string) string {
	return fmt.Sprintf("no result from the guest within %d s: %s; a long command can run with wait: false", secs, reason)
}

// killedText is the [TIMED OUT] text of a command its timeout killed.
func (s *Server) killedText(secs int64, what string) string {
	return fmt.Sprintf("command killed after %d s%s; give it more with timeout_s (up to %d) or run it with wait: false", secs, what, s.limits.MaxTimeoutS)
}

func execResult(res hypervisor.ExecResult, timeoutMsg string) result {
	out := map[string]any{
		"pid": res.PID, "exited": res.Exited,
		"stdout_truncated": res.StdoutTruncated, "stderr_truncated": res.StderrTruncated,
		"timed_out": res.TimedOut,
	}
	if res.Exited {
		// A running command has no exit code: none is made up.
		out["exit_code"] = res.ExitCode
	}
	if res.Signal != 0 {
		out["signal"] = res.Signal
	}
	// A running command's output so far, when the guest hands it over.
	if res.Exited || len(res.Stdout) > 0 {
		putBytes(out, "stdout", res.Stdout)
	}
	if res.Exited || len(res.Stderr) > 0 {
		putBytes(out, "stderr", res.Stderr)
	}
	var b strings.Builder
	switch {
	case !res.Exited && len(res.Stdout)+len(res.Stderr) == 0:
		fmt.Fprintf(&b, "running (pid %d); no output so far (some guest agents hand it over only when the command ends); poll again", res.PID)
	case !res.Exited:
		fmt.Fprintf(&b, "running (pid %d); output so far:", res.PID)
	case res.Signal != 0:
		fmt.Fprintf(&b, "killed by signal %d", res.Signal)
	default:
		fmt.Fprintf(&b, "exit %d", res.ExitCode)
	}
	section(&b, "stdout", res.Stdout, res.StdoutTruncated)
	section(&b, "stderr", res.Stderr, res.StderrTruncated)
	if res.TimedOut {
		return result{tag: TagTimedOut, text: timeoutMsg + "; partial output: " + b.String(), structured: out, detail: timeoutMsg}
	}
	return success(out, b.String())
}

// putBytes sets m[key] to a command's output as text when it is valid
// UTF-8 (NUL-separated output, find -print0 or /proc/P/cmdline, stays
// text), or m[key+"_base64"].
func putBytes(m map[string]any, key string, data []byte) {
	if utf8.Valid(data) {
		m[key] = string(data)
	} else {
		m[key+"_base64"] = base64.StdEncoding.EncodeToString(data)
	}
}

// isText reports whether a file's data is text: valid UTF-8 without NUL
// bytes (a NUL is valid UTF-8, and a binary file full of them would come
// back as "\u0000…"; like git and file(1), a NUL says binary).
func isText(data []byte) bool {
	return utf8.Valid(data) && bytes.IndexByte(data, 0) < 0
}

func section(b *strings.Builder, name string, data []byte, truncated bool) {
	if len(data) == 0 {
		return
	}
	fmt.Fprintf(b, "\n--- %s", name)
	if truncated {
		b.WriteString(" (truncated)")
	}
	b.WriteString(" ---\n")
	if utf8.Valid(data) {
		b.Write(data)
	} else {
		fmt.Fprintf(b, "(%d bytes of binary data, see %s_base64)", len(data), name)
	}
}

// execStatusArgs are vm_agent_exec_status's arguments.
type execStatusArgs struct {
	ExecID string `arg:"exec_id"`
}

func (s *Server) runExecStatus(c *call, a *execStatusArgs) result {
	e, ok := s.execs.get(a.ExecID, c.grant.Name, c.vm)
	if !ok {
		return failure(TagInvalid, "unknown exec_id (finished results are returned once)", true)
	}
	res, err := c.driver.ExecStatus(c.ctx, c.name, e.handle)
	if err != nil {
		if errors.Is(err, hypervisor.ErrUnknownExec) {
			s.execs.remove(a.ExecID)
		}
		return driverFailure(err)
	}
	if res.Exited {
		s.execs.remove(a.ExecID)
	}
	return execResult(res, "command killed after its timeout; give it a larger timeout_s next time")
}

// execTable remembers commands started with wait: false. Ids are minted
// here (random) and bound to the grant and VM that started the command.
type execTable struct {
	mu sync.Mutex // guards m
	m  map[string]execEntry
}

type execEntry struct {
	grant, vm string
	handle    hypervisor.ExecHandle
	created   time.Time
}

const (
	maxExecs   = 4096
	execMaxAge = 24 * time.Hour
)

func (t *execTable) add(grant, vm string, h hypervisor.ExecHandle, now time.Time) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]execEntry)
	}
	if len(t.m) >= maxExecs {
		for id, e := range t.m {
			if now.Sub(e.created) > execMaxAge {
				delete(t.m, id)
			}
		}
		if len(t.m) >= maxExecs {
			return "", errors.New("too many commands nobody polled")
		}
	}
	id := "x" + rand.Text()
	t.m[id] = execEntry{grant: grant, vm: vm, handle: h, created: now}
	return id, nil
}

// get finds id for grant and vm; another grant's id does not exist.
func (t *execTable) get(id, grant, vm string) (execEntry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[id]
	if !ok || e.grant != grant || e.vm != vm {
		return execEntry{}, false
	}
	return e, true
}

func (t *execTable) remove(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, id)
}

// userHZ is the clock tick of /proc times on every Linux vmgate runs
// commands in (amd64, arm64: USER_HZ is 100), as guest/agent/procfs.go.
const userHZ = 100

// guestStartedAt is the start time of pid in the guest in ms since the Unix
// epoch, as list_processes shows it and kill_process's started_at takes it
// (the guest's clock, not the host's): /proc/PID/stat's starttime after
// /proc/stat's btime, read through the driver's file channel. ok is false
// when the guest cannot tell (the command already ended, no procfs).
func guestStartedAt(c *call, pid int64) (ms int64, ok bool) {
	stat, err := c.driver.FileRead(c.ctx, c.name, "/proc/"+strconv.FormatInt(pid, 10)+"/stat", 4096)
	if err != nil {
		return 0, false
	}
	ticks, ok := statStartTicks(stat.Data)
	if !ok {
		return 0, false
	}
	boot, err := c.driver.FileRead(c.ctx, c.name, "/proc/stat", 1<<16)
	if err != nil {
		return 0, false
	}
	btime, ok := procBootTime(boot.Data)
	if !ok {
		return 0, false
	}
	return btime*1000 + ticks*1000/userHZ, true
}

// statStartTicks is field 22 (starttime) of /proc/P/stat: the 20th after
// the command name, which may hold spaces and parentheses (so the fields
// are counted from the last ')').
func statStartTicks(b []byte) (int64, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// procBootTime is the btime line of /proc/stat: the boot time in s since
// the Unix epoch.
func procBootTime(b []byte) (int64, bool) {
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil && n > 0
		}
	}
	return 0, false
}
