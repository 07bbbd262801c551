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
	calls     [][]string // the channel's calls, by arguments
	stdins    []int      // their stdin lengths
	staged    int        // bytes the file channel wrote
	fileReads int        // the file channel's reads
}

// read answers file read --out MODE ... --length N: N bytes of 'r' inline
// after the reply's line (--out inline); any other mode is refused, so a
// read that would stage or come back in pieces fails.
func (g *channelGuest) read(mode, length string) (hypervisor.HelperReply, error) {
	var n int64
	fmt.Sscan(length, &n)
	if mode != "inline" {
		return hypervisor.HelperReply{}, fmt.Errorf("--out %s on the channel; want inline", mode)
	}
	line, _ := json.Marshal(wire.Reply{OK: true, Result: wire.FileRead{Bytes: n}, Data: &wire.DataOut{Bytes: n}})
	return hypervisor.HelperReply{Stdout: append(append(line, '\n'), bytes.Repeat([]byte{'r'}, int(n))...)}, nil
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
		case len(args) > 8 && args[0] == "--out" && args[2] == "file" && args[3] == "read":
			return g.read(args[1], args[9])
		}
		return hello(ctx, vm, c)
	}
	d.FileReadFunc = func(_ context.Context, _, _ string, _ int64) (hypervisor.FileContent, error) {
		g.mu.Lock()
		g.fileReads++
		g.mu.Unlock()
		return hypervisor.FileContent{}, fmt.Errorf("the file channel was used")
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

// TestRangeReadOverTheChannel: with a resident helper on a channel of its
// own, a range's data (past what exec output carries inline) comes back
// inline in the one reply on the channel (--out inline): no staging file,
// no read on the driver's file channel; progress says the bytes arrived.
func TestRangeReadOverTheChannel(t *testing.T) {
	for _, n := range []int64{1, inlineMax + 1, 6 << 20, 16 << 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			g := &channelGuest{}
			h := New(g.driver(), fixedBinaries{})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var progress [][2]int64
			o := ReadOptions{Length: n, Progress: func(done, total int64) { progress = append(progress, [2]int64{done, total}) }}
			got, err := h.FileReadRange(ctx, "vm1", "/srv/big", o)
			if err != nil {
				t.Fatalf("FileReadRange(%d bytes) = %v", n, err)
			}
			if int64(len(got.Data)) != n || len(g.calls) != 1 || g.fileReads != 0 {
				t.Errorf("FileReadRange(%d bytes) = %d bytes in %d channel calls %q, %d file-channel reads; want the %d bytes in one call, no file channel", n, len(got.Data), len(g.calls), g.calls, g.fileReads, n)
			}
			if want := [][2]int64{{n, n}}; !slices.Equal(progress, want) {
				t.Errorf("progress = %v; want %v", progress, want)
			}
		})
	}
}
