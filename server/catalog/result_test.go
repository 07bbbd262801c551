package catalog

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/vmgate/vmgate/hypervisor"
)

func TestDriverFailure(t *testing.T) {
	tests := []struct {
		err      error
		tag      string
		noEffect bool
		text     string
	}{
		{fmt.Errorf("qemu: exec status: %w: %w", hypervisor.ErrUnknownExec, fmt.Errorf("qga: unknown exec pid")), TagBackend, false, "agent lost"},
		{fmt.Errorf("qemu: status: %w", hypervisor.ErrUnknownVM), TagUnknownVM, true, "no such VM"},
		{fmt.Errorf("qemu: exec: %w", context.DeadlineExceeded), TagTimedOut, false, "in time"},
		{fmt.Errorf("qemu: exec: %w", hypervisor.ErrInvalidArgument), TagInvalid, true, "refused the arguments"},
		{fmt.Errorf("qemu: exec: %w", &hypervisor.CommandDisabledError{Command: "guest-exec"}), TagBackend, true, "guest-exec is disabled"},
		{fmt.Errorf("qemu: exec: %w", hypervisor.ErrAgentUnavailable), TagBackend, false, "agent is not running or does not answer"},
		{fmt.Errorf("qemu: exec: %w", hypervisor.ErrVMNotRunning), TagBackend, true, "not running"},
		{fmt.Errorf("qemu: power: %w", hypervisor.ErrNotSupported), TagBackend, true, "cannot do that"},
		{fmt.Errorf("plugin: %w", &hypervisor.ExitedError{Driver: "libvirt"}), TagBackend, false, "driver libvirt exited; retry"},
		{fmt.Errorf("plugin: %w", hypervisor.ErrPluginExited), TagBackend, false, "driver process exited; retry"},
		{fmt.Errorf("qemu: exec: %w", context.Canceled), TagBackend, false, "cancelled"},
		{fmt.Errorf("qemu: exec: %w", hypervisor.ErrTimeout), TagTimedOut, false, "in time"},
		{fmt.Errorf("qemu: exec: disk on fire"), TagBackend, false, "the backend failed: qemu: exec: disk on fire"},
		{fmt.Errorf("proxmox: power start: %w: the qmstart task failed: VM 101 already running", hypervisor.ErrBackend), TagBackend, false,
			"the qmstart task failed: VM 101 already running"},
		{fmt.Errorf("proxmox: exec: %w: %s", hypervisor.ErrBackend, strings.Repeat("x\n", 400)), TagBackend, false, "x x x"},
		// The guest's own reasons (qemu-ga's descs, as agentexec passes them),
		// in plain words with what to do next.
		{fmt.Errorf("qemu: exec: %w: the guest agent answered: Guest agent command failed, error was 'Failed to execute child process \u201c/nonexistent\u201d (No such file or directory)'", hypervisor.ErrBackend),
			TagBackend, false, "not found: the guest agent answered: Guest agent command failed, error was 'Failed to execute child process \u201c/nonexistent\u201d (No such file or directory)'; check the path"},
		{fmt.Errorf("qemu: file read: %w: the guest agent answered: failed to read file: Is a directory", hypervisor.ErrBackend),
			TagBackend, false, "it is a directory, not a file: the guest agent answered: failed to read file: Is a directory; give a file's path"},
		{fmt.Errorf("libvirt: file read: %w: the guest agent answered: failed to open file '/root/x' (mode: 'r'): Permission denied", hypervisor.ErrBackend),
			TagBackend, false, "permission denied: the guest agent answered: failed to open file '/root/x' (mode: 'r'): Permission denied; the guest agent's user"},
		{fmt.Errorf("qemu: exec: %w: the guest agent answered: Failed to execute child process \u201c/tmp/x\u201d (Exec format error)", hypervisor.ErrBackend),
			TagBackend, false, "not a program this guest can run (exec format error): the guest agent answered"},
		// vmgate-guest's Go errors are lowercase.
		{fmt.Errorf("qemu: exec: %w: run: start: fork/exec /tmp/x: exec format error", hypervisor.ErrBackend),
			TagBackend, false, "not a program this guest can run (exec format error): run: start: fork/exec /tmp/x: exec format error; a script needs"},
		{fmt.Errorf("qemu: exec: %w: qga: dial unix /run/vm1/qga.sock: connect: no such file", hypervisor.ErrAgentUnavailable),
			TagBackend, false, "the guest agent is not running or does not answer (qemu: exec: guest agent unavailable: qga: dial unix"},
		{fmt.Errorf("qemu: exec: %w: %w: no QEMU listens on /run/vm1/qmp.sock", hypervisor.ErrAgentUnavailable, hypervisor.ErrVMNotRunning),
			TagBackend, true, "the VM is not running (qemu: exec"},
	}
	for _, tt := range tests {
		r := DriverFailure(tt.err)
		if r.Tag != tt.tag || r.NoEffect != tt.noEffect || !strings.Contains(r.Text, tt.text) {
			t.Errorf("DriverFailure(%v) = %s %q noEffect %v; want %s %q noEffect %v", tt.err, r.Tag, r.Text, r.NoEffect, tt.tag, tt.text, tt.noEffect)
		}
		if len(r.Text) > maxReason+len("…")+maxAdvice {
			t.Errorf("DriverFailure(%v).text is %d bytes; want at most %d", tt.err, len(r.Text), maxReason+maxAdvice)
		}
		if r.Detail != tt.err.Error() {
			t.Errorf("DriverFailure(%v).detail = %q; want the whole error for the audit log", tt.err, r.Detail)
		}
	}
}

// maxAdvice bounds what driverFailure adds to a reason (plain words, what
// to do next).
const maxAdvice = 250

func TestCleanReason(t *testing.T) {
	tests := []struct{ in, want string }{
		{"proxmox: 401 authentication failure: PVEAPIToken=root@pam!vmgate=2b1c-77 refused", "proxmox: 401 authentication failure: PVEAPIToken=[redacted] refused"},
		{"connect with password=hunter2 failed", "connect with password=[redacted] failed"},
		{`{"token": "abc123", "x": 1}`, `{"token": [redacted], "x": 1}`},
		{"GET https://root:s3cret@pve:8006/api2/json: 500", "GET https://root:[redacted]@pve:8006/api2/json: 500"},
		{"Authorization: Bearer eyJhbGciOi.payload.sig rejected", "Authorization: [redacted] rejected"},
		{"header bearer eyJhbGciOi.payload.sig rejected", "header bearer [redacted] rejected"},
		// Paths and errno texts stay.
		{"failed to open file '/etc/passwd' (mode: 'r'): Permission denied", "failed to open file '/etc/passwd' (mode: 'r'): Permission denied"},
		{"/etc/passwd: Permission denied", "/etc/passwd: Permission denied"},
		{"two\nlines\t here", "two lines here"},
	}
	for _, tt := range tests {
		if got := CleanReason(tt.in); got != tt.want {
			t.Errorf("CleanReason(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
	long := CleanReason(strings.Repeat("é", 300))
	if len(long) > maxReason+len("…") || !strings.HasSuffix(long, "…") || !utf8.ValidString(long) {
		t.Errorf("cleanReason of 600 bytes = %d bytes %q; want at most %d, cut at a rune with …", len(long), long[len(long)-8:], maxReason)
	}
}
