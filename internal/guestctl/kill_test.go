package guestctl

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// fixedBinaries supplies one fake build for every architecture.
type fixedBinaries struct{}

func (fixedBinaries) Binary(arch string) (Binary, error) {
	return Binary{Data: []byte("\x7fELF"), SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Source: "test"}, nil
}

// TestKillChecksArgumentsOnly: the host refuses malformed arguments before
// anything reaches the guest, and passes every well-formed pid on, pid 1
// included: the guards are vmgate-guest's (guest/agent/kill.go).
func TestKillChecksArgumentsOnly(t *testing.T) {
	var mu sync.Mutex
	var argvs [][]string
	d := &hypervisortest.Fake{
		ExecStartFunc: func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			mu.Lock()
			argvs = append(argvs, req.Argv)
			mu.Unlock()
			return hypervisor.ExecHandle{}, errors.New("fake guest: no exec")
		},
	}
	h := New(d, fixedBinaries{})
	ctx := context.Background()
	for _, tt := range []struct {
		pid       int
		signal    string
		startedAt int64
	}{{0, "TERM", 0}, {-5, "TERM", 0}, {42, "BOGUS", 0}, {42, "TERM", -1}} {
		if _, err := h.Kill(ctx, "vm1", tt.pid, tt.signal, tt.startedAt); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("Kill(%d, %q, %d) = %v; want ErrInvalidArgument", tt.pid, tt.signal, tt.startedAt, err)
		}
	}
	if len(argvs) != 0 {
		t.Fatalf("invalid kills ran %q in the guest; want nothing", argvs)
	}
	_, err := h.Kill(ctx, "vm1", 1, "KILL", 0)
	if errors.Is(err, ErrRefused) || errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("Kill(1) = %v; want it passed to the guest, not refused on the host", err)
	}
	if len(argvs) == 0 || !slices.Equal(argvs[0], []string{"uname", "-m"}) {
		t.Errorf("Kill(1) ran %q in the guest; want it to start by checking the helper (uname -m)", argvs)
	}
}
