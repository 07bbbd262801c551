package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/mcptest"
)

// TestDeniedRetrySaysWhen: the identical retry of a call an operator
// denied says it was denied, when it may be asked again and how; once that
// time has passed it asks an operator again. A denial without a reason is
// recorded without a bare "by:".
func TestDeniedRetrySaysWhen(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: `{"version":"1","default":"deny","tools":{"vm_power":{"action":"approve","approval":{"ttl":"15m"}}}}`})
	args := `{"vm":"lab/vm1","action":"shutdown"}`
	id, _ := f.call(t, "vm_power", args).Result.StructuredContent["approval_id"].(string)
	if id == "" {
		t.Fatal("the first call parked no approval")
	}
	f.advance(time.Minute)
	ap, err := f.s.Approvals().Deny(context.Background(), id, "tester", "")
	if err != nil {
		t.Fatalf("Deny(%s) = %v", id, err)
	}
	f.advance(time.Minute)
	r := f.call(t, "vm_power", args)
	until := ap.Expires.UTC().Format(time.RFC3339)
	left := int64(ap.Expires.Sub(time.Unix(0, f.now.Load())).Seconds())
	if !mcptest.HasTag(r, TagDenied) {
		t.Fatalf("retry after the denial = %q; want %s", r.Text(), TagDenied)
	}
	for _, want := range []string{id, "tester denied this call", "no reason given", until, "asks an operator again", "other arguments"} {
		if !strings.Contains(r.Text(), want) {
			t.Errorf("retry after the denial = %q; want it to say %q", r.Text(), want)
		}
	}
	if got := r.Result.StructuredContent["retry_after_s"]; got != float64(left) {
		t.Errorf("retry after the denial: retry_after_s = %v; want %d", got, left)
	}
	var decided []string
	_ = f.rec.Each(func(rec audit.Record) error {
		if rec.Decision == "approval_denied" {
			decided = append(decided, rec.Reason)
		}
		return nil
	})
	if len(decided) != 1 || strings.HasSuffix(decided[0], ":") || !strings.Contains(decided[0], "tester") {
		t.Errorf("denial records' reasons = %q; want one naming tester, without a bare \"tester:\"", decided)
	}
	f.advance(time.Duration(left+1) * time.Second)
	again := f.call(t, "vm_power", args)
	if !mcptest.HasTag(again, TagApproval) || again.Result.StructuredContent["approval_id"] == id {
		t.Errorf("retry after the denial expired = %q; want a new approval", again.Text())
	}
}
