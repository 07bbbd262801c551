package guestctl

import (
	"archive/tar"
	"bytes"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// benchArchiveTree is a tar of n files of 1–3 KiB in 50 directories (row
// 12c's tree).
func benchArchiveTree(n int) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	content := bytes.Repeat([]byte("0123456789abcdef"), 256)
	for i := range n {
		dir := "src/d" + strconv.Itoa(i%50)
		if i < 50 {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: time.Unix(1700000000, 0)})
		}
		size := 1024 + i%2048
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dir + "/f" + strconv.Itoa(i) + ".go", Mode: 0o644, Size: int64(size), ModTime: time.Unix(1700000000, 0)})
		tw.Write(content[:size])
	}
	tw.Close()
	return buf.Bytes()
}

// BenchmarkLabArchiveWrite measures row 12c below the tool: ArchiveWrite
// of a 2,000-file tar against tar -x with the tar on the agent's exec
// stdin, and then by its parts: on the host, the command with the tar over
// the resident helper's channel, against staging the tar (file stage and
// the file channel) and the command taking it from there; in the guest (by
// /proc/uptime, 10 ms steps), the extraction from a file, its plan alone,
// tar -x from the same file, and a sync after it. The first loop pushes
// the helper: run with -benchtime 3x or more.
//
//	VMGATE_REQUIRE_VM=1 go test -run '^$' -bench BenchmarkLabArchiveWrite -benchtime 3x ./internal/guestctl/
func BenchmarkLabArchiveWrite(b *testing.B) {
	const vm, dir = "cg", "/tmp/vmgate-bench-arch"
	h, _ := labHelper(b, vm)
	ctx := testCtx(b, 20*time.Minute)
	data := benchArchiveTree(2000)
	defer sh(b, testCtx(b, time.Minute), h, vm, "rm -rf "+dir+"-*")
	var toolT, rawT time.Duration
	i := 0
	for b.Loop() {
		i++
		t0 := time.Now()
		w, err := h.ArchiveWrite(ctx, vm, fmt.Sprintf("%s-tool%d", dir, i), data, ArchiveWriteOptions{Create: true})
		if err != nil || w.Written != 2050 {
			b.Fatalf("ArchiveWrite = %d written, %v", w.Written, err)
		}
		toolT += time.Since(t0)
		sh(b, ctx, h, vm, fmt.Sprintf("mkdir -p %s-raw%d", dir, i))
		t0 = time.Now()
		res, err := hypervisor.Run(ctx, h.d, vm, hypervisor.ExecRequest{Argv: []string{"tar", "-x", "-C", fmt.Sprintf("%s-raw%d", dir, i)}, Stdin: data, Timeout: 5 * time.Minute})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("tar -x: %v %s", err, res.Stderr)
		}
		rawT += time.Since(t0)
		sh(b, ctx, h, vm, "rm -rf "+dir+"-*")
	}
	n := float64(b.N)
	b.ReportMetric(float64(toolT.Milliseconds())/n, "tool-ms/op")
	b.ReportMetric(float64(rawT.Milliseconds())/n, "raw-ms/op")
	// The host's view: the tar over the resident helper's channel as the
	// command's stdin (ArchiveWrite's road), against staging it through
	// the file channel and the command taking it --in.
	t0 := time.Now()
	res, err := h.runResident(ctx, vm, "archive write", ViaChannel, []string{"archive", "write", "--path", dir + "-chan", "--create"}, data, 5*time.Minute, 1<<20)
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("archive write over the channel: %v %s", err, truncate(res.Stdout, 300))
	}
	t1 := time.Now()
	c := Command{Op: "archive write", In: data}
	tr := &execTransport{h: h}
	pieces, err := tr.stageIn(ctx, vm, &c)
	if err != nil {
		b.Fatal(err)
	}
	t2 := time.Now()
	res, err = h.run(ctx, vm, "archive write", []string{"--in", pieceList(pieces), "archive", "write", "--path", dir + "-staged", "--create"}, nil, 5*time.Minute, 1<<20)
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("archive write --in: %v %s", err, truncate(res.Stdout, 300))
	}
	t3 := time.Now()
	b.ReportMetric(float64(t1.Sub(t0).Milliseconds()), "host-channel-ms")
	b.ReportMetric(float64(t2.Sub(t1).Milliseconds()), "host-stage-ms")
	b.ReportMetric(float64(t3.Sub(t2).Milliseconds()), "host-staged-cmd-ms")
	// The guest's view, the tar in a file: the extraction, its plan alone
	// (--dry-run), tar -x, a sync after it.
	if err := h.d.FileWrite(ctx, vm, "/tmp/vmgate-bench.tar", data, 0o600); err != nil {
		b.Fatal(err)
	}
	line := `t() { read a _ < /proc/uptime; "$@" >/dev/null || exit 1; read z _ < /proc/uptime; echo "$a $z"; }; ` +
		`t ` + GuestPath + ` archive write --path ` + dir + `-g1 --create < /tmp/vmgate-bench.tar; ` +
		`t ` + GuestPath + ` archive write --path ` + dir + `-g2 --create --dry-run < /tmp/vmgate-bench.tar; ` +
		`mkdir -p ` + dir + `-g3; t tar -xf /tmp/vmgate-bench.tar -C ` + dir + `-g3; t sync`
	out := shWithin(b, ctx, h, vm, line, 5*time.Minute)
	var ts [8]float64
	if _, err := fmt.Sscan(string(out.Stdout), &ts[0], &ts[1], &ts[2], &ts[3], &ts[4], &ts[5], &ts[6], &ts[7]); err != nil || out.ExitCode != 0 {
		b.Fatalf("timed guest steps = %q (exit %d, %s): %v", out.Stdout, out.ExitCode, out.Stderr, err)
	}
	for i, name := range []string{"guest-extract-ms", "guest-plan-ms", "guest-tar-ms", "guest-sync-ms"} {
		b.ReportMetric((ts[2*i+1]-ts[2*i])*1000, name)
	}
}
