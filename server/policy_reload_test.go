package server

import (
	"testing"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/server/mcptest"
)

// TestSetPolicy: a reload takes effect on the next call and on tools/list;
// an unknown grant and a nil engine are refused and change nothing.
func TestSetPolicy(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: mcptest.AllowAll})
	if r := f.call(t, "vm_status", `{"vm":"lab/vm1"}`); r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_status under allow-all = %q; want success", r.Text())
	}
	deny, err := policy.Parse("deny.json", []byte(`{"version":"1","default":"deny","tools":{"vm_status":{"action":"deny","reason":"closed for maintenance"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		grant string
		eng   *policy.Engine
		ok    bool
	}{
		{"nobody", deny, false},
		{"local", nil, false},
		{"local", deny, true},
	}
	for _, tt := range tests {
		if err := f.s.SetPolicy(tt.grant, tt.eng); (err == nil) != tt.ok {
			t.Errorf("SetPolicy(%q, %v) = %v; want ok %v", tt.grant, tt.eng != nil, err, tt.ok)
		}
	}
	if r := f.call(t, "vm_status", `{"vm":"lab/vm1"}`); !mcptest.HasTag(r, TagDenied) {
		t.Errorf("vm_status after reload = %q; want %s", r.Text(), TagDenied)
	}
	if got := f.s.policyOf(f.s.grants["other"]); got == deny {
		t.Errorf("SetPolicy(local) changed grant other's policy")
	}
}
