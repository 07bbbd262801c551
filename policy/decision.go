// Package policy is vmgate's decision engine: it parses a policy document
// (a superset of PolicyLayer's format), compiles it once into an Engine, and
// decides each tool call. It is pure: no I/O, no clock of its own, no MCP
// types. Counters are only named here; reserving them is policy/store's job.
package policy

import "time"

// Call is one tool call as the engine sees it.
type Call struct {
	Grant     string // the identity making the call
	Transport string // "stdio" or "http"; informational
	Tool      string
	VM        string // "<backend>/<name>", empty for tools without a VM
	Session   string // the session argument, if any (a counter scope)
	// Args are the decoded JSON arguments (map[string]any, []any, string,
	// float64 or json.Number, bool, nil).
	Args map[string]any
}

// Verdict is the engine's answer.
type Verdict uint8

// The verdicts. RateLimited is produced by the caller (from a store
// reservation that failed) with Decision.Limited, never by Decide itself.
const (
	Deny Verdict = iota // the zero value denies: nothing fails open
	Allow
	Approve
	RateLimited
)

func (v Verdict) String() string {
	switch v {
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	case Approve:
		return "approve"
	case RateLimited:
		return "rate_limited"
	}
	return "unknown"
}

// Counter is one sliding-window budget a call must reserve before dispatch.
type Counter struct {
	// Key identifies the budget: the counter name plus the scope values
	// (for example "kill_process_rate|grant=alice"). Limits with the same
	// counter name and scope key share one budget across tools.
	Key    string
	Name   string        // the counter name from the document
	Window time.Duration // sliding window length
	Max    int64         // never more than Max reservations in any Window-long interval
	Rule   string        // JSON pointer of the limit, e.g. "/tools/kill_process/limits/0"
}

// ApprovalSpec says how a call that needs approval is approved.
type ApprovalSpec struct {
	Channel string        // "operator" (default) or "client"
	TTL     time.Duration // how long a granted approval stays usable
}

// Decision is what Decide returns.
type Decision struct {
	Verdict Verdict
	// Rule is the JSON pointer into the document of the rule that decided
	// (for example "/tools/vm_file_write/action" or "/default").
	Rule       string
	Reason     string
	RetryAfter time.Duration // for RateLimited
	// Counters are the budgets to reserve, all or none, before dispatch.
	// Set for Allow and for Approve (reserved once the approval is consumed).
	Counters []Counter
	// Quotas are the quotas a QuotaTool call holds while the VM it creates
	// lives, all or none (quota.go).
	Quotas []Quota
	// Lease bounds the lease of the VM a QuotaTool call creates; set for
	// every Allow and Approve of QuotaTool.
	Lease *LeaseSpec
	// Approval is set when Verdict is Approve.
	Approval *ApprovalSpec
	// Sandbox is the sandbox a create_session call gets: its sandbox
	// argument over the policy's (see SandboxTool); for vm_agent_exec, the
	// one-shot sandbox its command runs in (nil: none, or the session's;
	// see execsandbox.go). On a Deny for a looser sandbox it is what the
	// call asked for (what a shadow-mode caller runs).
	Sandbox *Sandbox
	// MaxTimeoutS is vm_agent_exec's max_timeout_s: the largest timeout_s
	// the grant's commands may ask for (up to MaxExecTimeoutS); 0 when the
	// policy sets none and the server's own cap applies.
	MaxTimeoutS int64
	// Files is what a vm_file_read or vm_file_write call may do with the
	// file its path names (the tool's files block, or DefaultFileRules);
	// nil for other tools. See FileRules.
	Files *FileRules
	// Snapshot, when set, asks the server to take an undo snapshot of the
	// VM before the call runs (the tool's snapshot_before block).
	Snapshot *SnapshotBefore
	// Snapshots are the grant's rules for a VM's snapshots (snapshots
	// blocks), for the snapshot tools and SnapshotBeforeTools; the zero
	// value for the others. See SnapshotRules.
	Snapshots SnapshotRules
	// KeepFiles is how long destroy_session keeps the session's files in
	// the guest's trash (keep_files); 0: they are removed.
	KeepFiles time.Duration
	// Shadow is true when the matched tool runs in shadow mode: Verdict is
	// what enforcement would have done; the caller audits it and allows.
	Shadow bool
}

// Limited turns d into the RateLimited decision for a reservation of c that
// the store refused, retryable after retry.
func (d Decision) Limited(c Counter, retry time.Duration) Decision {
	d.Verdict = RateLimited
	d.Rule = c.Rule
	d.Reason = "rate limit " + c.Name + " exceeded"
	d.RetryAfter = retry
	return d
}
