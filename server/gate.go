package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/jsonrpc"
)

// The gate: the one chokepoint every message of every transport goes
// through before mcp-go sees anything, and the seven steps a tools/call
// passes. What a step hands on is in the gating value; what ends a call is
// a refusal (refusal.go); a call that passes every step goes on with its
// single-use ticket (ticket.go).

// gateMessage reads every message strictly (jsonrpc.Read); a tools/call
// then goes through gateSteps in order, and only one that passes them all
// reaches its handler, with its ticket.
func (s *Server) gateMessage(ctx context.Context, c *Conn, raw []byte) verdict {
	ctx = ConnContext(ctx, c)
	e, err := jsonrpc.Read(raw, s.limits.MaxMessageBytes)
	if err != nil {
		var inv *jsonrpc.InvalidError
		if errors.As(err, &inv) {
			return verdict{reply: jsonrpc.ErrorReply(inv.ID, mcp.INVALID_REQUEST, inv.Msg)}
		}
		return s.refuseMalformed(ctx, c, raw, err)
	}
	if method, _ := e.M["method"].(string); method != string(mcp.MethodToolsCall) {
		v := verdict{ctx: ctx}
		if method == string(mcp.MethodNotificationCancelled) && !e.HasID {
			v.cancels, v.cancelsSet = jsonrpc.CancelledID(e.M)
		}
		return v
	}
	g := &gating{s: s, ctx: ctx, conn: c, raw: raw, Envelope: e, start: s.now()}
	// The decision record carries the reservation time, so the log alone
	// can check every limit window exactly.
	g.rec = audit.Record{Kind: audit.KindDecision, Time: g.start, CallID: rand.Text(), Grant: c.Grant.Name, Transport: c.Transport}
	for _, step := range gateSteps {
		if v, done := step.run(g); done {
			return v
		}
	}
	return g.pass()
}

// gateSteps are what a tools/call passes, in order. A step either lets
// the call go on or ends it with the verdict to answer (after recording
// why in the audit log).
var gateSteps = [...]struct {
	name string
	run  func(g *gating) (v verdict, done bool)
}{
	{"decode", (*gating).decode},     // params, tool name and arguments
	{"validate", (*gating).validate}, // against the catalogue, into the typed arguments, their own checks
	{"resolve", (*gating).resolve},   // the vm argument to a backend the grant sees
	{"decide", (*gating).decide},     // the grant's policy
	{"approve", (*gating).approve},   // an approval an operator or the client's user gave
	{"reserve", (*gating).reserve},   // every counter the decision names, atomically
	{"record", (*gating).record},     // the durable decision record
}

// gating is one tools/call on its way through the gate.
type gating struct {
	s    *Server
	ctx  context.Context
	conn *Conn
	raw  []byte
	jsonrpc.Envelope
	start time.Time    // the decision and reservation time
	rec   audit.Record // the decision record, filled in step by step

	params   map[string]any
	spec     *catalog.Tool
	args     map[string]any // as sent, then as validated
	call     *call
	decision policy.Decision
	counters []policy.Counter // reserved
	elicit   *clientAsk       // set: the handler asks the client first
}

// callParamKeys are the members params of a tools/call may have.
var callParamKeys = map[string]bool{"name": true, "arguments": true, "_meta": true, paramRequestState: true, paramInputResponses: true}

// decode reads params: a known tool's name and its arguments object.
func (g *gating) decode() (verdict, bool) {
	params, ok := g.M["params"].(map[string]any)
	if !ok {
		return g.invalid("params must be an object with name and arguments")
	}
	for k := range params {
		if !callParamKeys[k] {
			return g.invalid(fmt.Sprintf("unknown member %q in params", catalog.Truncate(k, 40)))
		}
	}
	g.params = params
	name, ok := params["name"].(string)
	if !ok {
		return g.invalid("params.name must be a string")
	}
	g.rec.Tool = catalog.Truncate(name, 128)
	if g.spec = g.s.tools[name]; g.spec == nil {
		return g.invalid(fmt.Sprintf("unknown tool %q", catalog.Truncate(name, 64)))
	}
	g.args = map[string]any{}
	if a, present := params["arguments"]; present {
		if g.args, ok = a.(map[string]any); !ok {
			return g.invalid("arguments must be an object")
		}
	}
	if len(g.raw) <= maxAuditArgsBytes {
		g.rec.Args = g.args
	}
	if !g.HasID {
		return g.invalid("tools/call sent as a notification")
	}
	return verdict{}, false
}

// validate checks the arguments against the catalogue, decodes them into
// the tool's argument struct and runs the struct's own checks (those that
// need no guest: catalog.ArgChecker, catalog.Completer), so that a call
// they refuse parks no approval and reserves nothing.
func (g *gating) validate() (verdict, bool) {
	valid, err := g.spec.Validate(g.args)
	if err != nil {
		return g.invalid(err.Error())
	}
	g.args, g.rec.Args = valid, valid
	typed, err := g.spec.Decode(valid)
	if err != nil {
		return g.refuse(refusal{decision: decisionError, tag: TagInvalid, msg: "the server could not read these arguments", detail: err.Error()})
	}
	if err := g.spec.Check(g.s.env, typed, valid); err != nil {
		return g.invalid(err.Error())
	}
	c := g.conn
	g.call = &call{spec: g.spec, Call: catalog.Call{ID: g.rec.CallID, Grant: c.Grant.callGrant(), Transport: c.Transport, Tool: g.spec.Name, Args: typed}}
	return verdict{}, false
}

// resolve finds the backend of the vm argument, as the grant sees it.
func (g *gating) resolve() (verdict, bool) {
	vm, ok := g.args["vm"].(string)
	if !ok {
		return verdict{}, false
	}
	g.rec.VM = catalog.Truncate(vm, 512)
	backend, name, d, ok := g.s.resolveVM(g.conn.Grant, vm)
	if !ok {
		return g.refuse(refusal{decision: decisionUnknownVM, tag: TagUnknownVM, msg: catalog.UnknownVMText(vm)})
	}
	// Another grant's created VM does not exist for this one (lease/owners.go).
	if hidden, err := g.s.leases.Hidden(g.ctx, g.conn.Grant.Name, vm, backend); err != nil {
		g.rec.Reason = err.Error()
		return g.refuse(refusal{decision: decisionError, tag: TagBackend, msg: err.Error()})
	} else if hidden {
		return g.refuse(refusal{decision: decisionUnknownVM, tag: TagUnknownVM, msg: catalog.UnknownVMText(vm)})
	}
	cl := g.call
	cl.VM, cl.Backend, cl.Name, cl.Driver = vm, backend, name, d
	return verdict{}, false
}

// decide asks the grant's policy. A denial ends the call; in shadow mode
// the decision is recorded and the call goes on.
func (g *gating) decide() (verdict, bool) {
	eng := g.s.policyOf(g.conn.Grant)
	if eng == nil {
		g.rec.Reason = "grant has no policy"
		return g.refuse(denied("this grant has no policy, so it can do nothing"))
	}
	session, _ := g.args["session"].(string)
	name := g.spec.Name
	// Conditions see the arguments as the handler runs them: defaults filled in.
	args := g.spec.WithDefaults(g.args)
	d := eng.Decide(policy.Call{Grant: g.conn.Grant.Name, Transport: g.conn.Transport, Tool: name, VM: g.call.VM, Session: session, Args: args})
	g.decision = d
	g.call.snapshot = d.Snapshot
	g.call.Rules = catalog.Rules{Files: d.Files, Sandbox: d.Sandbox, MaxTimeoutS: d.MaxTimeoutS, Snapshots: d.Snapshots, KeepFiles: d.KeepFiles, Quotas: d.Quotas, Lease: d.Lease, Verdict: d.Verdict, Rule: d.Rule}
	g.rec.Rule, g.rec.Reason, g.rec.Shadow = d.Rule, d.Reason, d.Shadow
	if hasRoundTrip(g.params) && !isClientChannel(d) {
		return g.invalid("requestState and inputResponses answer a client approval, and this call asks for none")
	}
	switch {
	case d.Shadow && d.Verdict != policy.Allow:
		// Shadow mode: audit what enforcement would have done, then allow.
		g.rec.Decision = d.Verdict.String()
	case d.Verdict == policy.Deny:
		msg := d.Reason
		if msg == "" {
			msg = "the policy does not allow " + name
		}
		return g.refuse(denied(msg))
	case d.Verdict == policy.Approve:
		g.rec.Decision = policy.Approve.String()
	case d.Verdict != policy.Allow:
		return g.refuse(refusal{decision: decisionError, tag: TagDenied, msg: "the policy gave no usable decision"})
	}
	return verdict{}, false
}

// approve lets a call the policy wants approved go on only with its
// approval: one an operator granted (consumed now; else the call is
// parked: park.go), or the client's user's (elicit.go).
func (g *gating) approve() (verdict, bool) {
	d := g.decision
	if d.Verdict != policy.Approve || d.Shadow {
		if g.rec.Decision == "" {
			g.rec.Decision = policy.Allow.String()
		}
		return verdict{}, false
	}
	if isClientChannel(d) {
		v, ask, done := g.approveByClient()
		g.elicit = ask
		return v, done
	}
	name := g.spec.Name
	digest := argsDigest(name, g.args)
	a, ok, err := g.s.store.ConsumeApproval(g.ctx, g.conn.Grant.Name, name, digest, g.start)
	if err != nil {
		g.rec.Reason = "approval store: " + err.Error()
		return g.refuse(refusal{decision: decisionError, tag: TagDenied, msg: "the approval store is unavailable, so the call is refused"})
	}
	if !ok {
		if v, done := g.foresee(); done {
			return v, true // it cannot succeed: no operator is asked
		}
		return g.park(digest), true
	}
	g.rec.ApprovalID = a.ID
	return verdict{}, false
}

// reserve reserves every counter the decision names, all or none. A limit
// that is full ends the call with its retry time (shadow mode: recorded
// only).
func (g *gating) reserve() (verdict, bool) {
	d := g.decision
	if len(d.Counters) == 0 {
		return verdict{}, false
	}
	err := g.s.store.ReserveAll(g.ctx, g.rec.CallID, g.start, d.Counters)
	var le *store.LimitedError
	switch {
	case err == nil:
		g.counters = d.Counters
		g.rec.Counters = d.Counters
	case errors.As(err, &le) && d.Shadow:
		g.rec.Decision, g.rec.Rule, g.rec.Reason = policy.RateLimited.String(), le.Counter.Rule, "rate limit "+le.Counter.Name+" exceeded"
	case errors.As(err, &le):
		lim := d.Limited(le.Counter, le.RetryAfter)
		g.rec.Rule, g.rec.Reason = lim.Rule, lim.Reason
		secs := max(int64(math.Ceil(le.RetryAfter.Seconds())), 1)
		return g.refuse(rateLimited(fmt.Sprintf("%s: retry in %d s", lim.Reason, secs), secs))
	default:
		g.rec.Reason = "store: " + err.Error()
		return g.refuse(refusal{decision: decisionError, tag: TagDenied, msg: "the policy store is unavailable, so the call is refused"})
	}
	return verdict{}, false
}

// record writes the decision record (durable before dispatch when the call
// counts or can change something: durability.go) and registers the call in
// flight; either failing refunds the reservations and refuses the call.
func (g *gating) record() (verdict, bool) {
	s, callID := g.s, g.rec.CallID
	if err := s.appendDecision(g.ctx, g.spec, g.rec); err != nil {
		s.log.Error("server: audit decision record failed; call refused", "call", callID, "tool", g.spec.Name, "err", err)
		if len(g.counters) > 0 {
			s.refund(callID, g.start, g.counters)
		}
		return verdict{reply: jsonrpc.ResultReply(g.ID, catalog.ErrorResult(TagDenied, auditRefusal(err), nil))}, true
	}
	if !s.begin() {
		if len(g.counters) > 0 {
			s.refund(callID, g.start, g.counters)
		}
		s.outcome(g.rec, "not_run", "server shutting down", g.start, len(g.counters) > 0)
		return verdict{reply: jsonrpc.ResultReply(g.ID, catalog.ErrorResult(TagBackend, "the server is shutting down", nil))}, true
	}
	return verdict{}, false
}

// pass hands the call on with its single-use ticket.
func (g *gating) pass() verdict {
	// The deadline bounds the driver's work only (Call.Ctx): the context
	// mcp-go gets must outlive it, or mcp-go drops the [TIMED OUT] result
	// the handler answers with at the deadline (over HTTP, an empty 200).
	cl := g.call
	cl.ArgMap = g.args
	deadline := g.spec.Deadline(g.s.env, cl.Args)
	if cl.wantsUndo() {
		deadline += g.s.env.Timeouts.Undo
	}
	callCtx, cancel := context.WithTimeout(g.ctx, deadline)
	t := &ticket{server: g.s, call: cl, claimed: make(chan struct{}), start: g.start, counters: g.counters, cancel: cancel, elicit: g.elicit}
	cl.Ctx = callCtx
	dm := &directMessage{m: g.M, id: g.ID, params: g.params}
	return verdict{ctx: context.WithValue(g.ctx, ticketKey, t), t: t, direct: dm}
}
