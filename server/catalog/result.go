package catalog

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

// The tags every error result starts with.
const (
	TagDenied      = "[POLICY DENIED]"
	TagRateLimited = "[RATE LIMITED]"
	TagApproval    = "[APPROVAL REQUIRED]"
	TagInvalid     = "[INVALID ARGUMENT]"
	TagUnknownVM   = "[UNKNOWN VM]"
	TagBackend     = "[BACKEND ERROR]"
	TagTimedOut    = "[TIMED OUT]"
	// TagQuota: a vm_create that a quota has no room for (tools/lifecycle.go).
	TagQuota = "[QUOTA EXCEEDED]"
)

// Result is what a tool handler produced.
type Result struct {
	Tag        string // "" on success, else one of the Tag constants
	Text       string // the short text shown to the agent (after the tag)
	Structured any
	// NoEffect says the call failed before anything could have changed in
	// a VM, so its reservations are refunded.
	NoEffect bool
	Detail   string // for the audit log only
	// Content is what the result carries after its text: an image
	// (mcp.NewImageContent, vm_screenshot), embedded resources.
	Content []mcp.Content
}

// MCP is r as the tools/call result the agent reads.
func (r Result) MCP() *mcp.CallToolResult {
	if r.Tag != "" {
		res := ErrorResult(r.Tag, r.Text, nil)
		if r.Structured != nil {
			res.StructuredContent = r.Structured
		}
		res.Content = append(res.Content, r.Content...)
		return res
	}
	return &mcp.CallToolResult{
		Content:           append([]mcp.Content{mcp.NewTextContent(r.Text)}, r.Content...),
		StructuredContent: r.Structured,
	}
}

// Outcome is r's outcome as the audit log names it.
func (r *Result) Outcome() string {
	switch r.Tag {
	case "":
		return "ok"
	case TagTimedOut:
		return "timed_out"
	case TagQuota:
		return "quota_exceeded"
	}
	return "error"
}

// ErrorResult is an isError tool result whose text starts with tag.
func ErrorResult(tag, msg string, extra map[string]any) *mcp.CallToolResult {
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

// Success is a result with structured content and its short text.
func Success(structured any, text string) Result { return Result{Text: text, Structured: structured} }

// Failure is an error result tagged tag; noEffect says nothing changed.
func Failure(tag, msg string, noEffect bool) Result {
	return Result{Tag: tag, Text: msg, NoEffect: noEffect, Detail: msg}
}

// DriverFailure maps a driver error to a tagged result an agent can act
// on: what happened in plain words, the backend's or guest's own reason
// (cleaned of secrets, cut to maxReason) and, where there is one, what to
// do next. The whole error goes to the audit log (detail).
func DriverFailure(err error) Result {
	r := Result{Tag: TagBackend, Detail: err.Error()}
	reason := CleanReason(err.Error())
	var cd *hypervisor.CommandDisabledError
	switch {
	case errors.Is(err, hypervisor.ErrUnknownVM):
		// Call.Explain names the VM.
		r.Tag, r.Text, r.NoEffect = TagUnknownVM, "the backend has no such VM (list_vms shows the VMs you can use)", true
	case errors.Is(err, hypervisor.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		r.Tag, r.Text = TagTimedOut, "the VM did not answer in time ("+reason+"); vm_status shows whether the VM and its guest agent are up; retry"
	case errors.Is(err, hypervisor.ErrInvalidArgument):
		r.Tag, r.Text, r.NoEffect = TagInvalid, "the backend refused the arguments: "+reason, true
	case errors.As(err, &cd):
		r.Text, r.NoEffect = cd.Error()+": the guest's agent forbids it (qemu-ga --block-rpcs or its config); the VM's owner can enable it", true
	case errors.Is(err, hypervisor.ErrVMNotRunning):
		r.Text, r.NoEffect = "the VM is not running ("+reason+"); start it with vm_power start", true
	case errors.Is(err, hypervisor.ErrAgentUnavailable):
		r.Text = "the guest agent is not running or does not answer (" + reason + "); vm_status shows whether the VM runs; start qemu-guest-agent in the guest"
	case errors.Is(err, hypervisor.ErrNotSupported):
		r.Text, r.NoEffect = "this backend cannot do that ("+reason+")", true
	case errors.Is(err, hypervisor.ErrUnknownExec):
		// Exec handles come from the guest through the server (a client's
		// unknown exec_id is refused before any driver call): the agent
		// lost a command it started, and the command may have run.
		r.Text = "the guest agent lost this command (was the agent restarted?); its result is unknown; list_processes shows whether it still runs"
	case errors.Is(err, hypervisor.ErrPluginExited):
		// The plugin is restarted in the background: a retry can work.
		r.Text = "the backend's driver process exited; retry"
		var ee *hypervisor.ExitedError
		if errors.As(err, &ee) && ee.Driver != "" {
			r.Text = "driver " + ee.Driver + " exited; retry"
		}
	case errors.Is(err, context.Canceled):
		r.Text = "the call was cancelled"
	case errors.Is(err, hypervisor.ErrBackend):
		// The driver vouches that the message is the backend's reason.
		r.Text = GuestCause(backendPart(reason))
	default:
		r.Text = "the backend failed: " + GuestCause(reason)
	}
	return r
}

// UnknownVMText is the one [UNKNOWN VM] message, whichever step finds out.
func UnknownVMText(vm string) string {
	return fmt.Sprintf("no VM %q (list_vms shows the VMs you can use)", Truncate(vm, 64))
}

// Explain completes r with what only the call knows: an unknown VM is
// named as the gate names it.
func (c *Call) Explain(r Result) Result {
	if r.Tag == TagUnknownVM && c.VM != "" {
		r.Text = UnknownVMText(c.VM)
		if m, ok := r.Structured.(map[string]any); ok {
			m["message"] = r.Text
		}
	}
	return r
}

// guestCauses are the guest errors an agent meets most, found by the C
// library's text for the errno in the reason: what it means in plain
// words and what to do next (cmdNext adds what applies to a command only).
var guestCauses = []struct{ errno, plain, next, cmdNext string }{
	{"No such file or directory", "not found", "check the path (vm_agent_exec with ls shows what is there)", "; a command needs its full path or to be on PATH"},
	{"Is a directory", "it is a directory, not a file", "give a file's path; vm_agent_exec with ls lists the directory", ""},
	{"Not a directory", "a part of the path is not a directory", "check the path", ""},
	{"Permission denied", "permission denied", "the guest agent's user may not do that here: check the file's mode and owner (vm_agent_exec with ls -l)", ""},
	{"Exec format error", "not a program this guest can run (exec format error)", "a script needs its #! line (or run it with shell), a binary must be built for the guest's architecture", ""},
	{"Text file busy", "the file is being executed", "wait for the program to end, or write to another path", ""},
	{"No space left on device", "the guest's disk is full", "free space in the guest (vm_agent_exec with df -h shows where)", ""},
}

// GuestCause puts reason in plain words with what to do next, when it
// holds one of the common guest errors (in any case: the C library says
// "No such file or directory", Go's os package in vmgate-guest "no such
// file or directory"); otherwise reason stays as it is. The advice covers
// a command too (a missing one needs its full path or PATH); FileCause is
// the file tools'.
func GuestCause(reason string) string { return guestCause(reason, true) }

// FileCause is GuestCause for a file tool's reason: its advice is about
// the file, never a command.
func FileCause(reason string) string { return guestCause(reason, false) }

func guestCause(reason string, command bool) string {
	lower := strings.ToLower(reason)
	for _, g := range guestCauses {
		if strings.Contains(lower, strings.ToLower(g.errno)) {
			next := g.next
			if command {
				next += g.cmdNext
			}
			return g.plain + ": " + reason + "; " + next
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

// CleanReason is msg fit for an agent: secrets replaced by [redacted], on
// one line, cut to maxReason bytes at a rune boundary.
func CleanReason(msg string) string {
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
	return BackendReason(msg)
}

// BackendReason cuts a backend's reason to one line of sensible length.
func BackendReason(msg string) string {
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

// OutputCap clamps a client's cap (0: none given) to the server's: never raised.
func (e *Env) OutputCap(n int64) int64 {
	if n > 0 {
		return min(n, e.Limits.MaxOutputBytes)
	}
	return e.Limits.MaxOutputBytes
}

// SnapshotFailure maps a Snapshotter error to a tagged result that says
// what to do next; anything else goes through driverFailure.
func SnapshotFailure(c *Call, name string, err error) Result {
	r := DriverFailure(err)
	switch {
	case errors.Is(err, hypervisor.ErrSnapshotNotFound):
		r.Tag, r.NoEffect = TagInvalid, true
		r.Text = fmt.Sprintf("%s has no snapshot %q (snapshot_list shows its snapshots)", c.VM, name)
	case errors.Is(err, hypervisor.ErrSnapshotExists):
		r.Tag, r.NoEffect = TagInvalid, true
		r.Text = fmt.Sprintf("%s already has a snapshot %q: choose another name, or snapshot_delete it first", c.VM, name)
	case errors.Is(err, hypervisor.ErrSnapshotMemory):
		r.Tag, r.NoEffect = TagInvalid, true
		r.Text = fmt.Sprintf("backend %q cannot take a snapshot with memory of %s (a stopped VM has none): retry with memory false", c.Backend, c.VM)
	case errors.Is(err, hypervisor.ErrSnapshotChanged):
		r.Tag, r.NoEffect = TagInvalid, true
		r.Text = fmt.Sprintf("%s: snapshot %q was made anew while the call ran (its identity changed); nothing was done: snapshot_list shows it as it is now", c.VM, name)
	case errors.Is(err, hypervisor.ErrSnapshotDiskOnly):
		r.Tag, r.NoEffect = TagInvalid, true
		r.Text = fmt.Sprintf("backend %q cannot take a snapshot without memory: retry with memory true", c.Backend)
	case errors.Is(err, hypervisor.ErrNotSupported):
		r.Text = fmt.Sprintf("backend %q cannot do this with snapshots: %s", c.Backend, BackendReason(err.Error()))
	}
	return r
}
