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
var SnapshotBeforeTools = []string{"vm_power", "destroy_session", "vm_agent_exec"}

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
	if !slices.Contains(SnapshotBeforeTools, name) {
		b.errorf(n.off, l.path, "snapshot_before belongs on %s, not on %s", strings.Join(SnapshotBeforeTools, ", "), name)
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
