package guestctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// residentGuest is a fake guest with this build's helper in place and a
// channel to its resident helper: the channel answers only while the
// helper runs (alive), and `vmgate-guest serve --detach`, through the
// agent's exec, starts it.
type residentGuest struct {
	mu     sync.Mutex
	alive  bool
	serves int        // serve --detach runs
	argvs  [][]string // the agent's execs
}

func (g *residentGuest) kill() { g.mu.Lock(); g.alive = false; g.mu.Unlock() }

func (g *residentGuest) driver() *hypervisortest.Fake {
	sum, _ := fixedBinaries{}.Binary("amd64")
	reply := func(v any) []byte {
		b, _ := json.Marshal(wire.Reply{OK: true, Result: v})
		return b
	}
	return &hypervisortest.Fake{
		ExecStartFunc: func(_ context.Context, _ string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.argvs = append(g.argvs, req.Argv)
			return hypervisor.ExecHandle{PID: int64(len(g.argvs))}, nil
		},
		ExecStatusFunc: func(_ context.Context, _ string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			a := g.argvs[h.PID-1]
			switch {
			case a[0] == "uname":
				return hypervisor.ExecResult{Exited: true, Stdout: []byte("x86_64\n")}, nil
			case a[0] == "sha256sum":
				return hypervisor.ExecResult{Exited: true, Stdout: []byte(sum.SHA256 + "  " + a[1] + "\n")}, nil
			case len(a) > 2 && a[0] == GuestPath && a[1] == "serve" && a[2] == "--detach":
				g.alive, g.serves = true, g.serves+1
				return hypervisor.ExecResult{Exited: true, Stdout: reply(wire.Serving{PID: 100 + g.serves})}, nil
			}
			return hypervisor.ExecResult{Exited: true, ExitCode: 127}, nil
		},
		HelperCallFunc: func(_ context.Context, _ string, c hypervisor.HelperCall) (hypervisor.HelperReply, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			if !g.alive {
				return hypervisor.HelperReply{}, fmt.Errorf("fake channel: %w", hypervisor.ErrHelperUnavailable)
			}
			switch {
			case slices.Equal(c.Args, []string{"hello"}):
				return hypervisor.HelperReply{Stdout: reply(wire.Hello{Proto: wire.Proto, GOOS: "linux", GOARCH: "amd64", SHA256: sum.SHA256, PID: 100 + g.serves, Resident: true})}, nil
			case slices.Equal(c.Args, []string{"job", "start"}):
				return hypervisor.HelperReply{Stdout: reply(wire.JobStarted{ID: "j1", PID: 7, StartedAt: time.Now().UnixMilli()})}, nil
			}
			return hypervisor.HelperReply{Exit: 2}, nil
		},
	}
}

// TestJobStartAfterTheHelperDied: a job started after the resident helper
// died behind a decided road is not refused as "no resident helper": the
// call the channel did not take decides the road again, which starts the
// helper, and is sent once more, as every other command is (run).
func TestJobStartAfterTheHelperDied(t *testing.T) {
	g := &residentGuest{}
	h := New(g.driver(), fixedBinaries{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := RunRequest{Argv: []string{"sleep", "600"}}
	if _, err := h.Start(ctx, "vm1", req); err != nil {
		t.Fatalf("Start() = %v; want the helper started and the job with it", err)
	}
	if r := h.Road("vm1"); r.Kind != RoadResident || r.Jobs != ViaChannel || g.serves != 1 {
		t.Fatalf("road %+v after %d serve; want resident over the channel, one serve", r, g.serves)
	}
	g.kill()
	st, err := h.Start(ctx, "vm1", req)
	if errors.Is(err, ErrNotResident) || err != nil || st.ID != "j1" {
		t.Fatalf("Start() after the helper died = %+v, %v; want the helper started again and the job", st, err)
	}
	if r := h.Road("vm1"); r.Kind != RoadResident || r.Helper == nil || r.Helper.PID != 102 || g.serves != 2 {
		t.Errorf("road %+v after %d serves; want resident, the second helper (pid 102)", r, g.serves)
	}
}
