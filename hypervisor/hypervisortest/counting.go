package hypervisortest

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// Counting is a Fake driver that counts every call in calls and answers
// like a small healthy backend: vm1 running, vm2 stopped, commands that
// exit at once with "exited", files that hold "hello".
func Counting(calls *atomic.Int64) *Fake {
	return &Fake{
		ListVMsFunc: func(ctx context.Context) ([]hypervisor.VM, error) {
			calls.Add(1)
			return []hypervisor.VM{{Name: "vm1", State: hypervisor.StateRunning}, {Name: "vm2", State: hypervisor.StateStopped}}, nil
		},
		StatusFunc: func(ctx context.Context, vm string) (hypervisor.Status, error) {
			calls.Add(1)
			if vm != "vm1" && vm != "vm2" {
				return hypervisor.Status{}, fmt.Errorf("fake: %w", hypervisor.ErrUnknownVM)
			}
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning, AgentConnected: true}, nil
		},
		AgentInfoFunc: func(ctx context.Context, vm string) (hypervisor.AgentInfo, error) {
			calls.Add(1)
			return hypervisor.AgentInfo{Version: "9"}, nil
		},
		ExecStartFunc: func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			calls.Add(1)
			return hypervisor.ExecHandle{PID: 4242, StartedAt: time.Unix(1, 0)}, nil
		},
		ExecStatusFunc: func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			calls.Add(1)
			return hypervisor.ExecResult{PID: h.PID, Exited: true, Stdout: []byte("exited\n")}, nil
		},
		FileReadFunc: func(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
			calls.Add(1)
			return hypervisor.FileContent{Data: []byte("hello")}, nil
		},
		FileWriteFunc: func(ctx context.Context, vm, path string, data []byte, mode uint32) error {
			calls.Add(1)
			return nil
		},
		PowerFunc: func(ctx context.Context, vm string, action hypervisor.PowerAction) error {
			calls.Add(1)
			return nil
		},
	}
}
