package mcphttp

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/jsonrpc"
)

// The request budget of the streamable HTTP transport: every authenticated
// request (initialize, tools/list, a tools/call, a notification, a GET
// stream, a DELETE) takes one unit of its grant's budget, at most
// Options.RequestsPerMinute in any minute (a sliding, exact window,
// like the policy's limits). A request over the budget is refused before
// anything else is done for it: a tools/call gets a [RATE LIMITED] tool
// result, anything else a JSON-RPC error, with HTTP status 429 and
// Retry-After.
//
// Why a config limit and not a policy limit: the budget protects the
// server process (its memory, its CPU, its audit log), not a guest, so it
// counts in the process's memory, costs no store round trip and writes no
// audit record (a flood of refusals must not become a flood of disk
// writes, just as 401s are not audited); a tools/call within the budget
// still goes through the policy and its all_tools limits, which are exact
// across replicas. The refusals are logged, once per grant and window.

// DefaultRequestsPerMinute is the per-grant request budget of a config
// that sets none: room for an agent's bursts (20 requests per second
// sustained), far below what a flood sends.
const DefaultRequestsPerMinute = 1200

// budgetWindow is the window of the request budget.
const budgetWindow = time.Minute

// codeRateLimited is the JSON-RPC error code of a request refused by the
// budget (in the range JSON-RPC leaves to implementations).
const codeRateLimited = -32029

// requestBudget holds every grant's sliding window. Concurrency: mu
// guards grants and every window in it.
type requestBudget struct {
	mu sync.Mutex
	// grants holds, per grant, the times of its last requests.
	grants map[string]*budgetRing
}

// budgetRing holds the times (unix nanoseconds) of the last admitted
// requests of a grant, at most max of them; once it holds max, it is a ring
// whose oldest entry is at next.
type budgetRing struct {
	at      []int64
	next    int
	refused int       // refusals since the last log line
	logged  time.Time // when the last refusal was logged
}

func newRequestBudget() *requestBudget {
	return &requestBudget{grants: map[string]*budgetRing{}}
}

// take admits one request of grant (whose budget is max per window) at
// now, or says how long until one would be admitted. logNow is set on the first refusal of a window (the
// caller logs it, with the number refused since the last line).
func (b *requestBudget) take(grant string, max int, now time.Time) (retry time.Duration, ok bool, logNow bool, refused int) {
	t := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.grants[grant]
	if r == nil {
		r = &budgetRing{}
		b.grants[grant] = r
	}
	if len(r.at) < max {
		// Not full yet: the ring grows to the most requests a window held
		// (oldest first, so next stays 0 until it is full).
		r.at = append(r.at, t)
		return 0, true, false, 0
	}
	if free := r.at[r.next] + int64(budgetWindow); free > t {
		r.refused++
		if now.Sub(r.logged) >= budgetWindow {
			logNow, refused = true, r.refused
			r.logged, r.refused = now, 0
		}
		return time.Duration(free - t), false, logNow, refused
	}
	r.at[r.next] = t
	r.next = (r.next + 1) % len(r.at)
	return 0, true, false, 0
}

// admit takes one unit of c's budget, before anything of r's body is
// read. It answers r and returns false when the budget is spent: a POST as
// a JSON-RPC reply (read from its body when that holds at most
// bodyPeekBytes: a tools/call then gets a tool result), anything else as
// text.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, c *server.Conn) bool {
	s := h.s
	limit := h.opts.RequestsPerMinute
	if c.Grant.RequestsPerMinute > 0 {
		limit = c.Grant.RequestsPerMinute
	}
	retry, ok, logNow, refused := h.budget.take(c.Grant.Name, limit, s.Now())
	if ok {
		return true
	}
	if logNow {
		s.Logger().Warn("server: http: grant over its request budget; requests refused",
			"grant", c.Grant.Name, "per_minute", limit, "refused_since_last_log", refused)
	}
	secs := max(int64(math.Ceil(retry.Seconds())), 1)
	msg := fmt.Sprintf("grant %s sent more than %d requests in a minute: retry in %d s", c.Grant.Name, limit, secs)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	if r.Method != http.MethodPost {
		httpError(w, http.StatusTooManyRequests, catalog.TagRateLimited+" "+msg)
		return false
	}
	defer lingerBody(w, r) // what is left of the body is not read
	var peek struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if b := peekBody(r); b != nil {
		_ = json.Unmarshal(b, &peek)
	}
	var id any
	if jsonrpc.ValidRawID(peek.ID) {
		id = peek.ID
	}
	w.Header().Set("Content-Type", "application/json")
	if peek.Method == string(mcp.MethodToolsCall) && id != nil {
		// A tool error, as the policy's own rate limits answer: the agent
		// reads it where it reads every other refusal.
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(jsonrpc.ResultReply(id, catalog.ErrorResult(catalog.TagRateLimited, msg, map[string]any{"retry_after_s": secs})))
		return false
	}
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(jsonrpc.ErrorDataReply(id, codeRateLimited, catalog.TagRateLimited+" "+msg, map[string]any{"retry_after_s": secs}))
	return false
}
