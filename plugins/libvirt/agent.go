package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// agentCaller is a qga.Caller over libvirt's QEMUDomainAgentCommand for one
// domain, so qga.Agent's exec, file and info logic runs unchanged.
type agentCaller struct {
	d   *Driver
	dom *domState
}

var _ qga.Caller = agentCaller{}

// errNotRunning marks an agent call libvirt refused because the domain is
// not running (shut off or paused): libvirt answers at once, it does not wait.
var errNotRunning = errors.New("domain is not running")

// maxFileChunk is the most file data one agent command carries through
// libvirt (qga.Agent.ChunkBytes). The agent socket takes qga.FileChunkBytes
// (256 KiB) pieces; through libvirt, commands of about 200 KB of JSON and
// more stall until libvirt's agent timeout (found with libvirt 9.0 and a
// TCG guest, while 130 KB always passed), so guest-file-write is cut into
// pieces of this size, and guest-file-read too (its replies are as large;
// not seen failing, cut for the same margin).
const maxFileChunk = 48 << 10

// agentTimeout is the timeout in whole seconds given to libvirt for a call
// bounded by ctx: the time left rounded up, at least 1 (libvirt's 0 means
// "do not wait"), DefaultAgentTimeout without a deadline.
func agentTimeout(ctx context.Context, now time.Time) int32 {
	dl, ok := ctx.Deadline()
	if !ok {
		return int32(DefaultAgentTimeout / time.Second)
	}
	secs := math.Ceil(dl.Sub(now).Seconds())
	switch {
	case secs < 1:
		return 1
	case secs > math.MaxInt32:
		return math.MaxInt32
	}
	return int32(secs)
}

// Call implements qga.Caller: one agent command sent through libvirt,
// serialised per domain.
func (a agentCaller) Call(ctx context.Context, command string, args, result any) error {
	if command == "" {
		return fmt.Errorf("libvirt: agent: %w: empty command", qga.ErrInvalidArgument)
	}
	msg, err := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{command, args})
	if err != nil {
		return fmt.Errorf("libvirt: agent: %s: %w: %w", command, qga.ErrInvalidArgument, err)
	}
	if err := ctx.Err(); err != nil {
		return agentCtxErr(command, err)
	}
	// One agent call per domain in flight; the slot is held until libvirt
	// answers, even when this caller gave up.
	select {
	case a.dom.agentSlot <- struct{}{}:
	case <-ctx.Done():
		return agentCtxErr(command, ctx.Err())
	}
	timeout := agentTimeout(ctx, time.Now())
	h := a.dom.handle()
	var raw golibvirt.OptString
	launched := false
	err = a.d.callTracked(ctx, false, &launched, func(c conn) error {
		defer func() { <-a.dom.agentSlot }()
		var err error
		raw, err = c.QEMUDomainAgentCommand(h, string(msg), timeout, 0)
		return err
	})
	if !launched {
		<-a.dom.agentSlot
	}
	if err != nil {
		if errors.Is(err, hypervisor.ErrTimeout) {
			return agentCtxErr(command, ctx.Err())
		}
		return a.d.agentCallError(ctx, a.dom, command, err, result)
	}
	if len(raw) != 1 {
		return fmt.Errorf("libvirt: agent: %s: %w: libvirt returned no reply", command, qga.ErrProtocol)
	}
	return qga.DecodeReply(command, []byte(raw[0]), result)
}

func agentCtxErr(command string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("libvirt: agent: %s: %w", command, qga.ErrTimeout)
	}
	return fmt.Errorf("libvirt: agent: %s: %w", command, err)
}

// agentCommandFailed is libvirt's message for an agent error reply: it keeps
// the reply's desc and drops its class.
const agentCommandFailed = "unable to execute QEMU agent command '"

// agentCallError turns libvirt's error for an agent command into what a
// qga.Caller returns: an error reply becomes the *qga.Error or
// *qga.DisabledError qga.DecodeReply makes of it (the class is rebuilt from
// qemu-ga's desc, since libvirt drops it); an unresponsive agent is
// qga.ErrTimeout when the deadline has passed and qga.ErrNoAgent otherwise.
func (d *Driver) agentCallError(ctx context.Context, dom *domState, command string, err error, result any) error {
	var le golibvirt.Error
	if !errors.As(err, &le) {
		return fmt.Errorf("libvirt: agent: %s: %w: %w", command, qga.ErrConnLost, err)
	}
	switch golibvirt.ErrorNumber(le.Code) {
	case golibvirt.ErrInternalError, golibvirt.ErrOperationFailed:
		if desc, ok := agentErrorDesc(le.Message); ok {
			return qga.DecodeReply(command, syntheticErrorReply(desc), result)
		}
	case golibvirt.ErrAgentUnresponsive:
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl.Add(-100*time.Millisecond)) {
			return fmt.Errorf("libvirt: agent: %s: %w (%s)", command, qga.ErrTimeout, le.Message)
		}
		return fmt.Errorf("libvirt: agent: %s: %w: %w", command, qga.ErrNoAgent, err)
	case golibvirt.ErrOperationInvalid:
		return fmt.Errorf("libvirt: agent: %s: %w: %w: %w", command, qga.ErrNoAgent, errNotRunning, err)
	case golibvirt.ErrArgumentUnsupported:
		return fmt.Errorf("libvirt: agent: %s: %w: %w", command, qga.ErrNoAgent, err)
	case golibvirt.ErrNoDomain:
		d.forget(dom)
		return fmt.Errorf("libvirt: agent: %s: %w: %w", command, hypervisor.ErrUnknownVM, err)
	}
	return fmt.Errorf("libvirt: agent: %s: %w", command, err)
}

// agentErrorDesc extracts qemu-ga's desc from libvirt's message
// "internal error: unable to execute QEMU agent command 'guest-exec': Command guest-exec has been disabled".
func agentErrorDesc(msg string) (string, bool) {
	i := strings.Index(msg, agentCommandFailed)
	if i < 0 {
		return "", false
	}
	rest := msg[i+len(agentCommandFailed):]
	j := strings.Index(rest, "': ")
	if j < 0 {
		return "", false
	}
	return rest[j+3:], true
}

// syntheticErrorReply is the agent's error reply as qemu-ga would have sent
// it: class CommandNotFound for a disabled or unknown command (qemu-ga's
// descs "Command X has been disabled", "The command X has not been found"),
// GenericError otherwise.
func syntheticErrorReply(desc string) []byte {
	class := "GenericError"
	if strings.HasSuffix(desc, "has been disabled") || strings.HasSuffix(desc, "has not been found") {
		class = "CommandNotFound"
	}
	b, _ := json.Marshal(map[string]qga.Error{"error": {Class: class, Desc: desc}})
	return b
}
