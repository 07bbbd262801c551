package server

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
)

// A driver that blocks past the call's deadline (a paused VM) gets its
// context cut at the deadline, and the client gets a [TIMED OUT] tool
// result over both transports, not an empty reply.
func TestCallPastItsDeadlineAnswersTimedOut(t *testing.T) {
	const callDeadline = 300 * time.Millisecond

	var sawDeadline atomic.Bool
	drv := hypervisortest.Counting(new(atomic.Int64))
	drv.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
		_, ok := ctx.Deadline()
		sawDeadline.Store(ok)
		<-ctx.Done() // a paused VM never answers
		return hypervisor.Status{}, fmt.Errorf("fake: status: %w", ctx.Err())
	}
	f := newFixture(t, fixtureOpts{driver: drv, timeouts: catalog.Timeouts{Call: callDeadline}})

	check := func(transport string, r mcptest.Reply, id string, took time.Duration) {
		t.Helper()
		if string(r.ID) != id || !mcptest.HasTag(r, TagTimedOut) {
			t.Errorf("%s: vm_status of a hung VM = id %s, %q (error %+v); want id %s and %s", transport, r.ID, r.Text(), r.Error, id, TagTimedOut)
		}
		if took < callDeadline || took > callDeadline+5*time.Second {
			t.Errorf("%s: the reply came after %v; want just after the %v deadline", transport, took, callDeadline)
		}
		if !sawDeadline.Load() {
			t.Errorf("%s: the driver's context had no deadline", transport)
		}
	}

	ts := httptest.NewServer(httpHandler(f.s))
	defer ts.Close()
	_, sid := mcptest.Post(t, ts.URL+"/mcp", "local-token", "", mcptest.InitMsg)
	start := time.Now()
	r, _ := mcptest.Post(t, ts.URL+"/mcp", "local-token", sid, mcptest.ToolCall(7, "vm_status", `{"vm":"lab/vm1"}`))
	check("http", r, "7", time.Since(start))

	sawDeadline.Store(false)
	start = time.Now()
	r = f.send(t, mcptest.ToolCall(8, "vm_status", `{"vm":"lab/vm1"}`))
	check("stdio", r, "8", time.Since(start))

	var outcomes []string
	for _, rec := range f.rec.Records() {
		if rec.Tool == "vm_status" && rec.Outcome != "" {
			outcomes = append(outcomes, rec.Outcome)
		}
	}
	if got := strings.Join(outcomes, ","); got != "timed_out,timed_out" {
		t.Errorf("outcomes of the two calls = %q; want timed_out,timed_out", got)
	}
}
