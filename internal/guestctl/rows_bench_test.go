package guestctl

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
)

// Rows 8, 8b, 8c and 8d of make bench, at this package's level: the lab VM
// "cg" with its resident helper on virtio-serial, against the driver's raw
// agent exec of /bin/true (what a plain vm_agent_exec runs). Each
// sub-benchmark runs -rows.warmup rounds that do not count and
// -rows.pairs that do, each round -rows.n of A and of B one after the
// other, and reports each counted round's medians as p<i>-a-ms and
// p<i>-b-ms (as bench/ reads paired rows from a test binary):
//
//	row=8   Run /bin/true in a sandboxed session / raw agent exec of /bin/true
//	row=8b  Run /bin/true as a one-shot sandboxed run / raw agent exec;
//	        pool-hits and pool-misses: the runs (warm-up included) that
//	        found the helper's one-shot pool with a ready session or empty
//	row=8c  SessionCreate (the default sandbox; destroyed untimed) / raw agent exec
//	row=8d  a job's output line: seen through Status (waiting on the cursor)
//	        after it was printed in the guest, p50 of the round (A), against
//	        the 1 s goal (B, a constant); p90-ms and max-ms of all lines
//	row=8e  Run /bin/true through the agent's exec, per command
//	        (`vmgate-guest run`) / through the agent's exec to the resident
//	        helper (`vmgate-guest call run`): the two roads Proxmox and
//	        VirtualBox have, both behind the lab's own qemu-ga here (the
//	        emulators add the same transport to each side)
//
// Back to back by default; -rows.gap pauses after each measurement of
// either side, as an agent does between commands (the one-shot pool of
// row 8b refills in such pauses).
//
//	go test -run '^$' -bench '^BenchmarkLabRows$' -benchtime 1x ./internal/guestctl/
var (
	rowsPairs  = flag.Int("rows.pairs", 6, "BenchmarkLabRows: rounds that count")
	rowsWarmup = flag.Int("rows.warmup", 1, "BenchmarkLabRows: rounds thrown away first")
	rowsN      = flag.Int("rows.n", 15, "BenchmarkLabRows: measurements of each side per round")
	rowsGap    = flag.Duration("rows.gap", 0, "BenchmarkLabRows: pause after each measurement, either side (an agent's pace between commands; 0: back to back)")
)

func BenchmarkLabRows(b *testing.B) {
	h, _ := labHelper(b, "cg")
	ctx := testCtx(b, 30*time.Minute)
	if r := h.CheckRoad(ctx, "cg"); r.Kind != RoadResident {
		b.Fatalf("road of cg = %s; want resident", r)
	}
	raw := func() (time.Duration, error) {
		t0 := time.Now()
		res, err := hypervisor.Run(ctx, h.d, "cg", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("raw /bin/true exited %d", res.ExitCode)
		}
		return time.Since(t0), err
	}
	s := sandboxSession(b, ctx, h, "cg", wire.Sandbox{})
	inSession := func() (time.Duration, error) {
		return timedRun(ctx, h, RunRequest{Session: s.ID, Argv: []string{"/bin/true"}})
	}
	oneShot := func() (time.Duration, error) {
		return timedRun(ctx, h, RunRequest{Sandbox: &Sandbox{}, Argv: []string{"/bin/true"}})
	}
	create := func() (time.Duration, error) {
		t0 := time.Now()
		x, err := h.SessionCreate(ctx, "cg", SessionCreate{ID: NewSessionID(), Sandbox: &Sandbox{}})
		took := time.Since(t0)
		if err == nil {
			_, err = h.SessionDestroy(ctx, "cg", x.ID)
		}
		return took, err
	}
	for _, row := range []struct {
		name string
		a    func() (time.Duration, error)
	}{{"8", inSession}, {"8b", oneShot}, {"8c", create}} {
		b.Run("row="+row.name, func(b *testing.B) {
			before := poolStats(b, ctx, h)
			pairedRounds(b, row.a, raw)
			if row.name == "8b" {
				after := poolStats(b, ctx, h)
				b.ReportMetric(float64(after.Hits-before.Hits), "pool-hits")
				b.ReportMetric(float64(after.Misses-before.Misses), "pool-misses")
				b.ReportMetric(float64(after.waited-before.waited), "thread-waits")
				if n := after.Made - before.Made; n > 0 {
					b.ReportMetric(float64(after.MakeMS-before.MakeMS)/float64(n), "pool-make-ms")
				}
				if n := after.Destroyed - before.Destroyed; n > 0 {
					b.ReportMetric(float64(after.DestroyMS-before.DestroyMS)/float64(n), "pool-destroy-ms")
				}
				if n := after.made - before.made; n > 0 {
					b.ReportMetric(float64(after.buildMS-before.buildMS)/float64(n), "thread-build-ms")
				}
				// Every one-shot session, pooled or made for its run, is
				// made once and destroyed once.
				if n := after.Made - before.Made + after.Misses - before.Misses; n > 0 {
					for name, us := range after.steps {
						b.Logf("one-shot session, mean of %d: %s %.2f ms", n, name, float64(us-before.steps[name])/float64(n)/1000)
					}
				}
			}
		})
	}
	b.Run("row=8e", func(b *testing.B) { pairedRounds(b, agentRoad(ctx, h, false), agentRoad(ctx, h, true)) })
	b.Run("row=8d", func(b *testing.B) { outputLatency(b, ctx, h, s.ID) })
}

// poolStats is the one-shot pool's and the session threads' counts in
// cg's resident helper, from
// its hello (asked through the agent's exec: `vmgate-guest call hello`).
func poolStats(b *testing.B, ctx context.Context, h *Helper) poolCounts {
	res, err := hypervisor.Run(ctx, h.d, "cg", hypervisor.ExecRequest{Argv: []string{GuestPath, "call", "hello"}})
	if err != nil {
		b.Fatal(err)
	}
	var rep struct {
		Result wire.Hello `json:"result"`
	}
	if err := json.Unmarshal(res.Stdout, &rep); err != nil || rep.Result.Pool == nil || rep.Result.Threads == nil {
		b.Fatalf("hello through the agent's exec = %q, %v; want the resident helper's, with its pool and threads", res.Stdout, err)
	}
	th := rep.Result.Threads
	return poolCounts{*rep.Result.Pool, th.Waited, th.Made, th.BuildMS, rep.Result.StepsUS}
}

// poolCounts is the pool's counts, how many runs waited for a thread
// made ahead (a pooled session's, mostly), and the threads made and the
// time they took.
type poolCounts struct {
	wire.PoolStats
	waited, made, buildMS int64
	steps                 map[string]int64 // µs per create and destroy step, in all
}

// timedRun is how long Run of req took on cg; a failed run is an error.
func timedRun(ctx context.Context, h *Helper, req RunRequest) (time.Duration, error) {
	t0 := time.Now()
	res, err := h.Run(ctx, "cg", req)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("run exited %d: %s", res.ExitCode, res.Stderr)
	}
	return time.Since(t0), err
}

// pairedRounds measures a against base, one of each in turn (which one
// goes first alternating), and reports each counted round's medians.
func pairedRounds(b *testing.B, a, base func() (time.Duration, error)) {
	type side struct {
		f  func() (time.Duration, error)
		ms []float64
	}
	for range b.N {
		for i := range *rowsWarmup + *rowsPairs {
			sa, sb := &side{f: a}, &side{f: base}
			for k := range *rowsN {
				order := []*side{sa, sb}
				if k%2 == 1 {
					order = []*side{sb, sa}
				}
				for _, sd := range order {
					d, err := sd.f()
					if err != nil {
						b.Fatal(err)
					}
					sd.ms = append(sd.ms, float64(d.Microseconds())/1000)
					time.Sleep(*rowsGap)
				}
			}
			if i >= *rowsWarmup {
				p := i - *rowsWarmup + 1
				b.ReportMetric(median(sa.ms), fmt.Sprintf("p%d-a-ms", p))
				b.ReportMetric(median(sb.ms), fmt.Sprintf("p%d-b-ms", p))
			}
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// guestOffset is the guest's uptime minus the host's clock (seconds), from
// the agent round trip that bracketed a reading most tightly.
func guestOffset(b *testing.B, ctx context.Context, h *Helper) float64 {
	best, off := time.Duration(math.MaxInt64), 0.0
	for range 7 {
		t1 := time.Now()
		res, err := hypervisor.Run(ctx, h.d, "cg", hypervisor.ExecRequest{Argv: []string{"cat", "/proc/uptime"}})
		t2 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		up, err := strconv.ParseFloat(strings.Fields(string(res.Stdout))[0], 64)
		if err != nil {
			b.Fatal(err)
		}
		if rtt := t2.Sub(t1); rtt < best {
			mid := t1.Add(rtt / 2)
			best, off = rtt, up-float64(mid.UnixNano())/1e9
		}
	}
	return off
}

// outputLatency: a job in the session prints its uptime every 300 ms; the
// host follows it with Status from the cursor, waiting, and takes for each
// line the time it was seen minus the time it was printed (the guest's
// uptime on the host's clock: /proc/uptime has 10 ms steps).
func outputLatency(b *testing.B, ctx context.Context, h *Helper, session string) {
	const lines = 10
	var all []float64
	for range b.N {
		for i := range *rowsWarmup + *rowsPairs {
			off := guestOffset(b, ctx, h)
			st, err := h.Start(ctx, "cg", RunRequest{Session: session, TimeoutMS: 60000,
				Shell: fmt.Sprintf(`i=0; while [ $i -lt %d ]; do sleep 0.3; cat /proc/uptime; i=$((i+1)); done`, lines)})
			if err != nil {
				b.Fatal(err)
			}
			var lat []float64
			cur, partial := Cursor{}, ""
			for js := (JobStatus{State: wire.JobRunning}); js.State == wire.JobRunning; {
				if js, err = h.Status(ctx, "cg", StatusRequest{ID: st.ID, Since: cur, Wait: 10 * time.Second}); err != nil {
					b.Fatal(err)
				}
				seen := float64(time.Now().UnixNano()) / 1e9
				cur.Stdout = js.Stdout.Next
				text := partial + string(js.Stdout.Data)
				full := strings.Split(text, "\n")
				partial = full[len(full)-1]
				for _, line := range full[:len(full)-1] {
					up, err := strconv.ParseFloat(strings.Fields(line)[0], 64)
					if err != nil {
						b.Fatalf("line %q: %v", line, err)
					}
					lat = append(lat, (seen-(up-off))*1000)
				}
			}
			if len(lat) != lines {
				b.Fatalf("saw %d lines; want %d", len(lat), lines)
			}
			if i >= *rowsWarmup {
				p := i - *rowsWarmup + 1
				b.ReportMetric(median(lat), fmt.Sprintf("p%d-a-ms", p))
				b.ReportMetric(1000, fmt.Sprintf("p%d-b-ms", p))
				all = append(all, lat...)
			}
		}
	}
	slices.Sort(all)
	b.ReportMetric(all[len(all)*9/10], "p90-ms")
	b.ReportMetric(all[len(all)-1], "max-ms")
}

// agentRoad times Run of /bin/true on cg through the agent's exec: per
// command (`vmgate-guest run`), or with call to the resident helper
// (`vmgate-guest call run`).
func agentRoad(ctx context.Context, h *Helper, call bool) func() (time.Duration, error) {
	req := []byte(`{"argv":["/bin/true"]}`)
	return func() (time.Duration, error) {
		t0 := time.Now()
		var res hypervisor.ExecResult
		var err error
		if call {
			res, err = h.viaCall(ctx, "cg", []string{"run"}, req, time.Minute, 1<<20)
		} else {
			res, err = h.perCommand(ctx, "cg", "run", []string{"run"}, req, time.Minute, 1<<20)
		}
		took := time.Since(t0)
		if err == nil {
			var out RunResult
			if err = decodeReply("run", res, res.Stdout, &out); err == nil && out.ExitCode != 0 {
				err = fmt.Errorf("/bin/true exited %d", out.ExitCode)
			}
		}
		return took, err
	}
}
