package policy

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// create wraps a vm_create body into a one-line document.
func create(body string) string {
	return `{"version":"1","default":"deny","tools":{"vm_create":` + body + `}}`
}

func TestQuotaParseErrors(t *testing.T) {
	quota := func(fields string) string { return create(`{"limits":[{` + fields + `}]}`) }
	cases := []struct {
		name, doc, at, want string
	}{
		{"quota on another tool", wrap(`{"limits":[{"counter":"q","kind":"quota","max":1,"scope":"grant"}]}`), `"quota"`,
			`tools.t.limits[0].kind: a quota holds a unit while the VM a call created lives; only vm_create creates VMs`},
		{"quota in all_tools", `{"version":"1","default":"deny","all_tools":{"limits":[{"counter":"q","kind":"quota","max":1,"scope":"grant"}]}}`, `"quota"`,
			`all_tools.limits[0].kind: a quota holds a unit`},
		{"unknown kind", quota(`"counter":"q","kind":"bucket","max":1,"scope":"grant"`), `"bucket"`, `tools.vm_create.limits[0].kind: unknown kind "bucket" (want rate or quota)`},
		{"kind not a string", quota(`"counter":"q","kind":1,"max":1,"scope":"grant"`), `1,`, `tools.vm_create.limits[0].kind: want a string, got number`},
		{"quota with window", quota(`"counter":"q","kind":"quota","window":"hour","max":1,"scope":"grant"`), `"hour"`, `tools.vm_create.limits[0].window: a quota has no window`},
		{"quota scoped by vm", quota(`"counter":"q","kind":"quota","max":1,"scope":"vm"`), `"vm"`, `tools.vm_create.limits[0].scope: a quota's scope is grant, template, global or grant and template`},
		{"quota scoped by session", quota(`"counter":"q","kind":"quota","max":1,"scope":["grant","session"]`), `["grant"`, `tools.vm_create.limits[0].scope: a quota's scope is grant`},
		{"template scope on a rate", quota(`"counter":"q","window":"hour","max":1,"scope":"template"`), `"template"`, `tools.vm_create.limits[0].scope: scope "template" is for quota limits`},
		{"weight on a rate", quota(`"counter":"q","window":"hour","max":1,"scope":"grant","weight":"args.memory_mb"`), `"args.memory_mb"`, `tools.vm_create.limits[0].weight: weight is for quota limits`},
		{"weight not args", quota(`"counter":"q","kind":"quota","max":1,"scope":"grant","weight":"vm"`), `"vm"`, `tools.vm_create.limits[0].weight: weight "vm": want an argument path args.<name>`},
		{"weight empty name", quota(`"counter":"q","kind":"quota","max":1,"scope":"grant","weight":"args..x"`), `"args..x"`, `tools.vm_create.limits[0].weight: weight "args..x" has an empty name`},
		{"weight a number", quota(`"counter":"q","kind":"quota","max":1,"scope":"grant","weight":5`), `5}`, `tools.vm_create.limits[0].weight: want a string, got number`},
		{"quota max 0", quota(`"counter":"q","kind":"quota","max":0,"scope":"grant"`), `0,`, `tools.vm_create.limits[0].max: max 0 is out of range`},
		{"quota without scope", quota(`"counter":"q","kind":"quota","max":1`), `{"counter"`, `tools.vm_create.limits[0].scope: required field is missing`},
		{"counter both kinds", create(`{"limits":[{"counter":"c","window":"hour","max":1,"scope":"grant"},{"counter":"c","kind":"quota","max":1,"scope":"grant"}]}`),
			`{"counter":"c","kind"`, `tools.vm_create.limits[1]: counter "c" is defined at /tools/vm_create/limits/0 as a rate limit; a counter is either a rate limit or a quota`},
		{"quota redefined", create(`{"limits":[{"counter":"c","kind":"quota","max":1,"scope":"grant"},{"counter":"c","kind":"quota","max":1,"scope":"global","weight":"args.memory_mb"}]}`),
			`{"counter":"c","kind":"quota","max":1,"scope":"global"`, `tools.vm_create.limits[1]: quota "c" is defined at /tools/vm_create/limits/0 with max 1 and weight ""`},
		{"lease on another tool", wrap(`{"lease":{"max_ttl":"1h"}}`), `{"max_ttl"`, `tools.t.lease: a lease block belongs on vm_create, not on t`},
		{"lease unknown field", create(`{"lease":{"ttl":"1h"}}`), `"ttl"`, `tools.vm_create.lease.ttl: unknown field "ttl" (known: default_ttl, max_ttl)`},
		{"lease bad duration", create(`{"lease":{"max_ttl":"forever"}}`), `"forever"`, `tools.vm_create.lease.max_ttl: bad duration "forever"`},
		{"lease too long", create(`{"lease":{"max_ttl":"200h"}}`), `"200h"`, `tools.vm_create.lease.max_ttl: max_ttl 200h0m0s is out of range (want 1s to 168h0m0s)`},
		{"lease zero", create(`{"lease":{"default_ttl":"0s"}}`), `"0s"`, `tools.vm_create.lease.default_ttl: default_ttl 0s is out of range`},
		{"default over max", create(`{"lease":{"default_ttl":"2h","max_ttl":"1h"}}`), `{"default_ttl"`, `tools.vm_create.lease: default_ttl 2h0m0s is longer than max_ttl 1h0m0s`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("policy.json", []byte(tc.doc))
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("Parse(%s) error = %v; want Errors", tc.doc, err)
			}
			want := "policy.json:" + position(t, tc.doc, tc.at) + ": " + tc.want
			if got := errs[0].Error(); !strings.HasPrefix(got, want) {
				t.Errorf("Parse(%s) first error = %q; want prefix %q", tc.doc, got, want)
			}
		})
	}
}

const quotaDoc = `{"version":"1","default":"deny","all_tools":{"limits":[{"counter":"all","window":"minute","max":60,"scope":"grant"}]},
 "tools":{"vm_create":{
  "limits":[
   {"counter":"create_rate","window":"hour","max":10,"scope":"grant"},
   {"counter":"vms","kind":"quota","max":2,"scope":"grant"},
   {"counter":"vm_memory","kind":"quota","max":1024,"scope":"grant","weight":"args.memory_mb"},
   {"counter":"per_template","kind":"quota","max":1,"scope":["grant","template"]},
   {"counter":"everyone","kind":"quota","max":8,"scope":"global"},
   {"counter":"vms","kind":"quota","max":2,"scope":"grant"}],
  "lease":{"default_ttl":"10m","max_ttl":"30m"}},
 "vm_delete":{}}}`

func TestQuotaDecide(t *testing.T) {
	e := mustParse(t, quotaDoc)
	args := map[string]any{"template": "small", "memory_mb": int64(256), "cpus": int64(1)}
	d := e.Decide(Call{Grant: "alice", Tool: "vm_create", Args: args})
	if d.Verdict != Allow {
		t.Fatalf("Decide(vm_create) = %v (%s); want allow", d.Verdict, d.Reason)
	}
	wantQ := []Quota{
		{Key: "vms|grant=5:alice", Name: "vms", Max: 2, Weight: 1, Rule: "/tools/vm_create/limits/1"},
		{Key: "vm_memory|grant=5:alice", Name: "vm_memory", Max: 1024, Weight: 256, Rule: "/tools/vm_create/limits/2"},
		{Key: "per_template|grant=5:alice|template=5:small", Name: "per_template", Max: 1, Weight: 1, Rule: "/tools/vm_create/limits/3"},
		{Key: "everyone", Name: "everyone", Max: 8, Weight: 1, Rule: "/tools/vm_create/limits/4"},
	}
	if !reflect.DeepEqual(d.Quotas, wantQ) {
		t.Errorf("Decide(vm_create).Quotas = %+v; want %+v", d.Quotas, wantQ)
	}
	var keys []string
	for _, c := range d.Counters {
		keys = append(keys, c.Key)
	}
	if want := []string{"create_rate|grant=5:alice", "all|grant=5:alice"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("Decide(vm_create) counters = %v; want %v (quotas are not rate counters)", keys, want)
	}
	if want := (LeaseSpec{Default: 10 * time.Minute, Max: 30 * time.Minute, Rule: "/tools/vm_create/lease"}); d.Lease == nil || *d.Lease != want {
		t.Errorf("Decide(vm_create).Lease = %+v; want %+v", d.Lease, want)
	}
	if d := e.Decide(Call{Grant: "alice", Tool: "vm_delete", VM: "lab/x"}); d.Lease != nil || d.Quotas != nil {
		t.Errorf("Decide(vm_delete) = %+v; want no lease and no quotas", d)
	}
}

func TestQuotaWeight(t *testing.T) {
	e := mustParse(t, quotaDoc)
	cases := []struct {
		v    any
		want int64 // -1: denied
	}{
		{int64(512), 512},
		{float64(128), 128},
		{json.Number("64"), 64},
		{json.Number("1e3"), 1000},
		{int64(0), 0},
		{float64(2.5), -1},
		{int64(-1), -1},
		{float64(2e9), -1},
		{json.Number("x"), -1},
		{"256", -1},
		{nil, -1},
		{true, -1},
	}
	for _, tc := range cases {
		d := e.Decide(Call{Grant: "g", Tool: "vm_create", Args: map[string]any{"template": "t", "memory_mb": tc.v}})
		if tc.want < 0 {
			if d.Verdict != Deny || d.Rule != "/tools/vm_create/limits/2" || !strings.Contains(d.Reason, "quota vm_memory weighs args.memory_mb") {
				t.Errorf("Decide(memory_mb %#v) = %v %s %q; want deny by the weight", tc.v, d.Verdict, d.Rule, d.Reason)
			}
			continue
		}
		if d.Verdict != Allow || len(d.Quotas) < 2 || d.Quotas[1].Weight != tc.want {
			t.Errorf("Decide(memory_mb %#v) = %v %+v; want allow with weight %d", tc.v, d.Verdict, d.Quotas, tc.want)
		}
	}
	// A missing weight argument denies: a quota that cannot be weighed
	// would otherwise hold nothing.
	if d := e.Decide(Call{Grant: "g", Tool: "vm_create", Args: map[string]any{"template": "t"}}); d.Verdict != Deny {
		t.Errorf("Decide(no memory_mb) = %v; want deny", d.Verdict)
	}
}

func TestQuotaKeysDistinct(t *testing.T) {
	e := mustParse(t, quotaDoc)
	seen := map[string]string{}
	for _, c := range []struct{ grant, template string }{{"a", "b|template=1:c"}, {"a|template=1:b", "c"}, {"ab", "c"}, {"a", "bc"}} {
		d := e.Decide(Call{Grant: c.grant, Tool: "vm_create", Args: map[string]any{"template": c.template, "memory_mb": int64(1)}})
		k := d.Quotas[2].Key
		if other, dup := seen[k]; dup {
			t.Errorf("grant %q template %q and %s share quota key %q", c.grant, c.template, other, k)
		}
		seen[k] = c.grant + "/" + c.template
	}
}

func TestLeaseDefaults(t *testing.T) {
	cases := []struct {
		doc  string
		want LeaseSpec
	}{
		{create(`{}`), DefaultLease()},
		{`{"version":"1","default":"allow"}`, DefaultLease()},
		{create(`{"lease":{}}`), LeaseSpec{Default: DefaultLease().Default, Max: DefaultLease().Max, Rule: "/tools/vm_create/lease"}},
		{create(`{"lease":{"max_ttl":"5m"}}`), LeaseSpec{Default: 5 * time.Minute, Max: 5 * time.Minute, Rule: "/tools/vm_create/lease"}},
		{create(`{"action":"approve","lease":{"max_ttl":"2h","default_ttl":"1h"}}`), LeaseSpec{Default: time.Hour, Max: 2 * time.Hour, Rule: "/tools/vm_create/lease"}},
	}
	for _, tc := range cases {
		d := mustParse(t, tc.doc).Decide(Call{Grant: "g", Tool: "vm_create", Args: map[string]any{"template": "t"}})
		if d.Lease == nil || *d.Lease != tc.want {
			t.Errorf("Decide(vm_create) under %s: Lease = %+v; want %+v", tc.doc, d.Lease, tc.want)
		}
	}
	l := LeaseSpec{Default: 10 * time.Minute, Max: 30 * time.Minute}
	for _, tc := range []struct {
		in, want time.Duration
		clamped  bool
	}{{0, 10 * time.Minute, false}, {-time.Second, 10 * time.Minute, false}, {time.Minute, time.Minute, false}, {30 * time.Minute, 30 * time.Minute, false}, {31 * time.Minute, 30 * time.Minute, true}} {
		if got, clamped := l.TTL(tc.in); got != tc.want || clamped != tc.clamped {
			t.Errorf("TTL(%v) = %v, %v; want %v, %v", tc.in, got, clamped, tc.want, tc.clamped)
		}
	}
}

func TestOverQuota(t *testing.T) {
	d := Decision{Verdict: Allow, Rule: "/tools/vm_create"}.OverQuota(Quota{Name: "vms", Rule: "/tools/vm_create/limits/1"}, time.Minute)
	if d.Verdict != RateLimited || d.Rule != "/tools/vm_create/limits/1" || d.Reason != "quota vms is full" || d.RetryAfter != time.Minute {
		t.Errorf("OverQuota = %+v; want rate_limited by the quota's rule", d)
	}
}

func TestQuotaExplain(t *testing.T) {
	_, steps := mustParse(t, quotaDoc).Explain(Call{Grant: "g", Tool: "vm_create", Args: map[string]any{"template": "t", "memory_mb": int64(300)}})
	last := steps[len(steps)-1]
	if last.Name != "limits" || !strings.Contains(last.Detail, "vm_memory|grant=1:g (quota, 300 of 1024)") {
		t.Errorf("Explain last step = %+v; want the quotas listed with their weights", last)
	}
}
