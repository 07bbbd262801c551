package guestctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// fileGuest is a fake guest with the helper in place that answers file
// stage and file write and records what crossed the exec and file channels.
type fileGuest struct {
	mu      sync.Mutex
	argvs   [][]string
	stdins  []int             // stdin length of every exec
	written map[string][]byte // driver FileWrite calls
}

const stagedAt = "/var/lib/vmgate/xfer/x-0123456789abcdef0123456789abcdef"

func (g *fileGuest) driver() *hypervisortest.Fake {
	return &hypervisortest.Fake{
		ExecStartFunc: func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.argvs = append(g.argvs, req.Argv)
			g.stdins = append(g.stdins, len(req.Stdin))
			return hypervisor.ExecHandle{PID: int64(len(g.argvs))}, nil
		},
		ExecStatusFunc: func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			a := g.argvs[h.PID-1]
			out := func(v any) hypervisor.ExecResult {
				b, _ := json.Marshal(wire.Reply{OK: true, Result: v})
				return hypervisor.ExecResult{Exited: true, Stdout: b}
			}
			switch {
			case a[0] == "uname":
				return hypervisor.ExecResult{Exited: true, Stdout: []byte("x86_64\n")}, nil
			case a[0] == "sha256sum":
				sum, _ := fixedBinaries{}.Binary("amd64")
				return hypervisor.ExecResult{Exited: true, Stdout: []byte(sum.SHA256 + "  " + a[1] + "\n")}, nil
			case slices.Equal(a[1:], []string{"file", "stage", "--count", "1"}):
				return out([]wire.FileInfo{{Path: stagedAt, Exists: true}}), nil
			case a[1] == "file" && a[2] == "write":
				return out(wire.FileWritten{FileInfo: wire.FileInfo{Path: a[4], Mode: 0o644}, Bytes: 1}), nil
			case a[1] == "--in" && a[3] == "file" && a[4] == "write":
				return out(wire.FileWritten{FileInfo: wire.FileInfo{Path: a[6], Mode: 0o644}, Bytes: 1}), nil
			}
			return hypervisor.ExecResult{Exited: true, ExitCode: 127}, nil
		},
		FileWriteFunc: func(ctx context.Context, vm, path string, data []byte, mode uint32) error {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.written[path] = data
			return nil
		},
	}
}

// TestFileWriteStagesLargeData: up to StdinMax the data is the write's
// stdin; beyond, it goes through the file channel to the staging path file
// stage gave, and write takes it --in from there. No exec ever carries more
// than StdinMax of stdin (Proxmox relays at most 64 KiB).
func TestFileWriteStagesLargeData(t *testing.T) {
	for _, n := range []int{0, 10, StdinMax, StdinMax + 1, wire.SmallPieceBytes} { // the largest: one piece
		g := &fileGuest{written: map[string][]byte{}}
		h := New(g.driver(), fixedBinaries{})
		data := bytes.Repeat([]byte{'z'}, n)
		if _, err := h.FileWrite(context.Background(), "vm1", "/srv/out", data, WriteOptions{CreateMode: 0o644}); err != nil {
			t.Fatalf("FileWrite(%d bytes) = %v", n, err)
		}
		last := g.argvs[len(g.argvs)-1]
		staged := n > StdinMax
		if got := slices.Contains(last, "--in") && slices.Contains(last, stagedAt+":"+strconv.Itoa(n)); got != staged {
			t.Errorf("FileWrite(%d bytes): last command %q; want --in %s:%d %v", n, last, stagedAt, n, staged)
		}
		if staged && (!bytes.Equal(g.written[stagedAt], data) || len(g.written) != 1) {
			t.Errorf("FileWrite(%d bytes): file channel wrote %d paths; want the data at %s only", n, len(g.written), stagedAt)
		}
		if !staged && len(g.written) != 0 {
			t.Errorf("FileWrite(%d bytes): file channel used for %d paths; want stdin only", n, len(g.written))
		}
		if m := slices.Max(g.stdins); m > StdinMax {
			t.Errorf("FileWrite(%d bytes): an exec carried %d bytes of stdin; want at most %d", n, m, StdinMax)
		}
	}
}

func TestFileArgumentsCheckedOnTheHost(t *testing.T) {
	g := &fileGuest{written: map[string][]byte{}}
	h := New(g.driver(), fixedBinaries{})
	ctx := context.Background()
	suid := uint32(0o4755)
	bad := []struct {
		name string
		run  func() error
		want string
	}{
		{"relative", func() error { _, err := h.FileRead(ctx, "vm1", "etc/passwd", 10); return err }, "is not absolute"},
		{"dotdot", func() error { _, err := h.FileRead(ctx, "vm1", "/tmp/../etc/passwd", 10); return err }, "is not clean"},
		{"trailing slash", func() error { _, err := h.FileStat(ctx, "vm1", "/tmp/", false, false); return err }, "is not clean"},
		{"NUL", func() error { _, err := h.FileWrite(ctx, "vm1", "/tmp/a\x00b", nil, WriteOptions{}); return err }, "NUL"},
		{"max bytes", func() error { _, err := h.FileRead(ctx, "vm1", "/tmp/a", 0); return err }, "out of range"},
		{"setuid without leave", func() error {
			_, err := h.FileWrite(ctx, "vm1", "/tmp/a", nil, WriteOptions{Mode: &suid, CreateMode: 0o644})
			return err
		}, "setuid"},
		{"setuid default without leave", func() error {
			_, err := h.FileWrite(ctx, "vm1", "/tmp/a", nil, WriteOptions{CreateMode: 0o4755})
			return err
		}, "setuid"},
	}
	for _, tc := range bad {
		err := tc.run()
		if !errors.Is(err, hypervisor.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrInvalidArgument saying %q", tc.name, err, tc.want)
		}
	}
	if len(g.argvs) != 0 {
		t.Errorf("refused arguments ran %q in the guest; want nothing", g.argvs)
	}
}
