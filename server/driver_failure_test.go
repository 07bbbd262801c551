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
	}
	for _, tt := range tests {
		r := driverFailure(tt.err)
		if r.tag != tt.tag || r.noEffect != tt.noEffect || !strings.Contains(r.text, tt.text) {
			t.Errorf("driverFailure(%v) = %s %q noEffect %v; want %s %q noEffect %v", tt.err, r.tag, r.text, r.noEffect, tt.tag, tt.text, tt.noEffect)
		}
	}
}
