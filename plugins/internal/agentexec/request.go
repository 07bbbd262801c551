package agentexec

import (
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// Request validates req and converts it to the guest agent's form; a zero
// timeout becomes defaultTimeout. Errors wrap hypervisor.ErrInvalidArgument
// and carry no operation prefix: the driver adds its own.
func Request(req hypervisor.ExecRequest, defaultTimeout time.Duration) (qga.ExecRequest, error) {
	bad := func(msg string) (qga.ExecRequest, error) {
		return qga.ExecRequest{}, fmt.Errorf("%w: %s", hypervisor.ErrInvalidArgument, msg)
	}
	switch {
	case len(req.Argv) == 0 || req.Argv[0] == "":
		return bad("empty argv")
	case req.Timeout < 0:
		return bad("negative timeout")
	case req.MaxOutputBytes < 0:
		return bad("negative max output bytes")
	case req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/"):
		return bad("cwd must be absolute")
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = defaultTimeout
	}
	return qga.ExecRequest{
		Path:           req.Argv[0],
		Args:           req.Argv[1:],
		Env:            req.Env,
		Stdin:          req.Stdin,
		Cwd:            req.Cwd,
		Timeout:        timeout,
		MaxOutputBytes: req.MaxOutputBytes,
	}, nil
}

// execCommands are the agent commands exec needs.
var execCommands = []string{"guest-exec", "guest-exec-status"}

// CheckEnabled is the exec preflight: it returns a
// *hypervisor.CommandDisabledError naming the first exec command that info
// (the guest's guest-info) does not list as enabled, so a guest that
// forbids exec gets a clear error instead of a hang.
func CheckEnabled(info qga.Info) error {
	for _, c := range execCommands {
		if !info.Enabled(c) {
			return &hypervisor.CommandDisabledError{Command: c}
		}
	}
	return nil
}
