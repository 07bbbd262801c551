package agentexec

import (
	"context"
	"errors"
	"fmt"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// AgentInfo converts guest-info to the driver contract's form.
func AgentInfo(info qga.Info) hypervisor.AgentInfo {
	out := hypervisor.AgentInfo{Version: info.Version, Commands: make([]hypervisor.AgentCommand, len(info.SupportedCommands))}
	for i, c := range info.SupportedCommands {
		out.Commands[i] = hypervisor.AgentCommand{Name: c.Name, Enabled: c.Enabled}
	}
	return out
}

// MapError maps a guest agent error (from qga or a Tracker) to the
// hypervisor sentinels, keeping err in the chain: a *qga.DisabledError
// becomes a *hypervisor.CommandDisabledError, a timeout ErrTimeout, a
// missing or lost agent ErrAgentUnavailable, qga.ErrUnknownExec
// ErrUnknownExec, qga.ErrInvalidArgument ErrInvalidArgument, and any other
// error reply of the agent (*qga.Error: "No such file or directory", "Is
// a directory" …) ErrBackend with the agent's own reason (its desc, which
// names the guest's path or program and never a secret of vmgate's). Any
// other error is returned as it is. It adds no operation prefix: the
// driver does.
func MapError(err error) error {
	var disabled *qga.DisabledError
	var reply *qga.Error
	switch {
	case errors.As(err, &disabled):
		return &hypervisor.CommandDisabledError{Command: disabled.Command}
	case errors.Is(err, qga.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", hypervisor.ErrTimeout, err)
	case errors.Is(err, qga.ErrNoAgent), errors.Is(err, qga.ErrConnLost), errors.Is(err, qga.ErrClosed):
		return fmt.Errorf("%w: %w", hypervisor.ErrAgentUnavailable, err)
	case errors.Is(err, qga.ErrUnknownExec):
		return fmt.Errorf("%w: %w", hypervisor.ErrUnknownExec, err)
	case errors.Is(err, qga.ErrInvalidArgument):
		return fmt.Errorf("%w: %w", hypervisor.ErrInvalidArgument, err)
	case errors.As(err, &reply):
		return &AgentReplyError{Desc: reply.Desc, Err: err}
	}
	return err
}

// AgentReplyError is an error reply of the guest agent as the backend's
// reason: "backend error: the guest agent answered: <desc>". It is
// hypervisor.ErrBackend and keeps the agent's error in the chain.
type AgentReplyError struct {
	Desc string // the agent's desc, as it sent it
	Err  error  // the agent's error as the client returned it
}

func (e *AgentReplyError) Error() string {
	return hypervisor.ErrBackend.Error() + ": the guest agent answered: " + e.Desc
}

// Unwrap makes errors.Is(err, hypervisor.ErrBackend) true and keeps the
// agent's *qga.Error reachable.
func (e *AgentReplyError) Unwrap() []error { return []error{hypervisor.ErrBackend, e.Err} }
