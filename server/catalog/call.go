package catalog

import (
	"context"
	"fmt"
	"maps"
	"path"
	"slices"
	"sync/atomic"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy"
)

// Call is one tools/call as its handler sees it: what the gate checked,
// resolved and decided, and nothing of the gate's own state (reservations,
// approvals, undo snapshots). The gate makes a Call for every call that
// passed it; a handler reads it and does not change it.
type Call struct {
	// Ctx is the call's context: its deadline and cancellation. The
	// driver's work runs on it.
	Ctx context.Context
	// ID is the call id of the call's audit records.
	ID        string
	Grant     Grant
	Transport string // "stdio" or "http"
	Tool      string
	// Args is the tool's argument struct (*A of NewTool), decoded once by
	// the gate; ArgMap the validated arguments as the policy saw them.
	Args   any
	ArgMap map[string]any
	// VM is the full id ("lab/vm1"), "" for a tool without one; Backend
	// and Name are its parts (Name as the driver takes it), Driver the
	// backend's driver.
	VM, Backend, Name string
	Driver            hypervisor.Driver
	// Rules are what the policy's decision says for the handler.
	Rules Rules
	// Progress takes what the handler reports of the call while it runs
	// (the latest line of a command's output): the gate's progress
	// notifications carry it when the client asked for them. Nil when it
	// did not; Report on a nil Progress does nothing.
	Progress *Progress
}

// Progress is what a running call last reported of itself: a line, and
// for a call that moves data, the bytes moved of how many. Safe for
// concurrent use; the zero value holds nothing (NewProgress's also wakes
// a reporter when bytes move).
type Progress struct {
	msg   atomic.Pointer[string]
	bytes atomic.Pointer[[2]int64] // done, total
	moved chan struct{}            // a token when bytes moved since the reporter last looked
}

// NewProgress is a Progress whose Moved channel says when bytes moved.
func NewProgress() *Progress { return &Progress{moved: make(chan struct{}, 1)} }

// Bytes reports that done of total bytes have moved (files, archives: as
// their pieces move). done should not decrease; a reporter sends only
// increases.
func (p *Progress) Bytes(done, total int64) {
	if p == nil {
		return
	}
	p.bytes.Store(&[2]int64{done, total})
	select {
	case p.moved <- struct{}{}:
	default:
	}
}

// Moved reports the bytes last reported; ok is false before any.
func (p *Progress) Moved() (done, total int64, ok bool) {
	if p == nil {
		return 0, 0, false
	}
	if b := p.bytes.Load(); b != nil {
		return b[0], b[1], true
	}
	return 0, 0, false
}

// Wake receives a token after Bytes (nil, never ready, for a zero Progress).
func (p *Progress) Wake() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.moved
}

// Report makes msg what the call's next progress notification says.
func (p *Progress) Report(msg string) {
	if p != nil {
		p.msg.Store(&msg)
	}
}

// Latest is what was reported last ("" for nothing).
func (p *Progress) Latest() string {
	if p == nil {
		return ""
	}
	if m := p.msg.Load(); m != nil {
		return *m
	}
	return ""
}

// Rules are the parts of a policy decision a handler reads.
type Rules struct {
	// Files are the file rules of the file tools (nil: the defaults).
	Files *policy.FileRules
	// Sandbox is the policy's sandbox for a create_session call, and for
	// a vm_agent_exec call the one-shot sandbox its command runs in (nil:
	// none, or its session's); nil for every other tool.
	Sandbox *policy.Sandbox
	// MaxTimeoutS is the policy's cap on vm_agent_exec's timeout_s; 0: the
	// server's (Limits.MaxTimeoutS).
	MaxTimeoutS int64
	// Snapshots say what a snapshot tool may touch, and the grant's bounds.
	Snapshots policy.SnapshotRules
	// KeepFiles is destroy_session's keep_files.
	KeepFiles time.Duration
	// Quotas and Lease are the policy's for a vm_create call.
	Quotas []policy.Quota
	Lease  *policy.LeaseSpec
	// Verdict and Rule are the call's own decision: an archive entry the
	// policy would send for approval under the same rule is covered by the
	// call's approval (tools/archive.go).
	Verdict policy.Verdict
	Rule    string
}

// FileRules are the call's file rules (the defaults for a decision without
// them).
func (c *Call) FileRules() policy.FileRules {
	if c.Rules.Files != nil {
		return *c.Rules.Files
	}
	return policy.DefaultFileRules()
}

// Grant is the caller as a handler sees it: its name and the VMs its vms
// globs let it see.
type Grant struct {
	Name string
	// VMs are path.Match globs over VM ids ("lab/*"); empty means every VM.
	VMs []string
}

// Sees reports whether g may see the VM id (its globs; a created VM of
// another grant is the lease keeper's to hide).
func (g Grant) Sees(id string) bool {
	if len(g.VMs) == 0 {
		return true
	}
	return slices.ContainsFunc(g.VMs, func(glob string) bool {
		ok, _ := path.Match(glob, id)
		return ok
	})
}

// Decider asks a grant's current policy about a call again, with args in
// place of the call's own arguments (a path as the guest resolved it, an
// entry of an archive); ok is false when the grant has no policy. The gate
// is the Decider of its Env.
type Decider interface {
	Decide(c *Call, args map[string]any) (d policy.Decision, ok bool)
}

// Redecide asks c's grant's policy again with real in place of the
// argument key as given ("path", or vm_agent_exec's "cwd"): the extension
// point for a handler that learns, in the guest, what a call really
// touches. Only an allow (or a shadow-mode decision) lets the call go on:
// an approval was for the value as given, not for where it leads. It
// returns the refusal, or nil.
func (e *Env) Redecide(c *Call, key, real string) *Result {
	args := maps.Clone(c.ArgMap)
	args[key] = real
	d, ok := e.Policy.Decide(c, args)
	if !ok {
		r := Failure(TagDenied, "this grant has no policy, so it can do nothing", true)
		return &r
	}
	what := "the path"
	if key != "path" {
		what = key
	}
	switch {
	case d.Shadow || d.Verdict == policy.Allow:
		e.Log.Info("server: path resolved through symlinks", "call", c.ID, key, c.ArgMap[key], "real", real, "shadow", d.Shadow)
		return nil
	case d.Verdict == policy.Approve:
		r := Failure(TagDenied, fmt.Sprintf("%s leads through symlinks to %s, which needs an approval of its own: call again with %s %q", what, real, key, real), true)
		return &r
	}
	why := d.Reason
	if why == "" {
		why = "the policy does not allow it"
	}
	r := Failure(TagDenied, fmt.Sprintf("%s leads through symlinks to %s, which the policy does not allow: %s", what, real, why), true)
	r.Detail = fmt.Sprintf("%s %v resolves to %s; rule %s: %s", key, c.ArgMap[key], real, d.Rule, d.Reason)
	return &r
}
