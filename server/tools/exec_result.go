package tools

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/catalog"
)

// What vm_agent_exec and vm_agent_exec_status answer: a command's result
// as text and structured content, and the notes a refused or timed-out
// command gets.

// SandboxNote explains a refusal a session's command met.
const SandboxNote = "note: sessions are sandboxed: a command may write only in the session's workdir and " +
	"temporary directory (and the policy's extra paths), as an unprivileged user, without network unless the " +
	"policy allows it; create_session and list_sessions say what this guest enforces"

// blockedNote names the write paths the guest says the session's uid
// cannot write for their own permissions (guest data: bounded, and quoted
// so that no control or bidirectional character reaches the agent raw).
func blockedNote(blocked []wire.BlockedPath) string {
	if len(blocked) == 0 {
		return ""
	}
	var parts []string
	for i, b := range blocked {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("and %d more", len(blocked)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%q (%q)", clip(b.Path, 256), clip(b.Reason, 200)))
	}
	return "; the policy lets it write " + strings.Join(parts, ", ") +
		", but the guest's own file permissions do not: change the owner or mode there (vm_agent_exec), or write elsewhere"
}

// clip cuts s to at most n bytes.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// deniedBySandbox reports whether a failed command's stderr says it was
// refused an access, which in a session is most likely the sandbox.
func deniedBySandbox(res hypervisor.ExecResult) bool {
	if res.ExitCode == 0 || res.TimedOut {
		return false
	}
	for _, s := range []string{"Permission denied", "Operation not permitted", "Read-only file system", "Network is unreachable"} {
		if bytes.Contains(res.Stderr, []byte(s)) {
			return true
		}
	}
	return false
}

// noResultText is the [TIMED OUT] text of a command whose result did not
// come back in time; reason is driverFailure's.
func noResultText(secs int64, reason string) string {
	return fmt.Sprintf("no result from the guest within %d s: %s; a long command can run with wait: false", secs, reason)
}

// killedText is the [TIMED OUT] text of a command its timeout killed.
func killedText(e *catalog.Env, secs int64, what string) string {
	return fmt.Sprintf("command killed after %d s%s; give it more with timeout_s (up to %d) or run it with wait: false", secs, what, e.Limits.MaxTimeoutS)
}

func execResult(res hypervisor.ExecResult, timeoutMsg string) catalog.Result {
	out := map[string]any{
		"pid": res.PID, "exited": res.Exited,
		"stdout_truncated": res.StdoutTruncated, "stderr_truncated": res.StderrTruncated,
		"timed_out": res.TimedOut,
	}
	if res.Exited {
		// A running command has no exit code: none is made up.
		out["exit_code"] = res.ExitCode
	}
	if res.Signal != 0 {
		out["signal"] = res.Signal
	}
	// A running command's output so far, when the guest hands it over.
	if res.Exited || len(res.Stdout) > 0 {
		putBytes(out, "stdout", res.Stdout)
	}
	if res.Exited || len(res.Stderr) > 0 {
		putBytes(out, "stderr", res.Stderr)
	}
	var b strings.Builder
	switch {
	case !res.Exited && len(res.Stdout)+len(res.Stderr) == 0:
		fmt.Fprintf(&b, "running (pid %d); no output so far (some guest agents hand it over only when the command ends); poll again", res.PID)
	case !res.Exited:
		fmt.Fprintf(&b, "running (pid %d); output so far:", res.PID)
	case res.Signal != 0:
		fmt.Fprintf(&b, "killed by signal %d", res.Signal)
	default:
		fmt.Fprintf(&b, "exit %d", res.ExitCode)
	}
	section(&b, "stdout", res.Stdout, res.StdoutTruncated)
	section(&b, "stderr", res.Stderr, res.StderrTruncated)
	if res.TimedOut {
		return catalog.Result{Tag: catalog.TagTimedOut, Text: timeoutMsg + "; partial output: " + b.String(), Structured: out, Detail: timeoutMsg}
	}
	return catalog.Success(out, b.String())
}

// putBytes sets m[key] to a command's output as text when it is valid
// UTF-8 (NUL-separated output, find -print0 or /proc/P/cmdline, stays
// text), or m[key+"_base64"].
func putBytes(m map[string]any, key string, data []byte) {
	if utf8.Valid(data) {
		m[key] = string(data)
	} else {
		m[key+"_base64"] = base64.StdEncoding.EncodeToString(data)
	}
}

func section(b *strings.Builder, name string, data []byte, truncated bool) {
	if len(data) == 0 {
		return
	}
	fmt.Fprintf(b, "\n--- %s", name)
	if truncated {
		b.WriteString(" (truncated)")
	}
	b.WriteString(" ---\n")
	if utf8.Valid(data) {
		b.Write(data)
	} else {
		fmt.Fprintf(b, "(%d bytes of binary data, see %s_base64)", len(data), name)
	}
}
