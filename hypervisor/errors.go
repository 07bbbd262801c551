package hypervisor

import (
	"errors"
	"fmt"
)

// Sentinel errors. Drivers wrap them with context (fmt.Errorf("qemu: exec: %w", ErrUnknownVM));
// callers test with errors.Is. The server maps each to a tool-facing tag.
var (
	// ErrUnknownVM: the backend has no VM by that name.
	ErrUnknownVM = errors.New("unknown VM")
	// ErrAgentUnavailable: the guest agent does not answer (not installed,
	// not running, VM paused or off, channel not connected).
	ErrAgentUnavailable = errors.New("guest agent unavailable")
	// ErrCommandDisabled: the guest agent answers but has the needed command
	// disabled (qemu-ga -b guest-exec). Wrapped in a *CommandDisabledError.
	ErrCommandDisabled = errors.New("guest agent command disabled")
	// ErrTimeout: the call's deadline passed before the backend answered.
	ErrTimeout = errors.New("timed out")
	// ErrNotSupported: the backend cannot do this (e.g. start a VM it did not launch).
	ErrNotSupported = errors.New("not supported by this backend")
	// ErrUnknownExec: the exec handle is not (or no longer) known to the guest.
	ErrUnknownExec = errors.New("unknown exec handle")
	// ErrVMNotRunning: the operation needs a running VM.
	ErrVMNotRunning = errors.New("VM is not running")
	// ErrInvalidArgument: the request was refused before any side effect.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrBackend: the backend refused or failed the operation and said why.
	// A driver wraps it only around a message that is the backend's own
	// reason in plain words, cleaned of secrets (the server shows that
	// message to the agent; anything else stays in the audit log).
	ErrBackend = errors.New("backend error")
	// ErrPluginExited: the driver's plugin process is gone. The server
	// restarts it; the call that saw this failed.
	ErrPluginExited = errors.New("driver plugin exited")
)

// CommandDisabledError says which agent command is disabled.
type CommandDisabledError struct {
	Command string
}

func (e *CommandDisabledError) Error() string {
	return fmt.Sprintf("%s is disabled in this guest", e.Command)
}

// Unwrap makes errors.Is(err, ErrCommandDisabled) true.
func (e *CommandDisabledError) Unwrap() error { return ErrCommandDisabled }
