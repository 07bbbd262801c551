package guestctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
)

// channelGuest is residentGuest (a resident helper on a channel of its
// own) that also answers file stage and archive write on the channel, and
// records what crossed each road.
type channelGuest struct {
	residentGuest
	calls  [][]string // the channel's calls, by arguments
	stdins []int      // their stdin lengths
	staged int        // bytes the file channel wrote
}

func (g *channelGuest) driver() hypervisor.Driver {
	d := g.residentGuest.driver()
	hello := d.HelperCallFunc
	reply := func(v any) hypervisor.HelperReply {
		b, _ := json.Marshal(wire.Reply{OK: true, Result: v})
		return hypervisor.HelperReply{Stdout: b}
	}
	d.HelperCallFunc = func(ctx context.Context, vm string, c hypervisor.HelperCall) (hypervisor.HelperReply, error) {
		args := c.Args
		g.mu.Lock()
		if args[0] != "hello" {
			g.calls, g.stdins = append(g.calls, args), append(g.stdins, len(c.Stdin))
		}
		g.mu.Unlock()
		if args[0] == "--in" {
			args = args[2:]
		}
		switch {
		case len(args) == 4 && args[0] == "file" && args[1] == "stage":
			var n int
			fmt.Sscan(args[3], &n)
			out := make([]wire.FileInfo, n)
			for i := range out {
				out[i] = wire.FileInfo{Path: fmt.Sprintf("/var/lib/vmgate/xfer/x-%032x", i), Exists: true}
			}
			return reply(out), nil
		case len(args) > 1 && args[0] == "archive" && args[1] == "write":
			return reply(wire.ArchiveWritten{Path: args[3], Entries: []wire.ArchiveEntry{}}), nil
		}
		return hello(ctx, vm, c)
	}
	d.FileWriteFunc = func(_ context.Context, _, _ string, data []byte, _ uint32) error {
		g.mu.Lock()
		g.staged += len(data)
		g.mu.Unlock()
		return nil
	}
	return d
}

// TestLargeDataOverTheChannel: with a resident helper on a channel of its
// own, data over StdinMax (up to ChannelStdinMax) goes as the command's
// stdin in one call on the channel, with no staging file and nothing on
// the driver's file channel, and progress says so at its start and end;
// more than ChannelStdinMax is staged as before. (Without such a channel
// data is staged: TestFileWriteStagesLargeData.)
func TestLargeDataOverTheChannel(t *testing.T) {
	for _, n := range []int{StdinMax + 1, 5 << 20, ChannelStdinMax, ChannelStdinMax + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			g := &channelGuest{}
			h := New(g.driver(), fixedBinaries{})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			data := bytes.Repeat([]byte{'t'}, n)
			var progress [][2]int64
			o := ArchiveWriteOptions{Progress: func(done, total int64) { progress = append(progress, [2]int64{done, total}) }}
			if _, err := h.ArchiveWrite(ctx, "vm1", "/srv/tree", data, o); err != nil {
				t.Fatalf("ArchiveWrite(%d bytes) = %v", n, err)
			}
			last := g.calls[len(g.calls)-1]
			if n <= ChannelStdinMax {
				if last[0] != "archive" || g.stdins[len(g.stdins)-1] != n || g.staged != 0 || len(g.calls) != 1 {
					t.Errorf("channel calls %q with stdin %v, %d bytes staged; want one archive write carrying the %d bytes, nothing staged", g.calls, g.stdins, g.staged, n)
				}
				if want := [][2]int64{{0, int64(n)}, {int64(n), int64(n)}}; !slices.Equal(progress, want) {
					t.Errorf("progress = %v; want %v", progress, want)
				}
				return
			}
			if last[0] != "--in" || g.staged != n || slices.Max(g.stdins) > StdinMax {
				t.Errorf("last channel call %q, %d bytes staged, stdins %v; want archive write --in the %d bytes staged, no stdin over %d", last, g.staged, g.stdins, n, StdinMax)
			}
		})
	}
}
