package pveemu

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
)

// The agent methods follow qemu-server src/PVE/API2/Qemu/Agent.pm and
// src/PVE/QemuServer/Agent.pm; the agent is the VM's real qemu-ga, reached
// through guest/qga as QMPClient.pm reaches it.

// maxReadSize is $MAX_READ_SIZE of Agent.pm.
const maxReadSize = 16 << 20

// agentPerm is the permission of an agent method. Up to qemu-server 8.x every
// one checks VM.Monitor; since 9.0.3 (commit b92a40ce) the informational
// commands check VM.GuestAgent.Audit or .Unrestricted, exec and exec-status
// .Unrestricted, file-read .FileRead or .Unrestricted and file-write
// .FileWrite or .Unrestricted.
func (e *Emulator) agentPerm(name string) func(e *Emulator, r *request) *apiError {
	if !e.version.GuestAgentPrivileges() {
		return vmPerm("VM.Monitor")
	}
	switch name {
	case "exec", "exec-status":
		return vmPerm("VM.GuestAgent.Unrestricted")
	case "file-read":
		return vmPermAny("VM.GuestAgent.FileRead", "VM.GuestAgent.Unrestricted")
	case "file-write":
		return vmPermAny("VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted")
	case "shutdown", "suspend-disk", "suspend-ram", "suspend-hybrid":
		return vmPermAny("VM.PowerMgmt", "VM.GuestAgent.Unrestricted")
	}
	return vmPermAny("VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted")
}

// qgaTimeout is PVE::QMPClient::cmd's timeout for a guest agent command.
func qgaTimeout(command string) time.Duration {
	switch command {
	case "guest-fsfreeze-freeze":
		return time.Hour
	case "guest-fsfreeze-thaw":
		return 3 * time.Minute
	case "guest-fstrim", "guest-shutdown":
		return 10 * time.Minute
	}
	return 5 * time.Second
}

// peerFailure is QMPClient::cmd's die for a failed command of the guest
// agent peer: "VM N qmp command" before qemu-server 9.0.26, "VM N qga
// command" since (commit 9f619716).
func (e *Emulator) peerFailure(v *vm, command, reason string) *apiError {
	peer := "qmp"
	if e.version.QGAPeerWording() {
		peer = "qga"
	}
	return die("VM %d %s command '%s' failed - %s", v.vmid, peer, command, reason)
}

// monQGA is PVE::QemuServer::Monitor::mon_cmd for a guest-* command. An
// error reply of the agent is not an error here (QMPClient hands it to the
// caller as {error => ...}); it comes back as qerr.
func (e *Emulator) monQGA(ctx context.Context, v *vm, command string, args any, timeout time.Duration) (json.RawMessage, *qga.Error, *apiError) {
	if v.machine.PID() == 0 {
		return nil, nil, die("VM %d not running", v.vmid)
	}
	if v.agent == nil {
		return nil, nil, die("unable to open monitor socket")
	}
	if timeout == 0 {
		timeout = qgaTimeout(command)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var raw json.RawMessage
	err := v.agent.Call(cctx, command, args, &raw)
	var de *qga.DisabledError
	var qe *qga.Error
	switch {
	case err == nil:
		return raw, nil, nil
	case errors.As(err, &de):
		return nil, de.Err, nil
	case errors.As(err, &qe):
		return nil, qe, nil
	case errors.Is(err, qga.ErrNoAgent):
		return nil, nil, die("unable to connect to VM %d qga socket - Connection refused", v.vmid)
	case errors.Is(err, qga.ErrConnLost):
		return nil, nil, e.peerFailure(v, command, "Got EOF but command queue is not empty.\n")
	case cctx.Err() != nil || errors.Is(err, qga.ErrTimeout):
		return nil, nil, e.peerFailure(v, command, "got timeout\n")
	}
	return nil, nil, e.peerFailure(v, command, err.Error()+"\n")
}

// qgaRunning is PVE::QemuServer::Agent::qga_check_running: guest-ping with a
// 3 s timeout.
func (e *Emulator) qgaRunning(ctx context.Context, v *vm) bool {
	_, qerr, err := e.monQGA(ctx, v, "guest-ping", nil, 3*time.Second)
	return err == nil && qerr == nil
}

// assertAgent is Agent.pm's assert_agent_available (agent_available before
// 9.0).
func (e *Emulator) assertAgent(ctx context.Context, v *vm) *apiError {
	v.mu.Lock()
	on := v.agentOn
	v.mu.Unlock()
	if !on {
		return die("No QEMU guest agent configured")
	}
	if v.machine.PID() == 0 {
		return die("VM %d is not running", v.vmid)
	}
	if !e.qgaRunning(ctx, v) {
		return die("QEMU guest agent is not running")
	}
	return nil
}

// checkAgentError is Agent.pm's check_agent_error.
func checkAgentError(raw json.RawMessage, qerr *qga.Error, errmsg string) *apiError {
	if qerr != nil && qerr.Desc != "" {
		return die("Agent error: %s", qerr.Desc)
	}
	if qerr != nil || raw == nil || string(raw) == "null" {
		return die("Agent error: %s", errmsg)
	}
	return nil
}

// agentCmd is Agent.pm's agent_cmd: assert the agent, run guest-CMD, check
// the reply.
func (e *Emulator) agentCmd(ctx context.Context, v *vm, cmd string, args any, errmsg string) (json.RawMessage, *apiError) {
	if err := e.assertAgent(ctx, v); err != nil {
		return nil, err
	}
	raw, qerr, err := e.monQGA(ctx, v, "guest-"+cmd, args, 0)
	if err != nil {
		return nil, err
	}
	if err := checkAgentError(raw, qerr, errmsg); err != nil {
		return nil, err
	}
	return raw, nil
}

// decodeAny re-reads an agent reply as Perl holds it.
func decodeAny(raw json.RawMessage) any {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return nil
	}
	return v
}

// agentSimple is register_command's code for a command without parameters:
// assert the agent, run it, answer {result => reply}, where an error reply
// of the agent is the reply ({error => {class, desc}}), with HTTP 200.
func (e *Emulator) agentSimple(cmd string) func(e *Emulator, r *request) (any, *apiError) {
	return func(e *Emulator, r *request) (any, *apiError) {
		v, err := e.loadVM(r)
		if err != nil {
			return nil, err
		}
		if err := e.assertAgent(r.ctx, v); err != nil {
			return nil, err
		}
		raw, qerr, err := e.monQGA(r.ctx, v, "guest-"+cmd, nil, 0)
		if err != nil {
			return nil, err
		}
		if qerr != nil {
			return map[string]any{"result": map[string]any{"error": map[string]any{"class": qerr.Class, "desc": qerr.Desc}}}, nil
		}
		return map[string]any{"result": decodeAny(raw)}, nil
	}
}

// perlBytes is encode_base64's view of a Perl string: characters above
// U+00FF are "Wide character" errors.
func perlBytes(s string) ([]byte, bool) {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			return nil, false
		}
		b = append(b, byte(r))
	}
	return b, true
}

// latin1 is a byte string as Perl's JSON encoder writes it: one character
// per byte.
func latin1(b []byte) string {
	var sb strings.Builder
	sb.Grow(len(b))
	for _, c := range b {
		sb.WriteRune(rune(c))
	}
	return sb.String()
}

// agentExec is Agent.pm "exec": PVE::QemuServer::Agent::qemu_exec.
func (e *Emulator) agentExec(r *request) (any, *apiError) {
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	cmd := r.params["command"].([]any)
	args := map[string]any{"capture-output": true}
	if len(cmd) > 0 {
		args["path"] = scalar(cmd[0])
		rest := make([]string, 0, len(cmd)-1)
		for _, c := range cmd[1:] {
			rest = append(rest, scalar(c))
		}
		args["arg"] = rest
	}
	if in, ok := strParam(r.params, "input-data"); ok {
		b, ok := perlBytes(in)
		if !ok {
			return nil, die("Wide character in subroutine entry")
		}
		args["input-data"] = base64.StdEncoding.EncodeToString(b)
	}
	if _, ok := args["path"]; !ok && args["input-data"] == nil {
		return nil, die("command or input-data (or both) required")
	}
	errmsg := "can't execute command"
	if p, ok := args["path"]; ok {
		errmsg += fmt.Sprintf(" (%v ARRAY)", p)
	}
	if _, ok := args["input-data"]; ok {
		errmsg += " (input-data given)"
	}
	raw, err := e.agentCmd(r.ctx, v, "exec", args, errmsg)
	if err != nil {
		return nil, err
	}
	return decodeAny(raw), nil
}

// agentExecStatus is Agent.pm "exec-status": qemu_exec_status decodes
// out-data and err-data and turns the JSON booleans into 1/0.
func (e *Emulator) agentExecStatus(r *request) (any, *apiError) {
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	pid := intParam(r.params, "pid", 0)
	raw, err := e.agentCmd(r.ctx, v, "exec-status", map[string]any{"pid": pid}, fmt.Sprintf("can't get exec status for '%d'", pid))
	if err != nil {
		return nil, err
	}
	res, _ := decodeAny(raw).(map[string]any)
	for _, k := range []string{"out-data", "err-data"} {
		if s, ok := res[k].(string); ok && s != "" {
			if b, derr := base64.StdEncoding.DecodeString(s); derr == nil {
				res[k] = latin1(b)
			}
		}
	}
	for k, x := range res {
		if b, ok := x.(bool); ok {
			res[k] = b2i(b)
		}
	}
	return res, nil
}

// fileReadProps are file-read's parameters: count, offset and decode since
// qemu-server 9.1.5.
func (e *Emulator) fileReadProps() map[string]prop {
	p := map[string]prop{"file": {typ: "string"}}
	if e.version.FileReadCount() {
		p["count"] = prop{typ: "integer", optional: true, minimum: num(1), maximum: num(maxReadSize)}
		p["decode"] = prop{typ: "boolean", optional: true}
		p["offset"] = prop{typ: "integer", optional: true, minimum: num(0)}
	}
	return p
}

// agentFileRead is Agent.pm "file-read": open, seek (9.1.5+), read in 1 MiB
// pieces until count (16 MiB) or end of file, close. A failure after the open
// leaves the handle open, as upstream does.
func (e *Emulator) agentFileRead(r *request) (any, *apiError) {
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	file, _ := strParam(r.params, "file")
	count := intParam(r.params, "count", maxReadSize)
	offset := intParam(r.params, "offset", 0)
	decode := boolParam(r.params, "decode", true)
	raw, err := e.agentCmd(r.ctx, v, "file-open", map[string]any{"path": file}, "can't open file")
	if err != nil {
		return nil, err
	}
	handle, perr := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if perr != nil {
		return nil, die("Agent error: can't open file")
	}
	if offset > 0 {
		raw, qerr, err := e.monQGA(r.ctx, v, "guest-file-seek", map[string]any{"handle": handle, "offset": offset, "whence": "set"}, 0)
		if err != nil {
			return nil, err
		}
		if err := checkAgentError(raw, qerr, "can't seek to offset position"); err != nil {
			return nil, err
		}
	}
	var content bytes.Buffer
	var bytesRead int64
	eof := false
	const readSize = 1 << 20
	for bytesRead < count && !eof {
		chunk := int64(readSize)
		if !e.version.FileReadCount() {
			// Before 9.1.5: always 1 MiB pieces up to $MAX_READ_SIZE.
			chunk = readSize
		} else if left := count - bytesRead; left < chunk {
			chunk = left
		}
		raw, qerr, err := e.monQGA(r.ctx, v, "guest-file-read", map[string]any{"handle": handle, "count": chunk}, 0)
		if err != nil {
			return nil, err
		}
		if err := checkAgentError(raw, qerr, "can't read from file"); err != nil {
			return nil, err
		}
		var rd struct {
			Count int64  `json:"count"`
			Buf   string `json:"buf-b64"`
			EOF   bool   `json:"eof"`
		}
		if jerr := json.Unmarshal(raw, &rd); jerr != nil {
			return nil, die("%v", jerr)
		}
		if decode {
			b, _ := base64.StdEncoding.DecodeString(rd.Buf)
			content.Write(b)
		} else {
			content.WriteString(rd.Buf)
		}
		bytesRead += rd.Count
		eof = rd.EOF
	}
	e.monQGA(r.ctx, v, "guest-file-close", map[string]any{"handle": handle}, 0) // check_agent_error with noerr: a warning
	out := map[string]any{"bytes-read": bytesRead}
	if decode {
		out["content"] = latin1(content.Bytes())
	} else {
		out["content"] = content.String()
	}
	if !eof {
		out["truncated"] = 1
	}
	return out, nil
}

// agentFileWrite is Agent.pm "file-write": open for writing, write the
// content (base64-encoded here unless encode is 0), close.
func (e *Emulator) agentFileWrite(r *request) (any, *apiError) {
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	file, _ := strParam(r.params, "file")
	content, _ := strParam(r.params, "content")
	buf := content
	if boolParam(r.params, "encode", true) {
		b, ok := perlBytes(content)
		if !ok {
			return nil, die("Wide character in subroutine entry")
		}
		buf = base64.StdEncoding.EncodeToString(b)
	}
	raw, err := e.agentCmd(r.ctx, v, "file-open", map[string]any{"path": file, "mode": "wb"}, "can't open file")
	if err != nil {
		return nil, err
	}
	handle, perr := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if perr != nil {
		return nil, die("Agent error: can't open file")
	}
	if _, err := e.agentCmd(r.ctx, v, "file-write", map[string]any{"handle": handle, "buf-b64": buf}, "can't write to file"); err != nil {
		return nil, err
	}
	if _, err := e.agentCmd(r.ctx, v, "file-close", map[string]any{"handle": handle}, "can't close file"); err != nil {
		return nil, err
	}
	return nil, nil
}

// guestShutdown is mon_cmd guest-shutdown in _do_vm_stop: qemu-ga does not
// answer a shutdown it carries out, which QMPClient accepts
// ($qga_allow_close_cmds).
func (e *Emulator) guestShutdown(v *vm, timeout time.Duration) *apiError {
	if timeout < 0 {
		timeout = qgaTimeout("guest-shutdown")
	}
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	err := v.agent.CallNoReply(ctx, "guest-shutdown", map[string]any{"mode": "powerdown"}, 2*time.Second)
	var qe *qga.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &qe):
		return e.peerFailure(v, "guest-shutdown", qe.Desc+"\n")
	}
	return e.peerFailure(v, "guest-shutdown", "got timeout\n")
}
