package policy

import (
	"slices"
	"strings"
	"time"
)

// Undo snapshots. A tool block may say
//
//	"snapshot_before": true
//
// or, with a retention and conditions on the call (the same grammar as
// require and deny_if),
//
//	"snapshot_before": { "retention": "24h", "if": [ { "path": "args.command", "op": "contains", "value": "apt-get" } ] }
//
// and the server then takes a snapshot of the VM before the call runs,
// records its name in the audit log and the result, and deletes it when
// the retention is over. It belongs on the tools that can destroy a
// guest's state: SnapshotBeforeTools (vm_power takes it only before stop
// and reset, which the server decides; the policy's conditions narrow it
// further).

// SnapshotBeforeTools are the tools a snapshot_before block may be on.
func SnapshotBeforeTools() []string { return []string{"vm_power", "destroy_session", "vm_agent_exec"} }

// Retention bounds of an undo snapshot.
const (
	DefaultSnapshotRetention = 24 * time.Hour
	MaxSnapshotRetention     = 30 * 24 * time.Hour
)

// SnapshotBefore is a decision's request for an undo snapshot.
type SnapshotBefore struct {
	// Retention is how long the snapshot is kept.
	Retention time.Duration
	// Rule is the JSON pointer of the snapshot_before block.
	Rule string
}

// snapshotRule is a parsed snapshot_before block.
type snapshotRule struct {
	retention time.Duration
	when      []condition // all must hold; none: always
	ptr       string
}

// snapshotFor returns the snapshot a call gets, nil when the block does
// not apply to it.
func (r *snapshotRule) snapshotFor(call *Call, tr *[]Step) *SnapshotBefore {
	if r == nil {
		return nil
	}
	for i := range r.when {
		c := &r.when[i]
		if !c.eval(call) {
			if tr != nil {
				step(tr, "snapshot_before", c.ptr, "skip", c.src+": not met")
			}
			return nil
		}
	}
	if tr != nil {
		step(tr, "snapshot_before", r.ptr, "pass", "a snapshot is taken first, kept "+r.retention.String())
	}
	return &SnapshotBefore{Retention: r.retention, Rule: r.ptr}
}

// snapshotBefore parses a snapshot_before block of tool name.
func (b *builder) snapshotBefore(name string, n *node, l loc) *snapshotRule {
	if !slices.Contains(SnapshotBeforeTools(), name) {
		b.errorf(n.off, l.path, "snapshot_before belongs on %s, not on %s", strings.Join(SnapshotBeforeTools(), ", "), name)
		return nil
	}
	r := &snapshotRule{retention: DefaultSnapshotRetention, ptr: l.ptr}
	if n.kind == kindBool {
		if !n.b {
			return nil
		}
		return r
	}
	m, ok := b.object(n, l, "retention", "if")
	if !ok {
		return nil
	}
	if v, ok := m["retention"]; ok {
		lr := l.key("retention")
		if s, ok := b.str(v, lr); ok {
			d, err := time.ParseDuration(s)
			switch {
			case err != nil:
				b.errorf(v.off, lr.path, "bad duration %q (want a Go duration like \"24h\")", s)
			case d < time.Minute || d > MaxSnapshotRetention:
				b.errorf(v.off, lr.path, "retention %s is out of range (want 1m to %s)", d, MaxSnapshotRetention)
			default:
				r.retention = d
			}
		}
	}
	if v, ok := m["if"]; ok {
		r.when = b.conditions(v, l.key("if"))
	}
	return r
}

// Snapshots belong to the grant that made them (snapshot_create, or an
// undo snapshot of one of its calls). A "snapshots" block says what a
// grant may do beyond its own, and how many it may keep:
//
//	"snapshots": { "max_count": 4, "max_mb": 2048 }   // top level
//	"tools": { "snapshot_revert": { "snapshots": { "others": true } } }
//
// At the top level it bounds the grant's snapshots of each VM: at most
// max_count of them, holding at most max_mb MiB as the backend reports
// their sizes (QEMU: the saved memory; a backend that reports none counts
// 0). snapshot_create and the undo snapshots of snapshot_before count
// alike; the server prunes the grant's oldest undo snapshots of the VM to
// make room for a new one, never its other snapshots. On snapshot_revert
// and snapshot_delete, "others": true lets the tool act on snapshots that
// are not the grant's: another grant's, or ones made outside vmgate.
// Without it they are refused. Names starting with vmgate-undo are the
// server's alone whatever the policy says.

// OthersTools are the tools whose snapshots block may say others.
func OthersTools() []string { return []string{"snapshot_revert", "snapshot_delete"} }

// Bounds of the top-level snapshots block.
const (
	MaxSnapshotCount = 10_000
	MaxSnapshotMB    = 1 << 30 // 1 PiB: "no bound" is leaving the field out
)

// SnapshotRules is what a call may do with a VM's snapshots
// (Decision.Snapshots), set for the snapshot tools and the tools a
// snapshot_before block may be on; the zero value: no bounds, the grant's
// own snapshots only.
type SnapshotRules struct {
	// Others lets snapshot_revert or snapshot_delete act on a snapshot
	// the calling grant did not make.
	Others bool
	// MaxCount bounds the grant's snapshots of one VM; 0: no bound.
	MaxCount int64
	// MaxBytes bounds their total size; 0: no bound.
	MaxBytes int64
	// Rule is the JSON pointer of the top-level block ("" without one);
	// OthersRule that of the tool's block.
	Rule, OthersRule string
}

// snapshotLimits is a parsed top-level snapshots block.
type snapshotLimits struct {
	maxCount, maxBytes int64
	ptr                string
}

// snapshotRulesFor is the Decision.Snapshots of a call of tool under
// top-level block top and the tool's own rule t (either may be nil); the
// zero value for tools that neither take nor act on snapshots.
func snapshotRulesFor(top *snapshotLimits, t *toolRule, tool string) SnapshotRules {
	var r SnapshotRules
	if !strings.HasPrefix(tool, "snapshot_") && !slices.Contains(SnapshotBeforeTools(), tool) {
		return r
	}
	if top != nil {
		r.MaxCount, r.MaxBytes, r.Rule = top.maxCount, top.maxBytes, top.ptr
	}
	if t != nil && t.snapOthers {
		r.Others, r.OthersRule = true, t.snapOthersPtr
	}
	return r
}

// snapshotLimits parses the top-level snapshots block.
func (b *builder) snapshotLimits(n *node, l loc) *snapshotLimits {
	if n.kind == kindObject {
		if i := slices.Index(n.keys, "others"); i >= 0 {
			b.errorf(n.keyOffs[i], l.key("others").path, "others belongs in the snapshots block of %s, not at the top level", strings.Join(OthersTools(), " or "))
			return nil
		}
	}
	m, ok := b.object(n, l, "max_count", "max_mb")
	if !ok {
		return nil
	}
	r := &snapshotLimits{ptr: l.ptr}
	bound := func(key string, max int64) int64 {
		v, ok := m[key]
		if !ok {
			return 0
		}
		lk := l.key(key)
		x, ok := b.integer(v, lk)
		if ok && (x < 1 || x > max) {
			b.errorf(v.off, lk.path, "%s %d is out of range (want 1 to %d, or leave it out for no bound)", key, x, max)
			return 0
		}
		return x
	}
	r.maxCount = bound("max_count", MaxSnapshotCount)
	r.maxBytes = bound("max_mb", MaxSnapshotMB) << 20
	return r
}

// snapshotOthers parses the snapshots block of tool name.
func (b *builder) snapshotOthers(name string, n *node, l loc) bool {
	if !slices.Contains(OthersTools(), name) {
		b.errorf(n.off, l.path, "a snapshots block belongs on %s (others), or at the top level (max_count, max_mb); not on %s", strings.Join(OthersTools(), ", "), name)
		return false
	}
	m, ok := b.object(n, l, "others")
	if !ok {
		return false
	}
	v, ok := m["others"]
	if !ok {
		return false
	}
	if v.kind != kindBool {
		b.errorf(v.off, l.key("others").path, "want true or false, got %s", v.kind)
		return false
	}
	return v.b
}

// KeepFilesTool is the tool a keep_files setting belongs on: destroy_session
// then moves the session's files to a trash in the guest for that long
// (a Go duration, 1m to MaxKeepFiles), from which restore_session_files
// brings them back into a new session.
const KeepFilesTool = "destroy_session"

// MaxKeepFiles bounds keep_files: the server keeps a destroyed session's
// record (whose grant may restore its files) that long.
const MaxKeepFiles = 24 * time.Hour

// keepFiles parses a keep_files setting of tool name.
func (b *builder) keepFiles(name string, n *node, l loc) time.Duration {
	if name != KeepFilesTool {
		b.errorf(n.off, l.path, "keep_files belongs on %s, not on %s", KeepFilesTool, name)
		return 0
	}
	s, ok := b.str(n, l)
	if !ok {
		return 0
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		b.errorf(n.off, l.path, "bad duration %q (want a Go duration like \"1h\")", s)
	case d < time.Minute || d > MaxKeepFiles:
		b.errorf(n.off, l.path, "keep_files %s is out of range (want 1m to %s)", d, MaxKeepFiles)
	default:
		return d
	}
	return 0
}
