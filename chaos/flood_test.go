package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// FloodEnv overrides how long TestInitializeFlood floods (`make chaos`
// sets 60s): a Go duration.
const FloodEnv = "VMGATE_CHAOS_FLOOD"

// The flood's figures. The server keeps at most 64 sessions per grant and
// 1024 in all (the defaults); a session costs about 10 KiB of heap
// (TestHTTPSessionMemory), so the sessions themselves can hold about 10
// MiB. floodRSSBound is what the server's resident memory may grow by
// over its size before the flood, whatever the flood's length: room for
// the sessions, the Go heap's headroom and the buffers of the flood's
// connections. (Before the caps, 15 s of this flood took the server from
// 55 MB to 679 MB.)
const (
	floodSessionsPerGrant = 64
	floodBudget           = 1200 // the default request budget per grant and minute
	floodRSSBound         = 64 << 20
	floodWorkers          = 8 // connections of the flooding grant
	burstWorkers          = 2 // connections of the grant on the default budget
)

const floodPolicy = `{"version":"1","default":"deny","tools":{"list_vms":{}}}`

func floodDuration() time.Duration {
	if v := os.Getenv(FloodEnv); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
	}
	return currentMode().flood
}

// rssBytes reads the resident set size of pid.
func rssBytes(pid int) (int64, error) {
	v, err := procStatus(pid, "VmRSS")
	if err != nil {
		return 0, err
	}
	kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(v, "kB")), 10, 64)
	return kb << 10, err
}

// samplePeakRSS samples the resident size of pid every d until ctx ends;
// the function it returns waits for that and returns the highest size
// seen (at least from).
func samplePeakRSS(ctx context.Context, pid int, from int64, d time.Duration) func() int64 {
	peak := from
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			if n, err := rssBytes(pid); err == nil && n > peak {
				peak = n
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() int64 {
		<-done
		return peak
	}
}

// floodTally is what one grant's flood saw.
type floodTally struct {
	mu       sync.Mutex
	sessions []string // session ids, in the order their replies arrived
	admitted atomic.Int64
	limited  atomic.Int64 // 429 with Retry-After
	other    atomic.Int64
	example  atomic.Value // one unexpected reply
}

// floodInitialize sends initialize as fast as it can on workers
// connections until ctx ends.
func floodInitialize(ctx context.Context, url, token string, workers int, tl *floodTally) {
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + protocolVersion + `","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := hc.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						tl.other.Add(1)
						tl.example.Store(err.Error())
					}
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch sid := resp.Header.Get("Mcp-Session-Id"); {
				case resp.StatusCode == http.StatusOK && sid != "":
					tl.admitted.Add(1)
					tl.mu.Lock()
					tl.sessions = append(tl.sessions, sid)
					tl.mu.Unlock()
				case resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "" && bytes.Contains(b, []byte("[RATE LIMITED]")):
					tl.limited.Add(1)
				default:
					tl.other.Add(1)
					tl.example.Store(fmt.Sprintf("%d %.200s", resp.StatusCode, b))
				}
			}
		})
	}
	wg.Wait()
}

// TestInitializeFlood floods a server with initialize from one grant whose
// budget does not stop it (so only the session caps bound it) and from one
// on the default budget, while a third grant holds a session. The server's
// resident memory stays within floodRSSBound of what it was, every session
// beyond the cap is evicted (404, initialize again), the grant on the
// default budget is refused (429, Retry-After) beyond its budget, and the
// third grant's session and calls are untouched.
func TestInitializeFlood(t *testing.T) {
	labtest.RequireQEMU(t)
	binary(t)
	v1 := labtest.VM(t, vm1)
	floodTok, burstTok, victimTok := newToken(), newToken(), newToken()
	s := writeConfig(t, configOpts{
		grants: []grantSpec{
			{name: "flood", token: floodTok, policy: floodPolicy, requestsPerMinute: 1_000_000},
			{name: "burst", token: burstTok, policy: floodPolicy},
			{name: "victim", token: victimTok, policy: floodPolicy},
		},
		vms:     []*lab.VM{v1},
		metrics: true,
		http:    "{}", // the defaults: 1200 requests a minute per grant, 64 sessions per grant, 1024 in all
	})
	p := startServe(t, s.cfg)
	ctx := context.Background()
	victim := newHTTPClient(p.url, victimTok)
	if err := victim.initialize(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := victim.call(ctx, "list_vms", map[string]any{}); err != nil || r.outcome() != "ok" {
		t.Fatalf("victim's list_vms before the flood = %v, %v", r.outcome(), err)
	}
	before, err := rssBytes(p.pid())
	if err != nil {
		t.Fatal(err)
	}

	d := floodDuration()
	fctx, stop := context.WithTimeout(ctx, d)
	defer stop()
	peakRSS := samplePeakRSS(fctx, p.pid(), before, 250*time.Millisecond) // four times a second
	var flood, burst floodTally
	var wg sync.WaitGroup
	wg.Go(func() { floodInitialize(fctx, p.url, floodTok, floodWorkers, &flood) })
	wg.Go(func() { floodInitialize(fctx, p.url, burstTok, burstWorkers, &burst) })
	wg.Wait()
	peak := peakRSS()
	after, err := rssBytes(p.pid())
	if err != nil {
		t.Fatal(err)
	}
	heap, herr := func() (float64, error) {
		u, err := p.metricsURL()
		if err != nil {
			return 0, err
		}
		return sample(ctx, u, "go_memstats_alloc_bytes")
	}()
	mib := func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
	t.Logf("flood of %v: %d sessions opened by %q (%d other replies: %v), %d admitted and %d refused for %q; RSS %s before, peak %s, %s after; live heap %.1f MiB (%v)",
		d, flood.admitted.Load(), "flood", flood.other.Load(), flood.example.Load(), burst.admitted.Load(), burst.limited.Load(), "burst",
		mib(before), mib(peak), mib(after), heap/(1<<20), herr)

	if got := peak - before; got > floodRSSBound {
		t.Errorf("the server's RSS grew by %s during the flood (%s to %s); want at most %s", mib(got), mib(before), mib(peak), mib(floodRSSBound))
	}
	if flood.admitted.Load() < 10*floodSessionsPerGrant {
		t.Errorf("the flood opened only %d sessions; want far more than the cap of %d for the test to mean anything", flood.admitted.Load(), floodSessionsPerGrant)
	}
	if n := flood.other.Load() + burst.other.Load(); n > 0 {
		t.Errorf("%d replies were neither a session nor a 429 with Retry-After, e.g. %v, %v", n, flood.example.Load(), burst.example.Load())
	}
	// The budget: never more than floodBudget in any minute.
	if max := int64(floodBudget) * (1 + int64(d/time.Minute)); burst.admitted.Load() > max || burst.limited.Load() == 0 {
		t.Errorf("grant on the default budget: %d admitted, %d refused in %v; want at most %d admitted and the rest refused",
			burst.admitted.Load(), burst.limited.Load(), d, max)
	}

	// Every session beyond the cap is gone: of the flood's sessions, at
	// most the cap answer, and every one older than the last cap (plus
	// the replies in flight) is unknown.
	prober := newHTTPClient(p.url, floodTok)
	ids := flood.sessions
	recent := floodSessionsPerGrant + 2*floodWorkers
	probe := append([]string(nil), ids[max(0, len(ids)-recent):]...)
	older := ids[:max(0, len(ids)-recent)]
	for range min(300, len(older)) {
		probe = append(probe, older[rand.IntN(len(older))])
	}
	live, gone, bad := 0, 0, 0
	for i, sid := range probe {
		prober.session = sid
		r, err := prober.post(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`), nil)
		switch {
		case err == nil && r.Status == http.StatusOK:
			live++
			if i >= recent {
				t.Errorf("session %s, older than the last %d opened, still answers", sid, recent)
			}
		case err == nil && r.Status == http.StatusNotFound && strings.Contains(string(r.Body), "initialize again"):
			gone++
		default:
			bad++
			t.Errorf("ping in session %s = %v, %d %.200s; want 200 or 404", sid, err, r.Status, r.Body)
		}
	}
	if live > floodSessionsPerGrant || live == 0 {
		t.Errorf("%d of the flood's sessions answer; want between 1 and the cap of %d", live, floodSessionsPerGrant)
	}
	// The other grant's session and calls are untouched.
	if r, err := victim.call(ctx, "list_vms", map[string]any{}); err != nil || r.outcome() != "ok" {
		t.Errorf("victim's list_vms in its session after the flood = %v, %v; want ok", r.outcome(), err)
	}
	if err := p.stop(); err != nil {
		t.Error(err)
	}
	report.add("initialize flood", fmt.Sprintf("%v, %d+%d connections, caps 64/grant, 1024 in all, budget 1200/min", d, floodWorkers, burstWorkers),
		fmt.Sprintf("%d sessions opened, %d still live (%d probed gone); %d admitted, %d refused on the budget; RSS %s → peak %s (bound +%s)",
			flood.admitted.Load(), live, gone, burst.admitted.Load(), burst.limited.Load(), mib(before), mib(peak), mib(floodRSSBound)))
}
