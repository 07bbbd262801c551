// Package qga is a hand-written client for the QEMU Guest Agent (qemu-ga).
//
// It has two layers. A Caller sends one agent command and decodes its reply;
// Client is the Caller over the agent's unix socket (the socket QEMU exposes
// for a virtio-serial chardev, or qemu-ga's own unix-listen socket): it
// connects lazily, resynchronises the stream with guest-sync-delimited after
// every connect, serialises calls (one at a time per agent) and puts a deadline
// on every call. Agent holds the command logic (exec with adaptive polling,
// timeouts and output caps, chunked file transfer, guest-info, ...) over any
// Caller, so a driver that reaches the agent another way (libvirt's
// QEMUDomainAgentCommand) reuses it unchanged: qga.Agent{Caller: c}.Exec(ctx, req).
//
// Errors: an error reply becomes a *Error; a command the agent has disabled
// (qemu-ga -b) or does not know becomes a *DisabledError; ErrTimeout,
// ErrClosed, ErrNoAgent, ErrConnLost, ErrUnknownExec and ErrInvalidArgument
// are sentinels for errors.Is.
package qga

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Caller sends one guest agent command and waits for its reply. args is
// marshalled to JSON as the command's "arguments" (nil: none); the reply's
// "return" value is unmarshalled into result (nil: discarded). An error reply
// is returned as a *Error or *DisabledError. Implementations must be safe for
// concurrent use.
type Caller interface {
	Call(ctx context.Context, command string, args, result any) error
}

// NoReplyCaller is an optional capability of a Caller: it sends a command the
// agent does not answer on success (guest-shutdown) and waits at most wait for
// an error reply; end of stream or silence after sending count as success.
type NoReplyCaller interface {
	CallNoReply(ctx context.Context, command string, args any, wait time.Duration) error
}

// Sentinel errors.
var (
	// ErrTimeout: the call's deadline passed before the agent answered. It
	// wraps context.DeadlineExceeded, so errors.Is works with either.
	ErrTimeout = fmt.Errorf("timed out: %w", context.DeadlineExceeded)
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("client closed")
	// ErrNoAgent: nothing to talk to at the socket path (missing, not a
	// socket, connection refused).
	ErrNoAgent = errors.New("no guest agent")
	// ErrConnLost: the connection broke during a call. The next call reconnects.
	ErrConnLost = errors.New("connection to guest agent lost")
	// ErrUnknownExec: guest-exec-status does not know the pid (never started
	// through guest-exec, or its final status was already collected).
	ErrUnknownExec = errors.New("unknown exec pid")
	// ErrInvalidArgument: a request was refused before anything was sent.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrProtocol: the agent sent something that is not a valid reply.
	ErrProtocol = errors.New("protocol error")
)

// Error is an error reply from the agent: {"error":{"class":..,"desc":..}}.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("agent error %s: %s", e.Class, e.Desc)
}

// DisabledError says the agent refused Command because it is disabled
// (qemu-ga -b, or a policy file) or not implemented by this agent. qemu-ga 7.2
// answers class CommandNotFound, desc "Command guest-exec has been disabled"
// (and "The command X has not been found" for an unknown one).
type DisabledError struct {
	Command string
	Err     *Error // the agent's reply
}

func (e *DisabledError) Error() string {
	return fmt.Sprintf("guest agent command %s is disabled or not available: %s", e.Command, e.Err.Desc)
}

// Unwrap returns the agent's error reply.
func (e *DisabledError) Unwrap() error { return e.Err }

// replyError turns an error reply to command into the error callers see.
func replyError(command string, e *Error) error {
	if e.Class == "CommandNotFound" {
		return &DisabledError{Command: command, Err: e}
	}
	return e
}

// isUnknownPID reports whether e is qemu-ga's answer to guest-exec-status
// for a pid it does not track ("Invalid parameter 'pid'").
func isUnknownPID(e *Error) bool {
	return e.Class == "GenericError" && strings.Contains(e.Desc, "'pid'")
}
