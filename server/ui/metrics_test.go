package ui_test

import (
	"net/http"
	"strings"
	"testing"
)

// sample returns the value of one series in a /metrics scrape.
func sample(t *testing.T, f *fixture, series string) string {
	t.Helper()
	_, body := get(t, client(t), f.url+"/metrics", nil)
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

func TestMetricsScrapeChangesAfterCalls(t *testing.T) {
	f := newFixture(t)
	resp, _ := get(t, client(t), f.url+"/metrics", nil)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics = %d %s; want 200 text/plain", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	series := []string{
		`vmgate_calls_total{decision="allow",grant="agent",tool="list_vms"}`,
		`vmgate_calls_total{decision="approval_required",grant="agent",tool="vm_power"}`,
		`vmgate_calls_total{decision="invalid",grant="agent",tool="other"}`,
		`vmgate_call_duration_seconds_count{tool="list_vms"}`,
		`vmgate_decision_commit_seconds_count`,
		`vmgate_pending_approvals`,
	}
	before := map[string]string{}
	for _, s := range series {
		before[s] = sample(t, f, s)
	}
	for range 2 {
		if res := f.call(t, "list_vms", `{}`); res.IsError {
			t.Fatalf("list_vms = %+v", res)
		}
	}
	f.park(t, `{"vm":"lab/vm1","action":"stop"}`)
	if res := f.call(t, "no_such_tool", `{}`); !res.IsError {
		t.Fatalf("no_such_tool = %+v; want an error", res)
	}
	want := map[string][2]string{
		series[0]: {"0", "2"},
		series[1]: {"0", "1"},
		series[2]: {"0", "1"},
		series[3]: {"0", "2"},
		series[4]: {"0", "2"},
		series[5]: {"0", "1"},
	}
	for _, s := range series {
		after := sample(t, f, s)
		if before[s] != want[s][0] || after != want[s][1] {
			t.Errorf("%s = %q before, %q after the calls; want %q, %q", s, before[s], after, want[s][0], want[s][1])
		}
	}
	if got := sample(t, f, `vmgate_vms{backend="lab",state="running"}`); got != "1" {
		t.Errorf(`vmgate_vms{backend="lab",state="running"} = %q; want 1`, got)
	}
}
