package guestctl

import (
	"bytes"
	"encoding/json"

	"fmt"
	"github.com/vmgate/vmgate/guest/agent/wire"
	"testing"
	"time"
)

// BenchmarkLabReadRange measures a 16 MiB ranged read against the
// driver's raw read of the same bytes, interleaved in one loop, and then
// by its parts: FileReadRange whole (exec, staging, file channel,
// unstage); a bare helper round trip (version); the host's view of each
// step (host-exec: the command that stages the range, host-piece: reading
// the pieces, host-unstage); and the guest's own time for the command and
// the unstage (by /proc/uptime, 10 ms steps). The first loop pushes the
// helper: run with -benchtime 3x or more.
//
//	VMGATE_REQUIRE_VM=1 go test -run '^$' -bench BenchmarkLabReadRange -benchtime 3x ./internal/guestctl/
func BenchmarkLabReadRange(b *testing.B) {
	const vm, p, size = "cg", "/tmp/vmgate-bench-range", 16 << 20
	h, _ := labHelper(b, vm)
	ctx := testCtx(b, 20*time.Minute)
	if res := shWithin(b, ctx, h, vm, "head -c 16777216 /dev/urandom > "+p, 5*time.Minute); res.ExitCode != 0 {
		b.Fatalf("making the file: exit %d: %s", res.ExitCode, res.Stderr)
	}
	defer sh(b, testCtx(b, time.Minute), h, vm, "rm -f "+p)
	var rangeT, rawT, versionT time.Duration
	timed := func(total *time.Duration, f func() error) {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		*total += time.Since(start)
	}
	for b.Loop() {
		var got, raw []byte
		timed(&rangeT, func() error {
			r, err := h.FileReadRange(ctx, vm, p, ReadOptions{Length: size})
			got = r.Data
			return err
		})
		timed(&rawT, func() (err error) {
			fc, err := h.d.FileRead(ctx, vm, p, size+1)
			raw = fc.Data
			return err
		})
		timed(&versionT, func() error {
			var v map[string]any
			return h.call(ctx, vm, "version", []string{"version", "--json"}, nil, 0, 1<<16, &v)
		})
		if !bytes.Equal(got, raw) || len(raw) != size {
			b.Fatalf("FileReadRange = %d bytes; the raw read %d; want the same %d", len(got), len(raw), size)
		}
	}
	// The guest side alone, by /proc/uptime (10 ms steps): the command
	// staging the range, and removing the stage.
	var cmdMS, unstageMS float64
	for range 2 {
		res := sh(b, ctx, h, vm, `read a _ < /proc/uptime; `+GuestPath+` --out auto file read --path `+p+` --offset 0 --length 16777216 > /tmp/vmgate-rr.json || exit 1; read m _ < /proc/uptime; `+
			GuestPath+` file unstage $(grep -o '"/var/lib/vmgate/xfer/x-[0-9a-f]*"' /tmp/vmgate-rr.json | tr -d '"' | sed 's/^/--path /') >/dev/null || exit 2; read z _ < /proc/uptime; echo "$a $m $z"`)
		var a, m, z float64
		if _, err := fmt.Sscan(string(res.Stdout), &a, &m, &z); err != nil || res.ExitCode != 0 {
			b.Fatalf("timed read = %q (exit %d, %s), %v", res.Stdout, res.ExitCode, res.Stderr, err)
		}
		cmdMS += (m - a) * 500
		unstageMS += (z - m) * 500
	}
	// The host's view of the same steps.
	var execMS, pieceMS, unMS float64
	for range 2 {
		t0 := time.Now()
		res, err := h.run(ctx, vm, "file read", []string{"--out", "auto", "file", "read", "--path", p, "--offset", "0", "--length", "16777216"}, nil, CommandTimeout, 1<<20)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		var r struct {
			Data *wire.DataOut `json:"data"`
		}
		line, _, _ := bytes.Cut(res.Stdout, []byte("\n"))
		if err := json.Unmarshal(line, &r); err != nil || r.Data == nil || len(r.Data.Staged) == 0 {
			b.Fatalf("reply %q: %v", line, err)
		}
		for _, p := range r.Data.Staged {
			if _, err := h.d.FileRead(ctx, vm, p.Path, p.Bytes); err != nil {
				b.Fatal(err)
			}
		}
		t2 := time.Now()
		(&execTransport{h: h}).unstage(ctx, vm, "", r.Data.Staged)
		t3 := time.Now()
		execMS += float64(t1.Sub(t0).Milliseconds()) / 2
		pieceMS += float64(t2.Sub(t1).Milliseconds()) / 2
		unMS += float64(t3.Sub(t2).Milliseconds()) / 2
	}
	b.ReportMetric(execMS, "host-exec-ms")
	b.ReportMetric(pieceMS, "host-piece-ms")
	b.ReportMetric(unMS, "host-unstage-ms")
	b.ReportMetric(cmdMS, "guest-cmd-ms")
	b.ReportMetric(unstageMS, "guest-unstage-ms")
	n := float64(b.N)
	b.ReportMetric(float64(rangeT.Milliseconds())/n, "range-ms/op")
	b.ReportMetric(float64(rawT.Milliseconds())/n, "raw-ms/op")
	b.ReportMetric(float64(versionT.Milliseconds())/n, "version-ms/op")
	b.ReportMetric(float64(rawT)/float64(rangeT), "raw/range")
}
