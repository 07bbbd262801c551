package server

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/server/argview"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/jsonrpc"
)

// Approvals through the client (`approval.channel: client`).
//
// A call whose policy says approve with channel client is confirmed by the
// MCP client's user through elicitation, in the multi-round-trip form of
// protocol 2026-07-28 (SEP-2322): the gate answers the first call with an
// input_required result that asks for an elicitation and carries a request
// state; the client asks its user and retries the call with the answer and
// the state echoed back.
//
// The request state is HMAC-SHA256 protected with a key only this server
// process holds, and binds the grant, the tool, the digest of the
// arguments and an expiry; each state is accepted once. A tampered,
// expired, replayed or foreign state, a decline, a cancel, any answer but
// an explicit approve, and a client that did not declare the elicitation
// capability all mean deny.
//
// Clients older than 2026-07-28 that declared the elicitation capability
// at initialize are asked in the 2025-06-18 way instead: the call goes on
// through the gate (reservation, decision record) and its tool handler
// sends an elicitation/create request to the client and waits for the
// answer within the call's deadline before anything runs (see
// elicit_legacy.go).

// approvalIDClient is the approval id of audit records of calls the
// client's user approved (or is asked to approve).
const approvalIDClient = "client"

// elicitInputID is the key of the one input request the gate asks for.
const elicitInputID = "approval"

// Param keys of a multi-round-trip retry.
const (
	paramRequestState   = "requestState"
	paramInputResponses = "inputResponses"
)

// clientApprovalTTL bounds how long a client's user may take to answer
// when the policy gives no ttl.
const clientApprovalTTL = 5 * time.Minute

// elicitStates signs and opens request states: its HMAC key is random per
// server, so a state never outlives the server that issued it, and it
// remembers the states accepted until they expire (each is single-use).
// Safe for concurrent use; mu guards used.
type elicitStates struct {
	key  []byte
	mu   sync.Mutex
	used map[string]time.Time // by nonce: when the state expires
}

func newElicitStates() *elicitStates {
	k := make([]byte, 32)
	rand.Read(k)
	return &elicitStates{key: k, used: map[string]time.Time{}}
}

// elicitState is what a request state binds.
type elicitState struct {
	Grant   string `json:"g"`
	Tool    string `json:"t"`
	Digest  string `json:"d"`
	Expires int64  `json:"e"` // unix seconds
	Nonce   string `json:"n"`
}

// ErrBadRequestState: a request state that is malformed, forged, expired,
// bound to another call, or already used.
var ErrBadRequestState = errors.New("invalid request state")

// sign is st as a request state.
func (es *elicitStates) sign(st elicitState) string {
	payload, _ := json.Marshal(st)
	m := hmac.New(sha256.New, es.key)
	m.Write(payload)
	enc := base64.RawURLEncoding
	return enc.EncodeToString(payload) + "." + enc.EncodeToString(m.Sum(nil))
}

// open verifies s for the call (grant, tool, digest) at now and marks it
// used.
func (es *elicitStates) open(s, grant, tool, digest string, now time.Time) (elicitState, error) {
	enc := base64.RawURLEncoding
	p, sig, ok := strings.Cut(s, ".")
	if !ok || len(s) > 4096 {
		return elicitState{}, fmt.Errorf("%w: malformed", ErrBadRequestState)
	}
	payload, err1 := enc.DecodeString(p)
	mac, err2 := enc.DecodeString(sig)
	if err1 != nil || err2 != nil {
		return elicitState{}, fmt.Errorf("%w: malformed", ErrBadRequestState)
	}
	m := hmac.New(sha256.New, es.key)
	m.Write(payload)
	if !hmac.Equal(mac, m.Sum(nil)) {
		return elicitState{}, fmt.Errorf("%w: not issued by this server", ErrBadRequestState)
	}
	var st elicitState
	if err := json.Unmarshal(payload, &st); err != nil {
		return elicitState{}, fmt.Errorf("%w: malformed", ErrBadRequestState)
	}
	if st.Grant != grant || st.Tool != tool || st.Digest != digest {
		return elicitState{}, fmt.Errorf("%w: issued for another call", ErrBadRequestState)
	}
	exp := time.Unix(st.Expires, 0)
	if !now.Before(exp) {
		return elicitState{}, fmt.Errorf("%w: expired", ErrBadRequestState)
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	for n, e := range es.used {
		if !now.Before(e) {
			delete(es.used, n)
		}
	}
	if _, used := es.used[st.Nonce]; used {
		return elicitState{}, fmt.Errorf("%w: already used", ErrBadRequestState)
	}
	es.used[st.Nonce] = exp
	return st, nil
}

// isClientChannel reports whether d asks the client for approval.
func isClientChannel(d policy.Decision) bool {
	return d.Verdict == policy.Approve && d.Approval != nil && d.Approval.Channel == "client"
}

// hasRoundTrip reports whether params carry a multi-round-trip retry.
func hasRoundTrip(params map[string]any) bool {
	_, s := params[paramRequestState]
	_, r := params[paramInputResponses]
	return s || r
}

// modernClient reads the 2026-07-28 request _meta: whether the request is
// modern and whether its client declared elicitation.
func modernClient(params map[string]any) (modern, elicitation bool) {
	meta, _ := params["_meta"].(map[string]any)
	v, _ := meta[mcp.MetaKeyProtocolVersion].(string)
	if !mcp.IsModernProtocol(v) {
		return false, false
	}
	caps, _ := meta[mcp.MetaKeyClientCapabilities].(map[string]any)
	_, elicitation = caps["elicitation"]
	return true, elicitation
}

// maxApprovalMessage bounds the message of a client approval. The agent's
// own client shows it, and a client may show a long message in a small
// dialog, or cut it; arguments that do not fit in full are not asked
// about at all (errArgsTooLong): the call is refused, and the operator
// channel shows any size.
const maxApprovalMessage = 8 << 10

// errArgsTooLong: a call's arguments do not fit in full in the message of
// a client approval.
var errArgsTooLong = errors.New("the arguments are too long to show in full")

// approvalRequest is the elicitation that asks the client's user to
// approve one call of tool on vm with args. The message shows every
// argument in full, stdin, file content and env values included, each on
// a line of its own in argview's one-line view (the operator's escapes,
// and line breaks, tabs, odd spaces and runs of spaces made visible), so
// that nothing the call runs with is cut or hidden; or, if that takes more
// than maxApprovalMessage, errArgsTooLong.
func approvalRequest(tool, vm string, args map[string]any) (mcp.ElicitationParams, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return mcp.ElicitationParams{}, fmt.Errorf("client approval: arguments: %w", err)
	}
	if len(raw) > maxApprovalMessage {
		return mcp.ElicitationParams{}, fmt.Errorf("%w: %d bytes of arguments", errArgsTooLong, len(raw))
	}
	fields, err := argview.InlineFields(string(raw))
	if err != nil {
		return mcp.ElicitationParams{}, fmt.Errorf("client approval: arguments: %w", err)
	}
	var b strings.Builder
	where := ""
	if vm != "" {
		where, _ = argview.Inline(" on " + vm)
	}
	fmt.Fprintf(&b, "vmgate: the agent wants to run %s%s, once, with these %d arguments, each shown in full. Approve only if every one is what you expect.\n", tool, where, len(fields))
	b.WriteString("Shown as escapes: characters that would not print as themselves (\\x1b, \\u{202e}), line breaks (\\n) and tabs (\\t); ⟦N spaces⟧ is a run of N spaces.\n")
	for _, f := range fields {
		name, _ := argview.Inline(f.Name)
		fmt.Fprintf(&b, "- %s (%s): %s\n", name, aboutField(f), f.Value)
	}
	if b.Len() > maxApprovalMessage {
		return mcp.ElicitationParams{}, fmt.Errorf("%w: %d bytes shown", errArgsTooLong, b.Len())
	}
	return mcp.ElicitationParams{
		Message: strings.TrimSuffix(b.String(), "\n"),
		RequestedSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"approve": map[string]any{"type": "boolean", "title": "Approve", "description": "Run " + tool + " once with these arguments"},
			},
			"required": []string{"approve"},
		},
	}, nil
}

// aboutField says what kind of value f is, its size and its escapes.
func aboutField(f argview.Field) string {
	about := fmt.Sprintf("%s, %d bytes", f.Kind, f.Bytes)
	if f.Kind == argview.KindHex {
		about = fmt.Sprintf("binary, %d bytes in hex", f.Bytes)
	}
	if f.Escaped > 0 {
		about += fmt.Sprintf(", %d shown as escapes or ⟦…⟧", f.Escaped)
	}
	return about
}

// refuseTooLong is the answer to g's call, whose arguments do not fit in a
// client approval.
func (g *gating) refuseTooLong(err error) verdict {
	g.rec.Reason = "client approval: " + err.Error()
	tool := g.spec.Name
	return g.s.refuse(g.ctx, g.ID, g.rec, denied(fmt.Sprintf(
		"this call needs your user's approval, and its arguments are too long to show in full in an approval request through the client (%v; at most %d bytes): nothing ran. "+
			"Send it with shorter arguments (a large file in parts: vm_file_write with offset or append), or ask the operator to set approval channel \"operator\" for %s, where every argument is shown in full whatever its size",
		err, maxApprovalMessage, tool)))
}

// approvalTTL is how long the client's user may take to answer: the
// policy's ttl, at most clientApprovalTTL.
func approvalTTL(d policy.Decision) time.Duration {
	if d.Approval != nil && d.Approval.TTL > 0 && d.Approval.TTL < clientApprovalTTL {
		return d.Approval.TTL
	}
	return clientApprovalTTL
}

// approved reports whether an elicitation answer is an explicit approve:
// action accept with content {"approve": true}. Anything else is not.
func approved(action string, content any) bool {
	c, _ := content.(map[string]any)
	return action == string(mcp.ElicitationResponseActionAccept) && c["approve"] == true
}

// approveByClient handles g's call, whose policy asks the client for
// approval. It returns done=false when the call may go on: approved by the
// user of a 2026-07-28 client, or (ask set) to be asked through
// elicitation/create by its handler; else the verdict to answer with.
func (g *gating) approveByClient() (v verdict, ask *clientAsk, done bool) {
	s, rec, d, params, now := g.s, &g.rec, g.decision, g.params, g.start
	tool, vm, args := g.spec.Name, g.call.VM, g.args
	digest := argsDigest(tool, args)
	deny := func(reason, msg string) (verdict, *clientAsk, bool) {
		rec.Reason = reason
		return s.refuse(g.ctx, g.ID, *rec, denied(msg)), nil, true
	}
	modern, elicitation := modernClient(params)
	if !modern {
		if hasRoundTrip(params) {
			return deny("client approval: requestState from a client older than protocol 2026-07-28",
				"requestState and inputResponses are answers of 2026-07-28 clients; the call is refused")
		}
		// Asked by the handler (elicit_legacy.go), which knows the session
		// and whether its client declared elicitation at initialize.
		req, err := approvalRequest(tool, vm, args)
		if err != nil {
			return g.refuseTooLong(err), nil, true
		}
		rec.Reason = "asking the client's user through elicitation/create"
		rec.ApprovalID = approvalIDClient
		return verdict{}, &clientAsk{params: req, ttl: approvalTTL(d)}, false
	}
	if !elicitation {
		return deny("client approval: the client has no elicitation capability",
			"this call needs the approval of your user, and this client cannot ask (no elicitation capability); the call is refused")
	}
	if !hasRoundTrip(params) {
		req, err := approvalRequest(tool, vm, args)
		if err != nil {
			return g.refuseTooLong(err), nil, true
		}
		st := elicitState{Grant: rec.Grant, Tool: tool, Digest: digest, Expires: now.Add(approvalTTL(d)).Unix(), Nonce: rand.Text()}
		res := mcpserver.NewInputRequestBuilder(s.elicitStates.sign(st)).Elicit(elicitInputID, req).ToolResult()
		rec.Reason = "asked the client's user"
		s.record(g.ctx, *rec, refusal{decision: policy.Approve.String(), msg: "approval requested through elicitation"})
		return verdict{reply: jsonrpc.ResultReply(g.ID, res)}, nil, true
	}
	state, _ := params[paramRequestState].(string)
	if _, err := s.elicitStates.open(state, rec.Grant, tool, digest, now); err != nil {
		return deny("client approval: "+err.Error(), "the approval state is invalid, expired, already used or for another call; call again to be asked anew")
	}
	responses, _ := params[paramInputResponses].(map[string]any)
	answer, _ := responses[elicitInputID].(map[string]any)
	action, _ := answer["action"].(string)
	if !approved(action, answer["content"]) {
		if action == "" {
			action = "no answer"
		}
		return deny("client approval: "+catalog.Truncate(action, 20), "your user did not approve this call ("+catalog.Truncate(action, 20)+")")
	}
	rec.Reason = "approved by the client's user through elicitation"
	rec.ApprovalID = approvalIDClient
	return verdict{}, nil, false
}
