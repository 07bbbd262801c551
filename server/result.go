package server

import (
	"context"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

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

// outputCap clamps a client's cap (0: none given) to the server's: never raised.
func (s *Server) outputCap(n int64) int64 {
	if n > 0 {
		return min(n, s.limits.MaxOutputBytes)
	}
	return s.limits.MaxOutputBytes
}
