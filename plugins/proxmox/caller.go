package proxmox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// MaxInputData is the longest input-data (stdin) Proxmox's agent/exec
// accepts, in characters (one per byte).
const MaxInputData = 64 << 10

// agentCaller is a qga.Caller over Proxmox's agent/* endpoints of one VM:
// guest-exec, guest-exec-status, guest-info, guest-ping and
// guest-network-get-interfaces are translated to agent/exec,
// agent/exec-status, agent/info, agent/ping and
// agent/network-get-interfaces; anything
// else is refused with hypervisor.ErrNotSupported (Proxmox does not relay it).
type agentCaller struct {
	api  *api
	path string // /nodes/{node}/qemu/{vmid}/agent, from validated parts
}

var _ qga.Caller = agentCaller{}

// How Proxmox reports guest agent failures (qemu-server
// src/PVE/QemuServer/Agent.pm, src/PVE/QMPClient.pm):
//   - an error reply of the agent: check_agent_error's "Agent error: DESC";
//   - a failure of the connection or a timeout: QMPClient::cmd's "VM N qmp
//     command 'X' failed - REASON", "VM N qga command ..." since
//     qemu-server 9.0.26 (commit 9f619716);
//   - no agent: assert_agent_available's "No QEMU guest agent configured",
//     "VM N is not running", "QEMU guest agent is not running", and
//     QMPClient's "unable to connect to VM N qga socket - ...".
var (
	agentErrorRE  = regexp.MustCompile(`^Agent error: (.*)$`)
	peerFailureRE = regexp.MustCompile(`^VM \d+ (qmp|qga) command '[^']*' failed - (.*)$`)
)

// agentErr turns a Proxmox error for an agent command into what qga
// callers expect: a *qga.Error or *qga.DisabledError for an agent error
// reply, qga.ErrNoAgent when the agent is absent, qga.ErrTimeout for a
// timeout, the error otherwise.
func agentErr(command string, err error) error {
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != 500 {
		return err
	}
	msg := strings.TrimSpace(ae.Message)
	switch {
	case strings.Contains(msg, "QEMU guest agent is not running"),
		strings.Contains(msg, "No QEMU guest agent configured"),
		strings.Contains(msg, "qga socket"):
		return fmt.Errorf("%w: %w", qga.ErrNoAgent, ae)
	}
	if m := peerFailureRE.FindStringSubmatch(msg); m != nil {
		if strings.TrimSpace(m[2]) == "got timeout" {
			return fmt.Errorf("%w: %w", qga.ErrTimeout, ae)
		}
		return fmt.Errorf("%w: %w", qga.ErrConnLost, ae)
	}
	m := agentErrorRE.FindStringSubmatch(msg)
	if m == nil {
		return err
	}
	class := "GenericError"
	if strings.Contains(m[1], "has been disabled") || strings.Contains(m[1], "has not been found") {
		class = "CommandNotFound"
	}
	line, _ := json.Marshal(map[string]any{"error": map[string]string{"class": class, "desc": m[1]}})
	return qga.DecodeReply(command, line, nil)
}

// Call implements qga.Caller.
func (c agentCaller) Call(ctx context.Context, command string, args, result any) error {
	var err error
	switch command {
	case "guest-exec":
		err = c.exec(ctx, args, result)
	case "guest-exec-status":
		err = c.execStatus(ctx, args, result)
	case "guest-info":
		err = c.info(ctx, result)
	case "guest-ping":
		err = c.api.do(ctx, "POST", c.path+"/ping", nil, struct{}{}, nil)
	case "guest-network-get-interfaces":
		err = c.networkInterfaces(ctx, result)
	default:
		return fmt.Errorf("proxmox: agent command %s: %w: Proxmox does not relay it", command, hypervisor.ErrNotSupported)
	}
	if err != nil {
		return agentErr(command, err)
	}
	return nil
}

func (c agentCaller) exec(ctx context.Context, args, result any) error {
	raw, err := json.Marshal(args)
	if err != nil {
		return err
	}
	var a struct {
		Path      string   `json:"path"`
		Arg       []string `json:"arg"`
		Env       []string `json:"env"`
		InputData string   `json:"input-data"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return err
	}
	if len(a.Env) > 0 {
		// qga puts Env through env(1); an env argument would need Proxmox support.
		return fmt.Errorf("proxmox: agent/exec: %w: env argument", qga.ErrInvalidArgument)
	}
	body := map[string]any{"command": append([]string{a.Path}, a.Arg...)}
	if a.InputData != "" {
		stdin, err := base64.StdEncoding.DecodeString(a.InputData)
		if err != nil {
			return err
		}
		if len(stdin) > MaxInputData {
			return fmt.Errorf("proxmox: agent/exec: %w: stdin of %d bytes is over Proxmox's %d", qga.ErrInvalidArgument, len(stdin), MaxInputData)
		}
		body["input-data"] = byteString(stdin)
	}
	var reply struct {
		PID *int64 `json:"pid"`
	}
	if err := c.api.do(ctx, "POST", c.path+"/exec", nil, body, &reply); err != nil {
		return err
	}
	if reply.PID == nil {
		return fmt.Errorf("proxmox: agent/exec: %w: answer has no pid", qga.ErrProtocol)
	}
	return remarshal(map[string]int64{"pid": *reply.PID}, result)
}

func (c agentCaller) execStatus(ctx context.Context, args, result any) error {
	raw, err := json.Marshal(args)
	if err != nil {
		return err
	}
	var a struct {
		PID int64 `json:"pid"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return err
	}
	var r struct {
		Exited       flexBool `json:"exited"`
		ExitCode     *int     `json:"exitcode"`
		Signal       *int     `json:"signal"`
		OutData      *string  `json:"out-data"`
		ErrData      *string  `json:"err-data"`
		OutTruncated flexBool `json:"out-truncated"`
		ErrTruncated flexBool `json:"err-truncated"`
	}
	q := url.Values{"pid": {strconv.FormatInt(a.PID, 10)}}
	if err := c.api.do(ctx, "GET", c.path+"/exec-status", q, nil, &r); err != nil {
		return err
	}
	out := map[string]any{"exited": bool(r.Exited), "out-truncated": bool(r.OutTruncated), "err-truncated": bool(r.ErrTruncated)}
	if r.ExitCode != nil {
		out["exitcode"] = *r.ExitCode
	}
	if r.Signal != nil {
		out["signal"] = *r.Signal
	}
	for key, s := range map[string]*string{"out-data": r.OutData, "err-data": r.ErrData} {
		if s == nil {
			continue
		}
		b, err := bytesString(*s)
		if err != nil {
			return fmt.Errorf("proxmox: agent/exec-status: %s: %w: %w", key, qga.ErrProtocol, err)
		}
		out[key] = base64.StdEncoding.EncodeToString(b)
	}
	return remarshal(out, result)
}

func (c agentCaller) info(ctx context.Context, result any) error {
	var r struct {
		Result json.RawMessage `json:"result"`
	}
	if err := c.api.do(ctx, "GET", c.path+"/info", nil, nil, &r); err != nil {
		return err
	}
	if len(r.Result) == 0 {
		return fmt.Errorf("proxmox: agent/info: %w: answer has no result", qga.ErrProtocol)
	}
	if result == nil {
		return nil
	}
	return json.Unmarshal(r.Result, result)
}

func remarshal(v, result any) error {
	if result == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, result)
}
