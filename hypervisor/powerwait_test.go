package hypervisor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// bootGuest is a guest whose reboot takes effect some readings after the
// backend took it, as a reboot through the guest agent does.
type bootGuest struct {
	mu      sync.Mutex // guards every field below
	boot    int        // the boot the guest runs
	pending int        // readings of the old boot id left before a requested boot starts; -1: none requested
	lag     int        // readings a reboot or reset leaves the old boot in place
	never   bool       // a requested boot never starts (a guest that hangs in shutdown)
	noExec  bool       // exec is refused (guest-exec disabled)
	noFile  bool       // the agent's file read is refused
	noAgent bool       // the agent answers nothing
	powered []hypervisor.PowerAction
	reads   int // boot id readings, through either channel
}

func bootUUID(n int) string { return fmt.Sprintf("%08x-0000-4000-8000-000000000000", n) }

// bootID is what a reading of the boot id sees now; a pending boot comes
// closer with every reading.
func (g *bootGuest) bootID() (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.noAgent {
		return "", fmt.Errorf("guest agent: %w", hypervisor.ErrAgentUnavailable)
	}
	g.reads++
	if g.pending == 0 && !g.never {
		g.boot, g.pending = g.boot+1, -1
	} else if g.pending > 0 {
		g.pending--
	}
	return bootUUID(g.boot) + "\n", nil
}

func (g *bootGuest) driver() *hypervisortest.Fake {
	return &hypervisortest.Fake{
		ExecStartFunc: func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			g.mu.Lock()
			refused := g.noExec
			g.mu.Unlock()
			if refused || len(req.Argv) != 2 || req.Argv[0] != "cat" || req.Argv[1] != hypervisor.BootIDPath {
				return hypervisor.ExecHandle{}, &hypervisor.CommandDisabledError{Command: "guest-exec"}
			}
			id, err := g.bootID()
			return hypervisor.ExecHandle{PID: 7, Token: id}, err
		},
		ExecStatusFunc: func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			return hypervisor.ExecResult{PID: h.PID, Exited: true, Stdout: []byte(h.Token)}, nil
		},
		FileReadFunc: func(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
			g.mu.Lock()
			refused := g.noFile
			g.mu.Unlock()
			if refused || path != hypervisor.BootIDPath {
				return hypervisor.FileContent{}, &hypervisor.CommandDisabledError{Command: "guest-file-open"}
			}
			id, err := g.bootID()
			return hypervisor.FileContent{Data: []byte(id)}, err
		},
		PowerFunc: func(ctx context.Context, vm string, action hypervisor.PowerAction) error {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.powered = append(g.powered, action)
			if action == hypervisor.PowerReboot || action == hypervisor.PowerReset {
				g.pending = g.lag
			}
			return nil
		},
	}
}

// TestPowerWait: a reboot or reset returns once the guest reads a new boot
// id, through exec or else the agent's file read, however long the old
// boot lingers; one whose boot id cannot be read first is done and says it
// did not wait; a guest that never boots anew ends in ErrTimeout saying the
// action was done; other actions only power (issue 32, item 11).
func TestPowerWait(t *testing.T) {
	tests := []struct {
		name      string
		action    hypervisor.PowerAction
		guest     *bootGuest
		timeout   time.Duration
		wantErr   error
		wantWait  bool   // WaitedFor new boot, BootIDChanged
		wantNoWay string // a substring of NoWait
		wantReads int    // at least this many readings
	}{
		{name: "reboot lingers", action: hypervisor.PowerReboot, guest: &bootGuest{lag: 5}, wantWait: true, wantReads: 7},
		{name: "reset at once", action: hypervisor.PowerReset, guest: &bootGuest{}, wantWait: true, wantReads: 2},
		{name: "exec disabled: file read", action: hypervisor.PowerReboot, guest: &bootGuest{lag: 2, noExec: true}, wantWait: true, wantReads: 4},
		{name: "file read refused: exec", action: hypervisor.PowerReset, guest: &bootGuest{lag: 1, noFile: true}, wantWait: true, wantReads: 3},
		{name: "no agent", action: hypervisor.PowerReset, guest: &bootGuest{noAgent: true}, wantNoWay: "could not be read before the reset"},
		{name: "neither channel", action: hypervisor.PowerReboot, guest: &bootGuest{noExec: true, noFile: true}, wantNoWay: "guest-exec"},
		{name: "never boots anew", action: hypervisor.PowerReboot, guest: &bootGuest{never: true}, timeout: 300 * time.Millisecond, wantErr: hypervisor.ErrTimeout},
		{name: "stop", action: hypervisor.PowerStop, guest: &bootGuest{}},
		{name: "start", action: hypervisor.PowerStart, guest: &bootGuest{}},
		{name: "shutdown", action: hypervisor.PowerShutdown, guest: &bootGuest{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := tt.guest
			g.pending = -1
			timeout := tt.timeout
			if timeout == 0 {
				timeout = time.Minute
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			out, err := hypervisor.PowerWait(ctx, g.driver(), "vm", tt.action)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("PowerWait(%s) = %+v, %v; want error %v", tt.action, out, err, tt.wantErr)
			}
			if tt.wantErr != nil && !strings.Contains(err.Error(), "was done") {
				t.Errorf("PowerWait(%s) error %q; want it to say the %s was done", tt.action, err, tt.action)
			}
			if len(g.powered) != 1 || g.powered[0] != tt.action {
				t.Errorf("PowerWait(%s) powered %v; want exactly [%s]", tt.action, g.powered, tt.action)
			}
			waited := out.WaitedFor == hypervisor.WaitedForNewBoot && out.BootIDChanged
			if waited != tt.wantWait {
				t.Errorf("PowerWait(%s) = %+v; want waited for a new boot %v", tt.action, out, tt.wantWait)
			}
			if tt.wantWait && (out.BootIDBefore != bootUUID(0) || out.BootIDAfter != bootUUID(1)) {
				t.Errorf("PowerWait(%s) boot ids %q → %q; want %q → %q", tt.action, out.BootIDBefore, out.BootIDAfter, bootUUID(0), bootUUID(1))
			}
			if !strings.Contains(out.NoWait, tt.wantNoWay) || (tt.wantNoWay == "") != (out.NoWait == "") {
				t.Errorf("PowerWait(%s) NoWait = %q; want it to say %q", tt.action, out.NoWait, tt.wantNoWay)
			}
			if g.reads < tt.wantReads || (tt.wantReads == 0 && tt.wantErr == nil && g.reads != 0) {
				t.Errorf("PowerWait(%s) read the boot id %d times; want at least %d (none when it does not wait)", tt.action, g.reads, tt.wantReads)
			}
		})
	}
}

// TestPowerWaitPowerFails: a refused action is the error, with no wait.
func TestPowerWaitPowerFails(t *testing.T) {
	g := &bootGuest{pending: -1}
	f := g.driver()
	f.PowerFunc = func(context.Context, string, hypervisor.PowerAction) error {
		return fmt.Errorf("vbox: %w: no guest reboot", hypervisor.ErrNotSupported)
	}
	out, err := hypervisor.PowerWait(context.Background(), f, "vm", hypervisor.PowerReboot)
	if !errors.Is(err, hypervisor.ErrNotSupported) || out.WaitedFor != "" || g.reads != 1 {
		t.Errorf("PowerWait(reboot refused) = %+v, %v after %d readings; want ErrNotSupported, no wait, the one reading before", out, err, g.reads)
	}
}

// TestReadBootID: what a boot id reading accepts.
func TestReadBootID(t *testing.T) {
	for _, tt := range []struct {
		out  string
		ok   bool
		want string
	}{
		{"3f2b2e39-5a5c-4a43-9f44-5d2d2f6bb0a1\n", true, "3f2b2e39-5a5c-4a43-9f44-5d2d2f6bb0a1"},
		{"", false, ""},
		{"not a uuid\n", false, ""},
		{"3F2B2E39-5A5C-4A43-9F44-5D2D2F6BB0A1\n", false, ""},
		{"3f2b2e39-5a5c-4a43-9f44-5d2d2f6bb0a1 extra\n", false, ""},
	} {
		f := &hypervisortest.Fake{
			ExecStartFunc: func(context.Context, string, hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
				return hypervisor.ExecHandle{Token: tt.out}, nil
			},
			ExecStatusFunc: func(_ context.Context, _ string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
				return hypervisor.ExecResult{Exited: true, Stdout: []byte(h.Token)}, nil
			},
		}
		got, err := hypervisor.ReadBootID(context.Background(), f, "vm")
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ReadBootID(output %q) = %q, %v; want %q, ok %v", tt.out, got, err, tt.want, tt.ok)
		}
	}
}
