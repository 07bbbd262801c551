package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

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
		{fmt.Errorf("qemu: exec: %w", hypervisor.ErrAgentUnavailable), TagBackend, false, "agent does not answer"},
		{fmt.Errorf("qemu: exec: %w", hypervisor.ErrVMNotRunning), TagBackend, true, "not running"},
		{fmt.Errorf("qemu: power: %w", hypervisor.ErrNotSupported), TagBackend, true, "cannot do that"},
		{fmt.Errorf("plugin: %w", &hypervisor.ExitedError{Driver: "libvirt"}), TagBackend, false, "driver libvirt exited; retry"},
		{fmt.Errorf("plugin: %w", hypervisor.ErrPluginExited), TagBackend, false, "driver process exited; retry"},
		{fmt.Errorf("qemu: exec: %w", context.Canceled), TagBackend, false, "cancelled"},
		{fmt.Errorf("qemu: exec: %w", hypervisor.ErrTimeout), TagTimedOut, false, "in time"},
		{fmt.Errorf("qemu: exec: disk on fire"), TagBackend, false, "details in the audit log"},
		{fmt.Errorf("proxmox: power start: %w: the qmstart task failed: VM 101 already running", hypervisor.ErrBackend), TagBackend, false,
			"proxmox: power start: backend error: the qmstart task failed: VM 101 already running"},
		{fmt.Errorf("proxmox: exec: %w: %s", hypervisor.ErrBackend, strings.Repeat("x\n", 400)), TagBackend, false, "x x x"},
	}
	for _, tt := range tests {
		r := driverFailure(tt.err)
		if r.tag != tt.tag || r.noEffect != tt.noEffect || !strings.Contains(r.text, tt.text) {
			t.Errorf("driverFailure(%v) = %s %q noEffect %v; want %s %q noEffect %v", tt.err, r.tag, r.text, r.noEffect, tt.tag, tt.text, tt.noEffect)
		}
		if len(r.text) > maxReason+len("…") {
			t.Errorf("driverFailure(%v).text is %d bytes; want at most %d", tt.err, len(r.text), maxReason)
		}
		if r.detail != tt.err.Error() {
			t.Errorf("driverFailure(%v).detail = %q; want the whole error for the audit log", tt.err, r.detail)
		}
	}
}
