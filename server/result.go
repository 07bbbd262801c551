package server

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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
	case TagQuota:
		return "quota_exceeded"
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

// driverFailure maps a driver error to a tagged result an agent can act
// on: what happened in plain words, the backend's or guest's own reason
// (cleaned of secrets, cut to maxReason) and, where there is one, what to
// do next. The whole error goes to the audit log (detail).
func driverFailure(err error) result {
	r := result{tag: TagBackend, detail: err.Error()}
	reason := cleanReason(err.Error())
	var cd *hypervisor.CommandDisabledError
	switch {
	case errors.Is(err, hypervisor.ErrUnknownVM):
		// call.explain names the VM.
		r.tag, r.text, r.noEffect = TagUnknownVM, "the backend has no such VM (list_vms shows the VMs you can use)", true
	case errors.Is(err, hypervisor.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		r.tag, r.text = TagTimedOut, "the VM did not answer in time ("+reason+"); vm_status shows whether the VM and its guest agent are up; retry"
	case errors.Is(err, hypervisor.ErrInvalidArgument):
		r.tag, r.text, r.noEffect = TagInvalid, "the backend refused the arguments: "+reason, true
	case errors.As(err, &cd):
		r.text, r.noEffect = cd.Error()+": the guest's agent forbids it (qemu-ga --block-rpcs or its config); the VM's owner can enable it", true
	case errors.Is(err, hypervisor.ErrVMNotRunning):
		r.text, r.noEffect = "the VM is not running ("+reason+"); start it with vm_power start", true
	case errors.Is(err, hypervisor.ErrAgentUnavailable):
		r.text = "the guest agent is not running or does not answer (" + reason + "); vm_status shows whether the VM runs; start qemu-guest-agent in the guest"
	case errors.Is(err, hypervisor.ErrNotSupported):
		r.text, r.noEffect = "this backend cannot do that ("+reason+")", true
	case errors.Is(err, hypervisor.ErrUnknownExec):
		// Exec handles come from the guest through the server (a client's
		// unknown exec_id is refused before any driver call): the agent
		// lost a command it started, and the command may have run.
		r.text = "the guest agent lost this command (was the agent restarted?); its result is unknown; list_processes shows whether it still runs"
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
		// The driver vouches that the message is the backend's reason.
		r.text = guestCause(backendPart(reason))
	default:
		r.text = "the backend failed: " + guestCause(reason)
	}
	return r
}

// unknownVMText is the one [UNKNOWN VM] message, whichever step finds out.
func unknownVMText(vm string) string {
	return fmt.Sprintf("no VM %q (list_vms shows the VMs you can use)", truncate(vm, 64))
}

// explain completes r with what only the call knows: an unknown VM is
// named as the gate names it.
func (c *call) explain(r result) result {
	if r.tag == TagUnknownVM && c.vm != "" {
		r.text = unknownVMText(c.vm)
		if m, ok := r.structured.(map[string]any); ok {
			m["message"] = r.text
		}
	}
	return r
}

// guestCauses are the guest errors an agent meets most, found by the C
// library's text for the errno in the reason: what it means in plain
// words and what to do next.
var guestCauses = []struct{ errno, plain, next string }{
	{"No such file or directory", "not found", "check the path (vm_agent_exec with ls shows what is there); a command needs its full path or to be on PATH"},
	{"Is a directory", "it is a directory, not a file", "give a file's path; vm_agent_exec with ls lists the directory"},
	{"Not a directory", "a part of the path is not a directory", "check the path"},
	{"Permission denied", "permission denied", "the guest agent's user may not do that here: check the file's mode and owner (vm_agent_exec with ls -l)"},
	{"Exec format error", "not a program this guest can run (exec format error)", "a script needs its #! line (or run it with shell), a binary must be built for the guest's architecture"},
	{"Text file busy", "the file is being executed", "wait for the program to end, or write to another path"},
	{"No space left on device", "the guest's disk is full", "free space in the guest (vm_agent_exec with df -h shows where)"},
}

// guestCause puts reason in plain words with what to do next, when it
// holds one of the common guest errors (in any case: the C library says
// "No such file or directory", Go's os package in vmgate-guest "no such
// file or directory"); otherwise reason stays as it is.
func guestCause(reason string) string {
	lower := strings.ToLower(reason)
	for _, g := range guestCauses {
		if strings.Contains(lower, strings.ToLower(g.errno)) {
			return g.plain + ": " + reason + "; " + g.next
		}
	}
	return reason
}

// backendPart is the backend's own reason in an ErrBackend chain: what
// follows "backend error: " (the driver's operation prefix before it says
// nothing the agent needs).
func backendPart(msg string) string {
	if _, after, ok := strings.Cut(msg, hypervisor.ErrBackend.Error()+": "); ok && after != "" {
		return after
	}
	return msg
}

// maxReason bounds a backend's reason shown to the agent.
const maxReason = 400

// secretRE finds what may be a secret in a backend's reason: a value given
// to a key that names one (token=, password: …), a bearer token, the
// password in a URL.
// The key must start the text or follow a space or punctuation, not a
// slash: "/etc/passwd: Permission denied" keeps its reason.
var secretRE = regexp.MustCompile(`(?i)((?:^|[\s,;{(&?"'])(?:[a-z_-]*token|[a-z_-]*secret|password|passwd|api[_-]?key|authorization|cookie|ticket|csrf[a-z_-]*)"?\s*[=:]\s*)((?:(?:bearer|basic)\s+)?(?:"[^"]*"|'[^']*'|[^\s,;&]+))|(\bbearer\s+)[^\s,;]+|(://[^/\s:@]+:)[^@\s/]+@`)

// cleanReason is msg fit for an agent: secrets replaced by [redacted], on
// one line, cut to maxReason bytes at a rune boundary.
func cleanReason(msg string) string {
	msg = secretRE.ReplaceAllStringFunc(msg, func(m string) string {
		sm := secretRE.FindStringSubmatch(m)
		switch {
		case sm[1] != "":
			return sm[1] + "[redacted]"
		case sm[3] != "":
			return sm[3] + "[redacted]"
		default:
			return sm[4] + "[redacted]@"
		}
	})
	return backendReason(msg)
}

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
