package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
)

// The tags every error result starts with.
const (
	TagDenied      = "[POLICY DENIED]"
	TagRateLimited = "[RATE LIMITED]"
	TagApproval    = "[APPROVAL REQUIRED]"
	TagInvalid     = "[INVALID ARGUMENT]"
	TagUnknownVM   = "[UNKNOWN VM]"
	TagBackend     = "[BACKEND ERROR]"
	TagTimedOut    = "[TIMED OUT]"
	// TagQuota: a vm_create that a quota has no room for (tool_lifecycle.go).
	TagQuota = "[QUOTA EXCEEDED]"
)

// Audit decisions written by the gate besides the policy verdicts.
const (
	decisionInvalid   = "invalid"
	decisionUnknownVM = "unknown_vm"
	decisionError     = "error"
)

// maxAuditArgsBytes: arguments of a refused call larger than this are not
// copied into its audit record (the record names their size instead).
const maxAuditArgsBytes = 64 << 10

// DefaultApprovalTTL is how long an approval lives when the policy says nothing.
const DefaultApprovalTTL = 15 * time.Minute

type ctxKey int

const (
	connKey ctxKey = iota
	ticketKey
)

// conn is who is calling and how; the transports put it in the context.
type conn struct {
	grant     *Grant
	transport string // "stdio" or "http"
}

func withConn(ctx context.Context, c *conn) context.Context {
	return context.WithValue(ctx, connKey, c)
}

func connFrom(ctx context.Context) *conn {
	c, _ := ctx.Value(connKey).(*conn)
	return c
}

// call is one tools/call that passed the gate, as a handler sees it.
type call struct {
	ctx       context.Context
	id        string // the call id of the audit records
	grant     *Grant
	transport string
	spec      *toolSpec
	args      any    // the tool's argument struct (*execArgs, …), decoded once by the gate
	vm        string // full id, "" for tools without one
	backend   string
	name      string // backend-local VM name
	driver    hypervisor.Driver
	argMap    map[string]any    // the validated arguments, as the policy saw them
	files     *policy.FileRules // the decision's, for the file tools (tool_files.go)
	// sandbox is the policy's sandbox for a create_session call
	// (policy.Decision.Sandbox); nil for every other tool.
	sandbox *policy.Sandbox
	// snapshot is the decision's snapshot_before; undo the snapshot taken
	// for it (undo.go).
	snapshot *policy.SnapshotBefore
	undo     *undoEntry
	// snapRules are the decision's rules for the VM's snapshots: what a
	// snapshot tool may touch, and the grant's bounds (snapowners.go).
	snapRules policy.SnapshotRules
	// keepFiles is the decision's keep_files (destroy_session, tool_trash.go).
	keepFiles time.Duration
	// quotas and lease are the policy's for a vm_create call.
	quotas []policy.Quota
	lease  *policy.LeaseSpec
}

// ticket is the gate's single-use permission for one call. Only the gate
// creates tickets; handlers claim them.
type ticket struct {
	server   *Server
	call     *call
	claimed  chan struct{} // closed by the handler that claims the ticket
	res      *result       // set by that handler before it returns
	start    time.Time     // the decision and reservation time (Refund needs it)
	counters []policy.Counter
	cancel   context.CancelFunc
	// elicit, when set, is the approval the handler must get from the
	// client (elicitation/create) before the call runs; see elicit_legacy.go.
	elicit *clientAsk
}

// verdict is what the gate decided for one message.
type verdict struct {
	reply []byte          // a response to send instead of passing the message on
	ctx   context.Context // non-nil: pass the message to mcp-go with this context
	t     *ticket         // set with ctx for a gated tools/call: settle it afterwards
	// direct is what a gated tools/call holds for the direct path
	// (dispatch.go); set with t.
	direct *directMessage
	// cancels, for a notifications/cancelled, is the request id it names,
	// as encoding/json reads it (cancelsSet: it names one).
	cancels    any
	cancelsSet bool
}

var envelopeKeys = map[string]bool{"jsonrpc": true, "id": true, "method": true, "params": true, "result": true, "error": true}
var callParamKeys = map[string]bool{"name": true, "arguments": true, "_meta": true, paramRequestState: true, paramInputResponses: true}

// gateMessage is the one chokepoint: every message of every transport goes
// through it before mcp-go sees anything. Every message is read strictly
// (readEnvelope); a tools/call then goes through gateSteps in order, and only
// one that passes them all reaches mcp-go, with its ticket.
func (s *Server) gateMessage(ctx context.Context, c *conn, raw []byte) verdict {
	ctx = withConn(ctx, c)
	e, v, ok := s.readEnvelope(ctx, c, raw)
	if !ok {
		return v
	}
	if method, _ := e.m["method"].(string); method != string(mcp.MethodToolsCall) {
		v := verdict{ctx: ctx}
		if method == string(mcp.MethodNotificationCancelled) && !e.hasID {
			v.cancels, v.cancelsSet = cancelledID(e.m)
		}
		return v
	}
	g := &gating{s: s, ctx: ctx, conn: c, raw: raw, envelope: e, start: s.now()}
	// The decision record carries the reservation time, so the log alone
	// can check every limit window exactly.
	g.rec = audit.Record{Kind: audit.KindDecision, Time: g.start, CallID: rand.Text(), Grant: c.grant.Name, Transport: c.transport}
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
	{"validate", (*gating).validate}, // against the catalogue, into the typed arguments
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
	conn *conn
	raw  []byte
	envelope
	start time.Time    // the decision and reservation time
	rec   audit.Record // the decision record, filled in step by step

	params   map[string]any
	spec     *toolSpec
	args     map[string]any // as sent, then as validated
	call     *call
	decision policy.Decision
	counters []policy.Counter // reserved
	elicit   *clientAsk       // set: the handler asks the client first
}

// refuse ends the call with a tagged tool error (or, for a notification,
// no reply), recorded with decision.
func (g *gating) refuse(decision, tag, msg string) (verdict, bool) {
	return g.s.refuse(g.ctx, g.id, g.hasID, g.rec, decision, tag, msg, ""), true
}

func (g *gating) invalid(msg string) (verdict, bool) {
	return g.refuse(decisionInvalid, TagInvalid, msg)
}

// envelope is a message that passed the checks every message gets.
type envelope struct {
	m     map[string]any
	id    any // the request id; hasID says whether there was one
	hasID bool
}

// readEnvelope decodes raw strictly and checks the JSON-RPC envelope every
// message shares. ok false: answer with v.
func (s *Server) readEnvelope(ctx context.Context, c *conn, raw []byte) (e envelope, v verdict, ok bool) {
	reply := func(id any, msg string) (envelope, verdict, bool) {
		return envelope{}, verdict{reply: rpcError(id, mcp.INVALID_REQUEST, msg)}, false
	}
	if len(raw) > s.limits.MaxMessageBytes {
		return envelope{}, s.refuseMalformed(ctx, c, raw, fmt.Errorf("message of %d bytes exceeds the limit of %d", len(raw), s.limits.MaxMessageBytes)), false
	}
	val, err := decodeStrict(raw)
	if err != nil {
		return envelope{}, s.refuseMalformed(ctx, c, raw, err), false
	}
	m, isObject := val.(map[string]any)
	if !isObject {
		if _, batch := val.([]any); batch {
			return reply(nil, "batches are not supported")
		}
		return reply(nil, "a message must be a JSON object")
	}
	for k := range m {
		if !envelopeKeys[k] {
			return envelope{}, s.refuseMalformed(ctx, c, raw, fmt.Errorf("unknown member %q in the message", k)), false
		}
	}
	// The id first: a reply must carry it byte for byte, and mcp-go reads
	// numbers through float64, so only integers it holds exactly pass.
	id, hasID := m["id"]
	if hasID {
		switch n := id.(type) {
		case string:
		case json.Number:
			if !exactIntegerID(n) {
				return reply(nil, "a number id must be an integer between -(2^53-1) and 2^53-1")
			}
		default:
			return reply(nil, "id must be a string or a number")
		}
	}
	if m["jsonrpc"] != "2.0" {
		return reply(id, "jsonrpc must be \"2.0\"")
	}
	return envelope{m: m, id: id, hasID: hasID}, verdict{}, true
}

// decode reads params: a known tool's name and its arguments object.
func (g *gating) decode() (verdict, bool) {
	params, ok := g.m["params"].(map[string]any)
	if !ok {
		return g.invalid("params must be an object with name and arguments")
	}
	for k := range params {
		if !callParamKeys[k] {
			return g.invalid(fmt.Sprintf("unknown member %q in params", truncate(k, 40)))
		}
	}
	g.params = params
	name, ok := params["name"].(string)
	if !ok {
		return g.invalid("params.name must be a string")
	}
	g.rec.Tool = truncate(name, 128)
	if g.spec = g.s.tools[name]; g.spec == nil {
		return g.invalid(fmt.Sprintf("unknown tool %q", truncate(name, 64)))
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
	if !g.hasID {
		return g.invalid("tools/call sent as a notification")
	}
	return verdict{}, false
}

// validate checks the arguments against the catalogue and decodes them
// into the tool's argument struct.
func (g *gating) validate() (verdict, bool) {
	valid, err := g.spec.validate(g.args)
	if err != nil {
		return g.invalid(err.Error())
	}
	g.args, g.rec.Args = valid, valid
	typed, err := g.spec.decode(valid)
	if err != nil {
		return g.s.refuse(g.ctx, g.id, g.hasID, g.rec, decisionError, TagInvalid, "the server could not read these arguments", err.Error()), true
	}
	if ck, ok := typed.(argChecker); ok {
		if err := ck.checkArgs(); err != nil {
			return g.invalid(err.Error())
		}
	}
	if cp, ok := typed.(completer); ok {
		if err := cp.complete(g.s, valid); err != nil {
			return g.invalid(err.Error())
		}
	}
	c := g.conn
	g.call = &call{id: g.rec.CallID, grant: c.grant, transport: c.transport, spec: g.spec, args: typed}
	return verdict{}, false
}

// argChecker is an argument struct with a rule the catalogue cannot
// express (a snapshot name's grammar): the gate refuses a call whose
// check fails before the policy sees it, so it parks no approval and
// reserves nothing.
type argChecker interface {
	checkArgs() error
}

// resolve finds the backend of the vm argument, as the grant sees it.
func (g *gating) resolve() (verdict, bool) {
	vm, ok := g.args["vm"].(string)
	if !ok {
		return verdict{}, false
	}
	g.rec.VM = truncate(vm, 512)
	backend, name, d, ok := g.s.resolveVM(g.conn.grant, vm)
	if !ok {
		return g.refuse(decisionUnknownVM, TagUnknownVM, unknownVMText(vm))
	}
	// Another grant's created VM does not exist for this one (vmowners.go).
	if hidden, err := g.s.hiddenVM(g.ctx, g.conn.grant, vm, backend); err != nil {
		g.rec.Reason = err.Error()
		return g.refuse(decisionError, TagBackend, err.Error())
	} else if hidden {
		return g.refuse(decisionUnknownVM, TagUnknownVM, unknownVMText(vm))
	}
	cl := g.call
	cl.vm, cl.backend, cl.name, cl.driver = vm, backend, name, d
	return verdict{}, false
}

// decide asks the grant's policy. A denial ends the call; in shadow mode
// the decision is recorded and the call goes on.
func (g *gating) decide() (verdict, bool) {
	eng := g.s.policyOf(g.conn.grant)
	if eng == nil {
		g.rec.Reason = "grant has no policy"
		return g.refuse(policy.Deny.String(), TagDenied, "this grant has no policy, so it can do nothing")
	}
	session, _ := g.args["session"].(string)
	name := g.spec.name
	// Conditions see the arguments as the handler runs them: defaults filled in.
	args := g.spec.withDefaults(g.args)
	d := eng.Decide(policy.Call{Grant: g.conn.grant.Name, Transport: g.conn.transport, Tool: name, VM: g.call.vm, Session: session, Args: args})
	g.decision = d
	g.call.sandbox = d.Sandbox
	g.call.snapshot, g.call.keepFiles, g.call.snapRules = d.Snapshot, d.KeepFiles, d.Snapshots
	g.call.quotas, g.call.lease = d.Quotas, d.Lease
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
		return g.refuse(policy.Deny.String(), TagDenied, msg)
	case d.Verdict == policy.Approve:
		g.rec.Decision = policy.Approve.String()
	case d.Verdict != policy.Allow:
		return g.refuse(decisionError, TagDenied, "the policy gave no usable decision")
	}
	return verdict{}, false
}

// approve lets a call the policy wants approved go on only with its
// approval: one an operator granted (consumed now; else the call is
// parked), or the client's user's (server/elicit.go).
func (g *gating) approve() (verdict, bool) {
	d := g.decision
	if d.Verdict != policy.Approve || d.Shadow {
		if g.rec.Decision == "" {
			g.rec.Decision = policy.Allow.String()
		}
		return verdict{}, false
	}
	s, name := g.s, g.spec.name
	if isClientChannel(d) {
		v, ask, done := s.approveByClient(g.ctx, g.id, &g.rec, d, name, g.call.vm, g.args, g.params, g.start)
		g.elicit = ask
		return v, done
	}
	digest := argsDigest(name, g.args)
	a, ok, err := s.store.ConsumeApproval(g.ctx, g.conn.grant.Name, name, digest, g.start)
	if err != nil {
		g.rec.Reason = "approval store: " + err.Error()
		return g.refuse(decisionError, TagDenied, "the approval store is unavailable, so the call is refused")
	}
	if !ok {
		return s.park(g.ctx, g.id, g.rec, d, name, g.call.vm, g.args, digest, g.start), true
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
		msg := fmt.Sprintf("%s: retry in %d s", lim.Reason, secs)
		return g.s.refuseWith(g.ctx, g.id, g.rec, policy.RateLimited.String(), TagRateLimited, msg, map[string]any{"retry_after_s": secs}), true
	default:
		g.rec.Reason = "store: " + err.Error()
		return g.refuse(decisionError, TagDenied, "the policy store is unavailable, so the call is refused")
	}
	return verdict{}, false
}

// record writes the decision record (durable before dispatch when the call
// counts or can change something: durability.go) and registers the call in
// flight; either failing refunds the reservations and refuses the call.
func (g *gating) record() (verdict, bool) {
	s, callID := g.s, g.rec.CallID
	if err := s.appendDecision(g.ctx, g.spec, g.rec); err != nil {
		s.log.Error("server: audit decision record failed; call refused", "call", callID, "tool", g.spec.name, "err", err)
		if len(g.counters) > 0 {
			s.refund(callID, g.start, g.counters)
		}
		return verdict{reply: rpcResult(g.id, errorResult(TagDenied, auditRefusal(err), nil))}, true
	}
	if !s.begin() {
		if len(g.counters) > 0 {
			s.refund(callID, g.start, g.counters)
		}
		s.outcome(g.rec, "not_run", "server shutting down", g.start, len(g.counters) > 0)
		return verdict{reply: rpcResult(g.id, errorResult(TagBackend, "the server is shutting down", nil))}, true
	}
	return verdict{}, false
}

// pass hands the call to mcp-go with its single-use ticket.
func (g *gating) pass() verdict {
	// The deadline bounds the driver's work only (call.ctx): the context
	// mcp-go gets must outlive it, or mcp-go drops the [TIMED OUT] result
	// the handler answers with at the deadline (over HTTP, an empty 200).
	cl := g.call
	cl.argMap, cl.files = g.args, g.decision.Files
	deadline := g.spec.deadline(g.s.limits, cl.args)
	if cl.wantsUndo() {
		deadline += undoGrace
	}
	callCtx, cancel := context.WithTimeout(g.ctx, deadline)
	t := &ticket{server: g.s, call: cl, claimed: make(chan struct{}), start: g.start, counters: g.counters, cancel: cancel, elicit: g.elicit}
	cl.ctx = callCtx
	dm := &directMessage{m: g.m, id: g.id, params: g.params}
	return verdict{ctx: context.WithValue(g.ctx, ticketKey, t), t: t, direct: dm}
}

// cancelledID is the request id a notifications/cancelled names, as mcp-go
// reads it (dispatch.go).
func cancelledID(m map[string]any) (any, bool) {
	params, _ := m["params"].(map[string]any)
	raw, ok := params["requestId"]
	if !ok {
		return nil, false
	}
	return encodingJSONValue(raw)
}

// maxExactInteger is 2^53-1, the largest integer a float64 holds exactly
// (and so every JSON reader, mcp-go's included).
const maxExactInteger = 1<<53 - 1

// exactIntegerID reports whether n is an id every reader echoes byte for
// byte: an integer literal (no fraction, no exponent, no "-0") within
// ±(2^53-1).
func exactIntegerID(n json.Number) bool {
	s := string(n)
	if s == "-0" || strings.ContainsAny(s, ".eE") {
		return false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return err == nil && v >= -maxExactInteger && v <= maxExactInteger
}

// maxVMNameBytes bounds the name part of a VM id.
const maxVMNameBytes = 255

// validVMID reports whether id is "<backend>/<name>" with a backend name
// the server accepts and a name of the safe charset: ASCII letters, digits
// and "._-+@:(), " (no glob or shell characters, no slashes, no control or
// non-ASCII characters), not beginning with '-', '.' or a space, not ending
// with a space and holding no "..". Every tool's vm goes through it before
// any driver call; list_vms leaves out the VMs whose ids fail it, so no VM
// is listed that cannot be called.
func validVMID(id string) bool {
	backend, name, ok := strings.Cut(id, "/")
	if !ok || !backendName(backend) || name == "" || len(name) > maxVMNameBytes {
		return false
	}
	if name[0] == '-' || name[0] == '.' || name[0] == ' ' || name[len(name)-1] == ' ' || strings.Contains(name, "..") {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-+@:(), ", c) >= 0) {
			return false
		}
	}
	return true
}

// settle finishes a gated call after mcp-go has answered it: the outcome
// record, and the refund of a call that failed before any side effect (or
// that mcp-go never handed to its handler).
func (s *Server) settle(t *ticket) {
	defer s.calls.Done()
	t.cancel()
	select {
	case <-t.claimed:
	default:
		// mcp-go answered without running the handler: nothing happened.
		t.res = &result{tag: TagBackend, noEffect: true, detail: "handler not run"}
	}
	if t.res == nil {
		// The handler panicked (handle answered an internal error): what
		// it did is unknown, so nothing is refunded.
		t.res = &result{tag: TagBackend, detail: "the handler panicked"}
	}
	r := t.res
	refund := r.noEffect && len(t.counters) > 0
	if refund {
		s.refund(t.call.id, t.start, t.counters)
	}
	rec := audit.Record{CallID: t.call.id, Grant: t.call.grant.Name, Transport: t.call.transport, Tool: t.call.spec.name, VM: t.call.vm}
	if u := t.call.undo; u != nil {
		rec.Snapshot, rec.SnapshotID, rec.SnapshotTaken = u.Name, u.ID, u.Taken
	}
	s.outcome(rec, r.outcomeName(), r.detail, t.start, refund)
}

func (s *Server) outcome(rec audit.Record, outcome, detail string, start time.Time, refunded bool) {
	out := audit.Record{
		Kind: audit.KindOutcome, CallID: rec.CallID, Grant: rec.Grant, Transport: rec.Transport, Tool: rec.Tool, VM: rec.VM,
		Outcome: outcome, Reason: detail, Refunded: refunded, Snapshot: rec.Snapshot, SnapshotID: rec.SnapshotID, SnapshotTaken: rec.SnapshotTaken,
		DurationMS: float64(s.now().Sub(start).Microseconds()) / 1000,
	}
	if err := s.audit.AppendLazy(context.Background(), out); err != nil {
		s.log.Error("server: audit outcome record failed", "call", rec.CallID, "err", err)
	}
}

func (s *Server) refund(id string, at time.Time, counters []policy.Counter) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.store.Refund(ctx, id, at, counters); err != nil {
		s.log.Warn("server: refund failed", "call", id, "err", err)
	}
}

// refuse answers a tools/call without dispatching it, after recording why.
// Refusals are recorded without waiting for fsync: nothing ran, and a
// flood of bad calls must not cost a flood of fsyncs.
func (s *Server) refuse(ctx context.Context, id any, hasID bool, rec audit.Record, decision, tag, msg, detail string) verdict {
	if !hasID {
		s.record(ctx, rec, decision, msg, detail)
		return verdict{}
	}
	return s.refuseWith(ctx, id, rec, decision, tag, msg, nil)
}

func (s *Server) refuseWith(ctx context.Context, id any, rec audit.Record, decision, tag, msg string, extra map[string]any) verdict {
	s.record(ctx, rec, decision, msg, "")
	return verdict{reply: rpcResult(id, errorResult(tag, msg, extra))}
}

func (s *Server) record(ctx context.Context, rec audit.Record, decision, msg, detail string) {
	rec.Decision = decision
	if rec.Reason == "" {
		rec.Reason = msg
	}
	if detail != "" {
		rec.Reason += ": " + detail
	}
	if err := s.audit.AppendLazy(ctx, rec); err != nil {
		s.log.Error("server: audit record of a refused call failed", "call", rec.CallID, "err", err)
	}
}

// refuseMalformed answers a message that failed strict decoding. If
// encoding/json (what mcp-go uses) would read it as a tools/call, it gets
// a tagged tool error and an audit record; otherwise a JSON-RPC error.
// Either way mcp-go never sees it.
func (s *Server) refuseMalformed(ctx context.Context, c *conn, raw []byte, cause error) verdict {
	var peek struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if err := json.Unmarshal(raw, &peek); err != nil {
		// Not even encoding/json can read it: its method does not count
		// (bytesContainsToolsCall below decides whether it is audited).
		peek.Method = ""
	}
	var id any
	if len(peek.ID) > 0 && (peek.ID[0] == '"' || peek.ID[0] == '-' || peek.ID[0] >= '0' && peek.ID[0] <= '9') {
		id = json.RawMessage(peek.ID)
	}
	if peek.Method == string(mcp.MethodToolsCall) || bytesContainsToolsCall(raw) {
		rec := audit.Record{Kind: audit.KindDecision, CallID: rand.Text(), Grant: c.grant.Name, Transport: c.transport, Tool: truncate(peek.Params.Name, 128)}
		rec.Reason = fmt.Sprintf("malformed tools/call of %d bytes", len(raw))
		msg := "rejected: " + truncate(cause.Error(), 200)
		if id == nil {
			s.record(ctx, rec, decisionInvalid, msg, "")
			return verdict{reply: rpcError(nil, mcp.INVALID_REQUEST, "invalid request: "+truncate(cause.Error(), 200))}
		}
		return s.refuseWith(ctx, id, rec, decisionInvalid, TagInvalid, msg, nil)
	}
	if id == nil {
		return verdict{reply: rpcError(nil, mcp.PARSE_ERROR, "parse error: "+truncate(cause.Error(), 200))}
	}
	return verdict{reply: rpcError(id, mcp.INVALID_REQUEST, "invalid request: "+truncate(cause.Error(), 200))}
}

// bytesContainsToolsCall is a conservative test for a message that may be
// a tools/call in some reader's eyes (escaped or oddly cased method names
// included): such a message is audited when it is refused.
func bytesContainsToolsCall(raw []byte) bool {
	const n = len("tools/call")
	for i := 0; i+n <= len(raw) && i < 1<<16; i++ {
		if (raw[i] == 't' || raw[i] == 'T') && equalFoldASCII(raw[i:i+n], "tools/call") {
			return true
		}
	}
	return false
}

func equalFoldASCII(b []byte, s string) bool {
	for i := range len(s) {
		c := b[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// park creates (or finds) a pending approval for the call (digest: its
// argsDigest) and refuses it.
func (s *Server) park(ctx context.Context, id any, rec audit.Record, d policy.Decision, tool, vm string, args map[string]any, digest string, now time.Time) verdict {
	ttl := DefaultApprovalTTL
	if d.Approval != nil && d.Approval.TTL > 0 {
		ttl = d.Approval.TTL
	}
	if d.Approval != nil && d.Approval.Channel != "" && d.Approval.Channel != "operator" {
		rec.Reason = "approval channel " + d.Approval.Channel + " is not available"
		return s.refuseWith(ctx, id, rec, policy.Deny.String(), TagDenied, "this call needs an approval through a channel this server does not offer", nil)
	}
	// An identical call already waiting reuses its approval; one an operator
	// denied is refused with the operator's reason until that approval expires.
	list, listErr := s.store.ListApprovals(ctx, now)
	if listErr == nil {
		for _, a := range list {
			if a.Grant != rec.Grant || a.Tool != tool || a.Digest != digest || !now.Before(a.Expires) {
				continue
			}
			switch a.State {
			case store.ApprovalPending:
				rec.ApprovalID = a.ID
				return s.approvalRequired(ctx, id, rec, a.ID)
			case store.ApprovalDenied:
				rec.ApprovalID, rec.Reason = a.ID, "approval denied by "+a.DecidedBy
				msg := fmt.Sprintf("approval id %s: %s denied this call", a.ID, a.DecidedBy)
				if a.Reason != "" {
					msg += ": " + a.Reason
				}
				return s.refuseWith(ctx, id, rec, policy.Deny.String(), TagDenied, msg, map[string]any{"approval_id": a.ID})
			}
		}
	}
	return s.parkNew(ctx, id, rec, list, listErr, tool, vm, args, digest, now, ttl) // approvals_full.go
}

func (s *Server) approvalRequired(ctx context.Context, id any, rec audit.Record, approvalID string) verdict {
	msg := fmt.Sprintf("approval id %s: an operator must approve this call (vmgate approvals grant %s); then retry the identical call", approvalID, approvalID)
	return s.refuseWith(ctx, id, rec, policy.Approve.String(), TagApproval, msg, map[string]any{"approval_id": approvalID})
}

// argsDigest is the SHA-256 of the canonical form of a call: the tool name
// and its validated arguments as JSON with sorted keys.
func argsDigest(tool string, args map[string]any) string {
	b, err := json.Marshal(struct {
		Tool string         `json:"tool"`
		Args map[string]any `json:"args"`
	}{tool, args})
	if err != nil {
		// Validated arguments always marshal; an impossible failure must
		// not collapse distinct calls into one digest.
		b = []byte(rand.Text())
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Call deadlines: vars so that tests can shorten them.
var (
	// callDeadline bounds every tool but vm_agent_exec.
	callDeadline = 60 * time.Second
	// execGrace is the room vm_agent_exec gets past its own timeout to
	// collect the output.
	execGrace = 15 * time.Second
)

// deadliner is an argument struct that sets its call's deadline
// (vm_agent_exec: its command's timeout plus execGrace).
type deadliner interface {
	deadline(l Limits) time.Duration
}

// deadline bounds a call's run time: what its arguments say (a command's
// own timeout plus room to collect its output), or a fixed bound.
func (t *toolSpec) deadline(l Limits, args any) time.Duration {
	if d, ok := args.(deadliner); ok {
		return d.deadline(l)
	}
	return callDeadline
}

// toolHandler is what mcp-go runs for spec: runTool.
func (s *Server) toolHandler(spec *toolSpec) mcpserver.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return s.runTool(ctx, spec, req), nil
	}
}

// runTool runs one call of spec, from mcp-go (toolHandler) or from handle
// (dispatch.go): only with the ticket the gate put in the context for
// exactly this call, which it claims.
func (s *Server) runTool(ctx context.Context, spec *toolSpec, req mcp.CallToolRequest) *mcp.CallToolResult {
	t, _ := ctx.Value(ticketKey).(*ticket)
	if t == nil || t.server != s || t.call.spec != spec || req.Params.Name != spec.name {
		s.log.Error("server: tool handler reached without a gate ticket", "tool", spec.name)
		return errorResult(TagDenied, "this call did not pass the policy gate", nil)
	}
	select {
	case <-t.claimed:
		s.log.Error("server: gate ticket used twice", "tool", spec.name, "call", t.call.id)
		return errorResult(TagDenied, "this call did not pass the policy gate", nil)
	default:
		close(t.claimed)
	}
	// The driver's work runs on the call's own context (deadline and all):
	// a cancelled request (notifications/cancelled, a client gone) ends it.
	defer context.AfterFunc(ctx, t.cancel)()
	if t.elicit != nil { // elicit_legacy.go: asks without any gate lock held
		if r, ok := s.elicitApproval(ctx, t); !ok {
			t.res = &r
			return r.mcp()
		}
	}
	stop := s.reportProgress(ctx, req, spec.name)
	defer stop()
	if t.call.wantsUndo() {
		if r := s.takeUndo(t.call); r != nil {
			*r = t.call.explain(*r)
			t.res = r
			return r.mcp()
		}
	}
	r := t.call.explain(t.call.withUndo(spec.run(s, t.call)))
	t.res = &r
	return r.mcp()
}

// filterTools hides from tools/list what the caller's policy hides.
func (s *Server) filterTools(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	c := connFrom(ctx)
	if c == nil {
		return nil
	}
	eng := s.policyOf(c.grant)
	if eng == nil {
		return nil
	}
	out := tools[:0:0]
	for _, t := range tools {
		if eng.Visible(t.Name) {
			out = append(out, t)
		}
	}
	return out
}

// JSON-RPC replies written by the gate itself.

type rpcErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func rpcError(id any, code int, msg string) []byte {
	b, _ := json.Marshal(struct {
		JSONRPC string       `json:"jsonrpc"`
		ID      any          `json:"id"`
		Error   rpcErrorBody `json:"error"`
	}{"2.0", id, rpcErrorBody{code, msg}})
	return b
}

func rpcResult(id any, r *mcp.CallToolResult) []byte {
	b, err := json.Marshal(struct {
		JSONRPC string              `json:"jsonrpc"`
		ID      any                 `json:"id"`
		Result  *mcp.CallToolResult `json:"result"`
	}{"2.0", id, r})
	if err != nil {
		return rpcError(id, mcp.INTERNAL_ERROR, "cannot encode the result")
	}
	return b
}
