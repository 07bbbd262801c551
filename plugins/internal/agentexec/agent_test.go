package agentexec

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

func TestAgentInfo(t *testing.T) {
	info := qga.Info{Version: "9.2.0", SupportedCommands: []qga.Command{{Name: "guest-exec", Enabled: true}, {Name: "guest-file-open"}}}
	want := hypervisor.AgentInfo{Version: "9.2.0", Commands: []hypervisor.AgentCommand{{Name: "guest-exec", Enabled: true}, {Name: "guest-file-open"}}}
	if got := AgentInfo(info); !reflect.DeepEqual(got, want) {
		t.Errorf("AgentInfo(%+v) = %+v; want %+v", info, got, want)
	}
}

func TestMapError(t *testing.T) {
	other := errors.New("other")
	disabled := fmt.Errorf("qga: guest-exec: %w", &qga.DisabledError{Command: "guest-exec", Err: &qga.Error{Class: "CommandNotFound", Desc: "disabled"}})
	for _, c := range []struct {
		name string
		err  error
		want error // a sentinel the result must match; nil: err unchanged
	}{
		{"timeout", fmt.Errorf("x: %w", qga.ErrTimeout), hypervisor.ErrTimeout},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), hypervisor.ErrTimeout},
		{"no agent", fmt.Errorf("x: %w", qga.ErrNoAgent), hypervisor.ErrAgentUnavailable},
		{"conn lost", fmt.Errorf("x: %w", qga.ErrConnLost), hypervisor.ErrAgentUnavailable},
		{"client closed", fmt.Errorf("x: %w", qga.ErrClosed), hypervisor.ErrAgentUnavailable},
		{"unknown exec", fmt.Errorf("x: %w", qga.ErrUnknownExec), hypervisor.ErrUnknownExec},
		{"invalid", fmt.Errorf("x: %w", qga.ErrInvalidArgument), hypervisor.ErrInvalidArgument},
		{"agent reply", fmt.Errorf("qga: guest-file-open: %w", &qga.Error{Class: "GenericError", Desc: "failed to open file '/nope' (mode: 'r'): No such file or directory"}), hypervisor.ErrBackend},
		{"other", other, nil},
	} {
		got := MapError(c.err)
		if c.want == nil {
			if got != c.err {
				t.Errorf("MapError(%s: %v) = %v; want it unchanged", c.name, c.err, got)
			}
			continue
		}
		if !errors.Is(got, c.want) || !errors.Is(got, c.err) {
			t.Errorf("MapError(%s: %v) = %v; want %v wrapping the original", c.name, c.err, got, c.want)
		}
	}
	// The agent's reply is the reason the server shows: its desc after
	// "backend error: ", nothing of the client's wrapping.
	reply := fmt.Errorf("qga: guest-exec: %w", &qga.Error{Class: "GenericError", Desc: "Guest agent command failed, error was 'Failed to execute child process (Exec format error)'"})
	if got, want := MapError(reply).Error(), "backend error: the guest agent answered: Guest agent command failed, error was 'Failed to execute child process (Exec format error)'"; got != want {
		t.Errorf("MapError(%v) = %q; want %q", reply, got, want)
	}
	var cd *hypervisor.CommandDisabledError
	if got := MapError(disabled); !errors.As(got, &cd) || cd.Command != "guest-exec" {
		t.Errorf("MapError(%v) = %v; want a *hypervisor.CommandDisabledError for guest-exec", disabled, got)
	}
}
