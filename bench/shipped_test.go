package main

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestShippedServersAgree starts the bare baseline and vmgate serve as
// shipped and checks that both answer list_vms alike (an empty list with the
// same text), that the gate is on (a tool the policy does not list is
// refused) and that the measurements produce figures.
func TestShippedServersAgree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	vmgate := buildVMGate(t)
	dir := t.TempDir()
	bare, err := startBare(ctx, filepath.Join(dir, "no-lab"))
	if err != nil {
		t.Fatal(err)
	}
	defer bare.stop()
	subs := []subject{
		{name: "shipped", policy: limitedPolicy, fsync: "always"},
		{name: "in process", policy: openPolicy, fsync: "interval", inProcess: true},
	}
	var texts []string
	var structured []string
	for _, c := range []*mcpClient{bare.client} {
		res, err := c.callTool(ctx, "list_vms", "{}")
		if err != nil {
			t.Fatalf("bare list_vms = %v", err)
		}
		texts = append(texts, res.Content[0].Text)
		structured = append(structured, string(res.StructuredContent))
	}
	for _, s := range subs {
		p, state, err := startShipped(ctx, vmgate, dir, s)
		if err != nil {
			t.Fatalf("startShipped(%s) = %v", s.name, err)
		}
		res, err := p.client.callTool(ctx, "list_vms", "{}")
		if err != nil {
			t.Fatalf("%s: list_vms = %v", s.name, err)
		}
		if err := noVMs(res); err != nil {
			t.Errorf("%s: %v", s.name, err)
		}
		texts = append(texts, res.Content[0].Text)
		structured = append(structured, string(res.StructuredContent))
		if _, err := p.client.callTool(ctx, "vm_status", `{"vm":"lab/vm1"}`); err == nil || !strings.Contains(err.Error(), "[POLICY DENIED]") {
			t.Errorf("%s: vm_status = %v; want [POLICY DENIED]", s.name, err)
		}
		if f, b, err := measure(ctx, p.client, bare.client, true); err != nil || f.p50 <= 0 || f.rate <= 0 || b.p50 <= 0 || b.rate <= 0 {
			t.Errorf("%s: measure = %+v, bare %+v, %v; want figures", s.name, f, b, err)
		}
		if err := p.stop(); err != nil {
			t.Errorf("%s: stop = %v", s.name, err)
		}
		// The audit log holds a decision and an outcome per list_vms call
		// (the first one and the measured ones) and the refused vm_status;
		// under the rate-limited policy also the advances that held the
		// calls' reservations (server/advance.go), each with its end.
		log, err := os.ReadFile(filepath.Join(state, "audit.log"))
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		calls := 1 + shippedCalls + parallelCalls
		kinds := map[string]int{}
		for _, k := range []string{"decision", "outcome", "advance", "advance_end"} {
			kinds[k] = strings.Count(string(log), `"kind":"`+k+`"`)
		}
		if kinds["decision"] != calls+1 || kinds["outcome"] != calls {
			t.Errorf("%s: audit log has %d decisions and %d outcomes; want %d and %d", s.name, kinds["decision"], kinds["outcome"], calls+1, calls)
		}
		minAdvances := 0
		if s.policy == limitedPolicy {
			minAdvances = (calls + 31) / 32
		}
		if a, e := kinds["advance"], kinds["advance_end"]; a < minAdvances || e != a || (minAdvances == 0 && a != 0) {
			t.Errorf("%s: audit log has %d advances and %d ends; want as many ends as advances, at least %d", s.name, a, e, minAdvances)
		}
		if n := strings.Count(string(log), "\n"); n != kinds["decision"]+kinds["outcome"]+kinds["advance"]+kinds["advance_end"] {
			t.Errorf("%s: audit log has %d lines; want one per record (%v)", s.name, n, kinds)
		}
	}
	for i := range texts {
		if texts[i] != texts[0] || !reflect.DeepEqual(structured[i], structured[0]) {
			t.Errorf("list_vms answers differ: texts %q, structured %q; want the same", texts, structured)
			break
		}
	}
	if _, err := bare.client.callTool(ctx, "list_vms", `{}`); err != nil {
		t.Errorf("bare list_vms after the others = %v", err)
	}
	if rate, err := callsPerSecond(ctx, bare.client, 20, 4); err != nil || rate <= 0 {
		t.Errorf("callsPerSecond(bare) = %v, %v; want a rate", rate, err)
	}
}
