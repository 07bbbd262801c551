package guestctl

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// startSleeps starts n sleeps in session s and checks they are all there.
func startSleeps(b *testing.B, ctx context.Context, h *Helper, vm, session string, n int) {
	b.Helper()
	line := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do sleep 1100 & i=$((i+1)); done`, n)
	if _, err := h.Run(ctx, vm, RunRequest{Session: session, Shell: line, TimeoutMS: 120000}); err != nil {
		b.Fatalf("starting %d sleeps: %v", n, err)
	}
	ps, err := h.PS(ctx, vm, session)
	if err != nil || len(ps) != n {
		b.Fatalf("session has %d processes, %v; want %d", len(ps), err, n)
	}
}

// BenchmarkLabPS measures a full ps (host → driver → vmgate-guest → JSON
// back) with 1,000 extra processes in the guest, against a baseline helper
// round trip (`version`) in the same process.
//
//	go test -run '^$' -bench BenchmarkLabPS -benchtime 5x ./internal/guestctl/
func BenchmarkLabPS(b *testing.B) {
	h, _ := labHelper(b, "cg")
	ctx := testCtx(b, 10*time.Minute)
	s, err := h.SessionCreate(ctx, "cg", SessionCreate{ID: NewSessionID()})
	if err != nil {
		b.Fatal(err)
	}
	defer h.SessionDestroy(context.Background(), "cg", s.ID)
	startSleeps(b, ctx, h, "cg", s.ID, 1000)
	b.Run("baseline-version", func(b *testing.B) {
		for b.Loop() {
			var v map[string]any
			if err := h.call(ctx, "cg", "version", []string{"version", "--json"}, nil, 0, 1<<16, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ps-1000", func(b *testing.B) {
		for b.Loop() {
			ps, err := h.PS(ctx, "cg", "")
			if err != nil || len(ps) < 1000 {
				b.Fatalf("PS = %d rows, %v", len(ps), err)
			}
		}
	})
	// The guest side alone: vmgate-guest ps timed inside the guest (by
	// /proc/uptime, 10 ms steps), and the size of its reply.
	b.Run("ps-1000-guest-side", func(b *testing.B) {
		var guestMS, replyBytes float64
		for b.Loop() {
			res := sh(b, ctx, h, "cg", `read a _ < /proc/uptime; `+GuestPath+` ps > /tmp/vmgate-ps.json || exit 1; read z _ < /proc/uptime; echo "$a $z $(wc -c < /tmp/vmgate-ps.json)"; rm -f /tmp/vmgate-ps.json`)
			var start, end float64
			var n int
			if _, err := fmt.Sscan(string(res.Stdout), &start, &end, &n); err != nil || res.ExitCode != 0 || n < 1000 {
				b.Fatalf("timed ps = %q (exit %d), %v", res.Stdout, res.ExitCode, err)
			}
			guestMS += (end - start) * 1000
			replyBytes = float64(n)
		}
		b.ReportMetric(guestMS/float64(b.N), "guest-ms/op")
		b.ReportMetric(replyBytes, "reply-bytes")
	})
}

// BenchmarkLabDestroy50 measures destroying a session of 50 processes,
// host round trip; guest-ms/op is the guest side's own measure.
func BenchmarkLabDestroy50(b *testing.B) {
	for _, vm := range labVMs {
		b.Run(vm, func(b *testing.B) {
			h, _ := labHelper(b, vm)
			ctx := testCtx(b, 10*time.Minute)
			var guestMS int64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				s, err := h.SessionCreate(ctx, vm, SessionCreate{ID: NewSessionID()})
				if err != nil {
					b.Fatal(err)
				}
				startSleeps(b, ctx, h, vm, s.ID, 50)
				b.StartTimer()
				d, err := h.SessionDestroy(ctx, vm, s.ID)
				if err != nil || d.Killed != 50 {
					b.Fatalf("SessionDestroy = %+v, %v; want 50 killed", d, err)
				}
				guestMS += d.TookMS
			}
			b.ReportMetric(float64(guestMS)/float64(b.N), "guest-ms/op")
		})
	}
}

// BenchmarkLabRunSandboxed measures `run /bin/true` in a sandboxed session
// against the same in an unsandboxed one, interleaved in one loop; the
// ratio is the sandbox's cost (the shim's exec, Landlock ruleset,
// namespaces, uid) as seen from the host.
//
//	go test -run '^$' -bench BenchmarkLabRunSandboxed -benchtime 20x ./internal/guestctl/
func BenchmarkLabRunSandboxed(b *testing.B) {
	h, _ := labHelper(b, "cg")
	ctx := testCtx(b, 10*time.Minute)
	plain, err := h.SessionCreate(ctx, "cg", SessionCreate{ID: NewSessionID()})
	if err != nil {
		b.Fatal(err)
	}
	defer h.SessionDestroy(context.Background(), "cg", plain.ID)
	boxed, err := h.SessionCreate(ctx, "cg", SessionCreate{ID: NewSessionID(), Sandbox: &Sandbox{}})
	if err != nil {
		b.Fatal(err)
	}
	defer h.SessionDestroy(context.Background(), "cg", boxed.ID)
	var plainT, boxedT time.Duration
	var plainGuest, boxedGuest int64
	run := func(id string, total *time.Duration, guest *int64) {
		start := time.Now()
		res, err := h.Run(ctx, "cg", RunRequest{Session: id, Argv: []string{"/bin/true"}})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("Run(/bin/true) = %+v, %v", res, err)
		}
		*total += time.Since(start)
		*guest += res.DurationMS
	}
	var outsideT time.Duration
	for b.Loop() {
		run(plain.ID, &plainT, &plainGuest)
		run(boxed.ID, &boxedT, &boxedGuest)
		start := time.Now()
		if res, err := hypervisor.Run(ctx, h.d, "cg", hypervisor.ExecRequest{Argv: []string{"/bin/true"}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("driver Run(/bin/true) = %+v, %v", res, err)
		}
		outsideT += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(float64(outsideT.Microseconds())/n/1000, "outside-ms/op")
	b.ReportMetric(float64(boxedT)/float64(outsideT), "sandboxed/outside")
	b.ReportMetric(float64(plainT.Microseconds())/n/1000, "plain-ms/op")
	b.ReportMetric(float64(boxedT.Microseconds())/n/1000, "sandboxed-ms/op")
	b.ReportMetric(float64(boxedT)/float64(plainT), "sandboxed/plain")
	b.ReportMetric(float64(boxedGuest)/n, "sandboxed-guest-ms/op")
	b.ReportMetric(float64(plainGuest)/n, "plain-guest-ms/op")
}

// BenchmarkLabRunSandboxedGuestSide measures the sandbox's own share of a
// run without the host round trip: inside the guest, 40 pairs of
// `vmgate-guest run /bin/true`, one in a plain session and one in a
// sandboxed one, alternating (so the guest's load falls on both alike),
// each timed by /proc/uptime (10 ms steps, which average out over the
// runs); sandbox-ms/run is the difference per run.
//
//	go test -run '^$' -bench BenchmarkLabRunSandboxedGuestSide -benchtime 3x ./internal/guestctl/
func BenchmarkLabRunSandboxedGuestSide(b *testing.B) {
	h, _ := labHelper(b, "cg")
	ctx := testCtx(b, 10*time.Minute)
	ids := map[string]string{}
	for name, sb := range map[string]*Sandbox{"plain": nil, "sandboxed": {}} {
		s, err := h.SessionCreate(ctx, "cg", SessionCreate{ID: NewSessionID(), Sandbox: sb})
		if err != nil {
			b.Fatal(err)
		}
		defer h.SessionDestroy(context.Background(), "cg", s.ID)
		ids[name] = s.ID
	}
	const pairs = 40
	line := fmt.Sprintf(`cs() { read u _ < /proc/uptime; echo ${u%%.*}${u#*.}; }
		one() { a=$(cs); echo "{\"session\":\"$1\",\"argv\":[\"/bin/true\"]}" | %s run >/dev/null || exit 1; z=$(cs); echo $((z - a)); }
		p=0; s=0; i=0
		while [ $i -lt %d ]; do p=$((p + $(one %s))); s=$((s + $(one %s))); i=$((i+1)); done
		echo "$p $s"`, GuestPath, pairs, ids["plain"], ids["sandboxed"])
	var plain, boxed float64
	for b.Loop() {
		res := sh(b, ctx, h, "cg", line)
		var p, s float64
		if _, err := fmt.Sscan(string(res.Stdout), &p, &s); err != nil || res.ExitCode != 0 {
			b.Fatalf("timed runs = %q (exit %d, %q), %v", res.Stdout, res.ExitCode, res.Stderr, err)
		}
		plain += p * 10 / pairs // centiseconds to ms per run
		boxed += s * 10 / pairs
	}
	n := float64(b.N)
	b.ReportMetric(plain/n, "plain-guest-ms/run")
	b.ReportMetric(boxed/n, "sandboxed-guest-ms/run")
	b.ReportMetric((boxed-plain)/n, "sandbox-ms/run")
}
