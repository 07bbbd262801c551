package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
)

// result is what a tool handler produced.
type result struct {
	tag        string // "" on success, else one of the Tag constants
	text       string // the short text shown to the agent (after the tag)
	structured any
	// noEffect says the call failed before anything could have changed in
	// a VM, so its reservations are refunded.
	noEffect bool
	detail   string // for the audit log only
}

func (r result) mcp() *mcp.CallToolResult {
	if r.tag != "" {
		res := errorResult(r.tag, r.text, nil)
		if r.structured != nil {
			res.StructuredContent = r.structured
		}
		return res
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{mcp.NewTextContent(r.text)},
		StructuredContent: r.structured,
	}
}

func (r *result) outcomeName() string {
	switch r.tag {
	case "":
		return "ok"
	case TagTimedOut:
		return "timed_out"
	}
	return "error"
}

// errorResult is an isError tool result whose text starts with tag.
func errorResult(tag, msg string, extra map[string]any) *mcp.CallToolResult {
	sc := map[string]any{"error": strings.Trim(tag, "[]"), "message": msg}
	for k, v := range extra {
		sc[k] = v
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{mcp.NewTextContent(tag + " " + msg)},
		StructuredContent: sc,
		IsError:           true,
	}
}

func success(structured any, text string) result { return result{text: text, structured: structured} }

func failure(tag, msg string, noEffect bool) result {
	return result{tag: tag, text: msg, noEffect: noEffect, detail: msg}
}

// driverFailure maps a driver error to a tagged result; the full error goes
// to the audit log only.
func driverFailure(err error) result {
	r := result{tag: TagBackend, detail: err.Error()}
	var cd *hypervisor.CommandDisabledError
	switch {
	case errors.Is(err, hypervisor.ErrUnknownVM):
		r.tag, r.text, r.noEffect = TagUnknownVM, "the backend has no such VM", true
	case errors.Is(err, hypervisor.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		r.tag, r.text = TagTimedOut, "the VM did not answer in time"
	case errors.Is(err, hypervisor.ErrInvalidArgument):
		r.tag, r.text, r.noEffect = TagInvalid, "the backend refused the arguments", true
	case errors.As(err, &cd):
		r.text, r.noEffect = cd.Error(), true
	case errors.Is(err, hypervisor.ErrAgentUnavailable):
		r.text = "the guest agent does not answer (is the VM running, with its agent?)"
	case errors.Is(err, hypervisor.ErrVMNotRunning):
		r.text, r.noEffect = "the VM is not running", true
	case errors.Is(err, hypervisor.ErrNotSupported):
		r.text, r.noEffect = "this backend cannot do that", true
	case errors.Is(err, hypervisor.ErrUnknownExec):
		// Exec handles come from the guest through the server (a client's
		// unknown exec_id is refused before any driver call): the agent
		// lost a command it started, and the command may have run.
		r.text = "the guest agent lost this command (was the agent restarted?); its result is unknown"
	case errors.Is(err, hypervisor.ErrPluginExited):
		// The plugin is restarted in the background: a retry can work.
		r.text = "the backend's driver process exited; retry"
		var ee *hypervisor.ExitedError
		if errors.As(err, &ee) && ee.Driver != "" {
			r.text = "driver " + ee.Driver + " exited; retry"
		}
	case errors.Is(err, context.Canceled):
		r.text = "the call was cancelled"
	case errors.Is(err, hypervisor.ErrBackend):
		// The driver vouches that the message is the backend's reason,
		// cleaned of secrets.
		r.text = backendReason(err.Error())
	default:
		r.text = "the backend failed (details in the audit log)"
	}
	return r
}

// maxReason bounds a backend's reason shown to the agent.
const maxReason = 400

// backendReason cuts a backend's reason to one line of sensible length.
func backendReason(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > maxReason {
		cut := maxReason
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return msg
}

type vmEntry struct {
	ID    string           `json:"id"`
	State hypervisor.State `json:"state"`
	Info  string           `json:"info,omitempty"`
	Agent bool             `json:"agent,omitempty"`
}

func (s *Server) runListVMs(c *call) result {
	names := make([]string, 0, len(s.backends))
	for n := range s.backends {
		names = append(names, n)
	}
	sort.Strings(names)
	vms := []vmEntry{}
	var errs []map[string]string
	var details []string
	for _, b := range names {
		list, err := s.backends[b].ListVMs(c.ctx)
		if err != nil {
			errs = append(errs, map[string]string{"backend": b, "error": driverFailure(err).text})
			details = append(details, b+": "+err.Error())
			continue
		}
		for _, vm := range list {
			id := b + "/" + vm.Name
			if !validVMID(id) {
				s.log.Warn("server: list_vms leaves out a VM whose name vmgate refuses", "backend", b, "name", truncate(vm.Name, 128))
				continue
			}
			if c.grant.vmVisible(id) {
				vms = append(vms, vmEntry{ID: id, State: vm.State, Info: vm.Info, Agent: vm.Agent})
			}
		}
	}
	if len(errs) > 0 && len(errs) == len(names) {
		r := failure(TagBackend, "no backend answered", false)
		r.detail = strings.Join(details, "; ")
		return r
	}
	out := map[string]any{"vms": vms}
	if errs != nil {
		out["errors"] = errs
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d VM(s)", len(vms))
	for _, vm := range vms {
		fmt.Fprintf(&b, "\n%s %s", vm.ID, vm.State)
	}
	for _, e := range errs {
		fmt.Fprintf(&b, "\nbackend %s: %s", e["backend"], e["error"])
	}
	r := success(out, b.String())
	r.detail = strings.Join(details, "; ")
	return r
}

func (s *Server) runStatus(c *call) result {
	st, err := c.driver.Status(c.ctx, c.name)
	if err != nil {
		return driverFailure(err)
	}
	out := map[string]any{
		"vm": c.vm, "state": st.State, "agent_connected": st.AgentConnected,
		"agent_version": st.AgentVersion, "detail": st.Detail,
	}
	agent := "agent not answering"
	if st.AgentConnected {
		agent = "agent connected"
	}
	return success(out, fmt.Sprintf("%s: %s, %s", c.vm, st.State, agent))
}

// outputCap clamps a client's cap to the server's: never raised.
func (s *Server) outputCap(v any) int64 {
	if n, ok := v.(int64); ok && n > 0 {
		return min(n, s.limits.MaxOutputBytes)
	}
	return s.limits.MaxOutputBytes
}

func (s *Server) runExec(c *call) result {
	if _, ok := c.args["session"]; ok {
		return s.runSessionExec(c)
	}
	var argv []string
	if cmd, ok := c.args["command"].([]any); ok {
		for _, a := range cmd {
			argv = append(argv, a.(string))
		}
	} else {
		argv = []string{"/bin/sh", "-c", c.args["shell"].(string)}
	}
	req := hypervisor.ExecRequest{Argv: argv, MaxOutputBytes: s.outputCap(c.args["max_output_bytes"])}
	if cwd, ok := c.args["cwd"].(string); ok {
		if !strings.HasPrefix(cwd, "/") {
			return failure(TagInvalid, "cwd must be an absolute path", true)
		}
		req.Cwd = cwd
	}
	if env, ok := c.args["env"].(map[string]any); ok {
		for k, v := range env {
			req.Env = append(req.Env, k+"="+v.(string))
		}
		slices.Sort(req.Env)
	}
	if stdin, ok := c.args["stdin"].(string); ok {
		req.Stdin = []byte(stdin)
	}
	secs := s.limits.DefaultTimeoutS
	if v, ok := c.args["timeout_s"].(int64); ok {
		secs = v
	}
	req.Timeout = time.Duration(secs) * time.Second
	if wait, ok := c.args["wait"].(bool); ok && !wait {
		h, err := c.driver.ExecStart(c.ctx, c.name, req)
		if err != nil {
			return driverFailure(err)
		}
		id, err := s.execs.add(c.grant.Name, c.vm, h, s.now())
		if err != nil {
			// The command runs but cannot be tracked; say so rather than hide it.
			return failure(TagBackend, fmt.Sprintf("command started as pid %d but cannot be tracked: %v", h.PID, err), false)
		}
		out := map[string]any{"exec_id": id, "pid": h.PID, "started_at": h.StartedAt}
		return success(out, fmt.Sprintf("started pid %d; poll vm_agent_exec_status with exec_id %s", h.PID, id))
	}
	res, err := hypervisor.Run(c.ctx, c.driver, c.name, req)
	if err != nil {
		r := driverFailure(err)
		if r.tag == TagTimedOut {
			r.text = fmt.Sprintf("no result from the guest within %d s", secs)
		}
		return r
	}
	return execResult(res, fmt.Sprintf("command killed after %d s", secs))
}

func execResult(res hypervisor.ExecResult, timeoutMsg string) result {
	out := map[string]any{
		"pid": res.PID, "exited": res.Exited, "exit_code": res.ExitCode,
		"stdout_truncated": res.StdoutTruncated, "stderr_truncated": res.StderrTruncated,
		"timed_out": res.TimedOut,
	}
	if res.Signal != 0 {
		out["signal"] = res.Signal
	}
	putBytes(out, "stdout", res.Stdout)
	putBytes(out, "stderr", res.Stderr)
	var b strings.Builder
	switch {
	case !res.Exited:
		fmt.Fprintf(&b, "running (pid %d)", res.PID)
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

func putBytes(m map[string]any, key string, data []byte) {
	if utf8.Valid(data) {
		m[key] = string(data)
	} else {
		m[key+"_base64"] = base64.StdEncoding.EncodeToString(data)
	}
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

func (s *Server) runExecStatus(c *call) result {
	id := c.args["exec_id"].(string)
	e, ok := s.execs.get(id, c.grant.Name, c.vm)
	if !ok {
		return failure(TagInvalid, "unknown exec_id (finished results are returned once)", true)
	}
	res, err := c.driver.ExecStatus(c.ctx, c.name, e.handle)
	if err != nil {
		if errors.Is(err, hypervisor.ErrUnknownExec) {
			s.execs.remove(id)
		}
		return driverFailure(err)
	}
	if res.Exited {
		s.execs.remove(id)
	}
	return execResult(res, "command killed after its timeout")
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

func (s *Server) runFileRead(c *call) result {
	p := c.args["path"].(string)
	if !strings.HasPrefix(p, "/") {
		return failure(TagInvalid, "path must be absolute", true)
	}
	fc, err := c.driver.FileRead(c.ctx, c.name, p, s.outputCap(c.args["max_bytes"]))
	if err != nil {
		return driverFailure(err)
	}
	out := map[string]any{"path": p, "bytes": len(fc.Data), "truncated": fc.Truncated}
	putBytes(out, "content", fc.Data)
	text := string(fc.Data)
	if !utf8.Valid(fc.Data) {
		text = fmt.Sprintf("(%d bytes of binary data, see content_base64)", len(fc.Data))
	}
	if fc.Truncated {
		text += "\n(truncated)"
	}
	return success(out, text)
}

func (s *Server) runFileWrite(c *call) result {
	p := c.args["path"].(string)
	if !strings.HasPrefix(p, "/") {
		return failure(TagInvalid, "path must be absolute", true)
	}
	var data []byte
	if v, ok := c.args["content"].(string); ok {
		data = []byte(v)
	} else {
		var err error
		if data, err = base64.StdEncoding.DecodeString(c.args["content_base64"].(string)); err != nil {
			return failure(TagInvalid, "content_base64 is not valid base64", true)
		}
	}
	var mode uint32
	if v, ok := c.args["mode"].(int64); ok {
		mode = uint32(v)
	}
	if err := c.driver.FileWrite(c.ctx, c.name, p, data, mode); err != nil {
		return driverFailure(err)
	}
	return success(map[string]any{"path": p, "bytes_written": len(data)}, fmt.Sprintf("wrote %d bytes to %s", len(data), p))
}

func (s *Server) runPower(c *call) result {
	action := hypervisor.PowerAction(c.args["action"].(string))
	if err := c.driver.Power(c.ctx, c.name, action); err != nil {
		return driverFailure(err)
	}
	return success(map[string]any{"vm": c.vm, "action": string(action), "done": true}, fmt.Sprintf("%s: %s done", c.vm, action))
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
