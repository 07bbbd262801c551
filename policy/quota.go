package policy

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"time"
)

// Quotas and leases: what vm_create may make and for how long.
//
// A rate limit counts calls in a window; a quota counts things that live
// on. A limit with "kind": "quota" holds a unit (or Weight units) for as
// long as the VM a vm_create call created lives: the server acquires it
// with the VM's lease before the VM is made and releases it when the VM is
// deleted (vm_delete, the lease running out, or a creation that failed).
//
//	{"counter": "vms", "kind": "quota", "max": 2, "scope": "grant"}
//	{"counter": "vm_memory", "kind": "quota", "max": 2048, "scope": "grant", "weight": "args.memory_mb"}
//	{"counter": "lab_vms", "kind": "quota", "max": 4, "scope": ["global"]}
//	{"counter": "per_template", "kind": "quota", "max": 1, "scope": ["grant", "template"]}
//
// A quota has no window. Its scope is grant, template (the call's
// args.template), global, or grant and template together; session and vm
// make no sense for a VM that does not exist yet. weight names an argument
// (args.<name>) whose whole, non-negative value is the number of units the
// VM holds, so a quota can bound total memory; the server fills the
// template's defaults in before deciding, so the weight is the memory the
// VM gets. A call whose weight argument is missing or not a whole number is
// denied. Quotas belong on QuotaTool only: no other tool creates anything
// that could give its unit back.
//
// The lease block on QuotaTool bounds how long a created VM lives:
//
//	"lease": {"default_ttl": "15m", "max_ttl": "1h"}
//
// A call's ttl_s above max_ttl is clamped to it; without ttl_s the VM gets
// default_ttl. Without a lease block DefaultLease applies: every created VM
// has a lease.

// QuotaTool is the tool whose calls create VMs: quota limits and the lease
// block belong on it alone.
const QuotaTool = "vm_create"

// DefaultLease applies to QuotaTool when its policy has no lease block.
func DefaultLease() LeaseSpec { return LeaseSpec{Default: 15 * time.Minute, Max: time.Hour} }

// maxLease bounds max_ttl.
const maxLease = 7 * 24 * time.Hour

// Quota is one quota a vm_create call holds while the VM it creates lives.
type Quota struct {
	// Key identifies the quota: the counter name plus the scope values
	// ("vms|grant=5:alice"), like Counter.Key.
	Key    string
	Name   string // the counter name from the document
	Max    int64  // never more than Max units held at once
	Weight int64  // the units this call holds: 1, or its weight argument
	Rule   string // JSON pointer of the limit
}

// LeaseSpec bounds the lease of a created VM.
type LeaseSpec struct {
	Default time.Duration // the lease of a call without ttl_s
	Max     time.Duration // the longest lease a call gets
	Rule    string        // JSON pointer of the lease block ("" for DefaultLease())
}

// TTL is the lease a call asking for requested (0: none asked) gets, and
// whether the request was clamped to Max.
func (l LeaseSpec) TTL(requested time.Duration) (ttl time.Duration, clamped bool) {
	switch {
	case requested <= 0:
		return min(l.Default, l.Max), false
	case requested > l.Max:
		return l.Max, true
	}
	return requested, false
}

// OverQuota turns d into the RateLimited decision for the quota q that the
// store found full, retryable after retry (when the first lease holding it
// ends).
func (d Decision) OverQuota(q Quota, retry time.Duration) Decision {
	d.Verdict = RateLimited
	d.Rule = q.Rule
	d.Reason = "quota " + q.Name + " is full"
	d.RetryAfter = retry
	return d
}

// scopeTemplate is the quota-only scope bit (see the other scope bits in
// parse.go): a key per template.
const scopeTemplate uint8 = 1 << 3

// The kinds of limits.
const (
	kindRate  = "rate"
	kindQuota = "quota"
)

// weightOf is the weight of quota limit l for call: 1 without a weight
// path, else the path's value, which must be a whole number from 0 to
// maxMax. ok is false when it is not.
func (l *limit) weightOf(call *Call) (int64, bool) {
	if l.weight == nil {
		return 1, true
	}
	var v any = call.Args
	for _, s := range l.weight {
		m, ok := v.(map[string]any)
		if !ok {
			return 0, false
		}
		if v, ok = m[s]; !ok {
			return 0, false
		}
	}
	var f float64
	switch x := v.(type) {
	case int64:
		if x < 0 || x > maxMax {
			return 0, false
		}
		return x, true
	case json.Number:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			f = float64(n)
		} else if f, err = x.Float64(); err != nil {
			return 0, false
		}
	default:
		var ok bool
		if f, ok = number(v); !ok {
			return 0, false
		}
	}
	if f != math.Trunc(f) || f < 0 || f > maxMax {
		return 0, false
	}
	return int64(f), true
}

// quotaOf is the Quota quota limit l holds for call, or the reason the
// call is denied.
func (l *limit) quotaOf(call *Call) (Quota, string) {
	w, ok := l.weightOf(call)
	if !ok {
		return Quota{}, "quota " + l.name + " weighs args." + strings.Join(l.weight, ".") + ", and the call has no whole number from 0 to " + strconv.Itoa(maxMax) + " there"
	}
	return Quota{Key: l.key(call), Name: l.name, Max: l.max, Weight: w, Rule: l.ptr}, ""
}

// quotaScope checks the scope bits of a quota limit.
func (b *builder) quotaScope(n *node, l loc, bits uint8) bool {
	if bits&(scopeSession|scopeVM) != 0 {
		b.errorf(n.off, l.path, "a quota's scope is grant, template, global or grant and template: it counts VMs that live on, which belong to no session and are not the call's vm")
		return false
	}
	return true
}

// quotaLimit reads the quota-only parts of a limit (weight; no window) into
// lim. m are the limit's members.
func (b *builder) quotaLimit(n *node, m map[string]*node, l loc, lim *limit) bool {
	good := true
	if v, ok := m["window"]; ok {
		b.errorf(v.off, l.key("window").path, "a quota has no window: it holds its units while the VM lives")
		good = false
	}
	if v, ok := m["weight"]; ok {
		lw := l.key("weight")
		s, ok := b.str(v, lw)
		switch {
		case !ok:
			good = false
		case !strings.HasPrefix(s, "args.") || len(s) > maxPathLen:
			b.errorf(v.off, lw.path, "weight %q: want an argument path args.<name> (for example args.memory_mb)", s)
			good = false
		default:
			segs := strings.Split(s[len("args."):], ".")
			for _, seg := range segs {
				if seg == "" {
					b.errorf(v.off, lw.path, "weight %q has an empty name", s)
					return false
				}
			}
			if len(segs) > maxPathSegs {
				b.errorf(v.off, lw.path, "weight %q has more than %d names", s, maxPathSegs)
				return false
			}
			lim.weight = segs
		}
	}
	return good
}

// lease reads the lease block of QuotaTool.
func (b *builder) lease(n *node, l loc) *LeaseSpec {
	ls := &LeaseSpec{Default: DefaultLease().Default, Max: DefaultLease().Max, Rule: l.ptr}
	m, ok := b.object(n, l, "default_ttl", "max_ttl")
	if !ok {
		return ls
	}
	read := func(field string, into *time.Duration) {
		v, ok := m[field]
		if !ok {
			return
		}
		lf := l.key(field)
		s, ok := b.str(v, lf)
		if !ok {
			return
		}
		d, err := time.ParseDuration(s)
		switch {
		case err != nil:
			b.errorf(v.off, lf.path, "bad duration %q (want a Go duration like \"30m\")", s)
		case d < time.Second || d > maxLease:
			b.errorf(v.off, lf.path, "%s %s is out of range (want 1s to %s)", field, d, maxLease)
		default:
			*into = d
		}
	}
	read("max_ttl", &ls.Max)
	read("default_ttl", &ls.Default)
	if _, ok := m["default_ttl"]; !ok && ls.Default > ls.Max {
		ls.Default = ls.Max
	}
	if ls.Default > ls.Max {
		b.errorf(n.off, l.path, "default_ttl %s is longer than max_ttl %s", ls.Default, ls.Max)
	}
	return ls
}
