package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/vmgate/vmgate/policy"
)

// The rule both engines decide: allow kill_process only if pid ≥ 2, signal
// in {TERM, KILL} and the VM matches lab/*; deny everything else.

const killPolicy = `{"version":"1","default":"deny","tools":{"kill_process":{
  "require":[
    {"path":"args.pid","op":"gte","value":2},
    {"path":"args.signal","op":"in","value":["TERM","KILL"]},
    {"path":"vm","op":"glob","value":"lab/*"}]}}}`

// killRego is the same rule in Rego. is_number keeps a string pid out:
// Rego orders values of different types, so "5" >= 2 would be true.
const killRego = `package vmgate

default allow := false

allow if {
	input.tool == "kill_process"
	is_number(input.args.pid)
	input.args.pid >= 2
	input.args.signal in {"TERM", "KILL"}
	glob.match("lab/*", ["/"], input.vm)
}
`

// deciders holds both engines, ready to decide.
type deciders struct {
	engine *policy.Engine
	opa    rego.PreparedEvalQuery
}

func newDeciders(ctx context.Context) (*deciders, error) {
	eng, err := policy.Parse("kill.json", []byte(killPolicy))
	if err != nil {
		return nil, fmt.Errorf("decide: policy: %w", err)
	}
	pq, err := rego.New(rego.Query("data.vmgate.allow"), rego.Module("kill.rego", killRego)).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("decide: opa: %w", err)
	}
	return &deciders{engine: eng, opa: pq}, nil
}

// vmgate decides c with policy.Engine.
func (d *deciders) vmgate(c policy.Call) bool {
	return d.engine.Decide(c).Verdict == policy.Allow
}

// rego decides c with OPA; the input is what the server would hand it.
func (d *deciders) rego(ctx context.Context, c policy.Call) (bool, error) {
	input := map[string]any{"grant": c.Grant, "tool": c.Tool, "vm": c.VM, "args": c.Args}
	rs, err := d.opa.Eval(ctx, rego.EvalInput(input))
	if err != nil {
		return false, fmt.Errorf("decide: opa: eval: %w", err)
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return false, fmt.Errorf("decide: opa: %d results; want 1", len(rs))
	}
	allow, ok := rs[0].Expressions[0].Value.(bool)
	if !ok {
		return false, fmt.Errorf("decide: opa: result %v is not a boolean", rs[0].Expressions[0].Value)
	}
	return allow, nil
}

// benchKill is the call both engines decide in the benchmark: an allowed
// one, so every condition is evaluated.
func benchKill() policy.Call {
	return policy.Call{Grant: "local", Transport: "stdio", Tool: "kill_process", VM: "lab/vm1",
		Args: map[string]any{"vm": "lab/vm1", "pid": float64(4242), "signal": "TERM"}}
}

// perOp runs f n times and returns the time per call in µs and the heap
// allocations per call.
func perOp(n int, f func() error) (us, allocs float64, err error) {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	for range n {
		if err := f(); err != nil {
			return 0, 0, err
		}
	}
	took := time.Since(start)
	runtime.ReadMemStats(&m1)
	return float64(took.Nanoseconds()) / 1e3 / float64(n), float64(m1.Mallocs-m0.Mallocs) / float64(n), nil
}

// decideRow measures policy.Engine.Decide against OPA's prepared query.
func decideRow(ctx context.Context, warmup, pairs int) *Row {
	r := &Row{ID: "3", Unit: "µs", What: `decision "kill_process: pid ≥ 2, signal in {TERM,KILL}, vm lab/*": policy.Engine.Decide / OPA PreparedEvalQuery.Eval`}
	d, err := newDeciders(ctx)
	if err != nil {
		r.Err = err
		return r
	}
	call := benchKill()
	var allocA, allocB []float64
	r.Err = Rounds(ctx, warmup, pairs, func(ctx context.Context, _ int, counts bool) error {
		a, aa, err := perOp(20000, func() error {
			if !d.vmgate(call) {
				return fmt.Errorf("decide: Decide(%v) = deny; want allow", call)
			}
			return nil
		})
		if err != nil {
			return err
		}
		b, ab, err := perOp(2000, func() error {
			ok, err := d.rego(ctx, call)
			if err == nil && !ok {
				err = fmt.Errorf("decide: opa(%v) = deny; want allow", call)
			}
			return err
		})
		if err != nil {
			return err
		}
		if !counts {
			return nil
		}
		allocA, allocB = append(allocA, aa), append(allocB, ab)
		return r.Add(a, b)
	})
	if len(allocA) > 0 {
		ma, _ := medianSpread(allocA)
		mb, _ := medianSpread(allocB)
		r.Note = fmt.Sprintf("allocs/op %.0f / %.0f", ma, mb)
	}
	return r
}
