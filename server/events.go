package server

import (
	"fmt"
	"slices"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
)

// The events the server logs to a client (notify.go sends them), each at
// one level; README ("Tools", "Operating") lists them:
//
//	notice   approval_pending   a call of this session was parked for an operator
//	notice   approval_granted   an operator granted a parked call of the grant
//	warning  approval_denied    an operator denied it
//	warning  plugin_exited      the driver plugin of a backend the grant sees died
//	notice   plugin_restarted   it was started again
//	error    plugin_restart_failed  starting it again failed (it is retried)
//	warning  lease_ending       a VM the grant created is deleted soon: its lease ends
//	warning  lease_ended        a VM the grant created was deleted: its lease ended
//	notice   policy_reloaded    the grant's policy changed what tools/list shows
//	info     policy_reloaded    the grant's policy changed, its tools did not
//
// A call's arguments appear only in approval_pending, redacted as the
// audit log keeps them (notifiedArgs); nothing else carries arguments.

// notifyParked tells the session of g's call that it waits for an
// operator's approval approvalID.
func (g *gating) notifyParked(approvalID string) {
	if g.conn.Session == "" {
		return
	}
	data := map[string]any{
		"event": "approval_pending", "approval_id": approvalID, "tool": g.spec.Name,
		"message": fmt.Sprintf("%s is parked until an operator decides on approval %s; once granted, retry the identical call", g.spec.Name, approvalID),
	}
	if g.rec.VM != "" {
		data["vm"] = g.rec.VM
	}
	if args := notifiedArgs(g.args); args != nil {
		data["arguments"] = args
	}
	g.s.logTo(g.conn.Session, logEvent{level: mcp.LoggingLevelNotice, data: data})
}

// notifyDecided tells the sessions of ap's grant what an operator decided.
func (s *Server) notifyDecided(ap store.Approval) {
	data := map[string]any{
		"event": "approval_" + string(ap.State), "approval_id": ap.ID, "tool": ap.Tool, "decided_by": ap.DecidedBy,
	}
	if ap.VM != "" {
		data["vm"] = ap.VM
	}
	if ap.Reason != "" {
		data["reason"] = ap.Reason
	}
	ev := logEvent{level: mcp.LoggingLevelWarning, data: data}
	switch ap.State {
	case store.ApprovalGranted:
		ev.level = mcp.LoggingLevelNotice
		data["expires"] = ap.Expires.UTC().Format(time.RFC3339)
		data["message"] = fmt.Sprintf("%s granted approval %s (%s): retry the identical call before %s", ap.DecidedBy, ap.ID, ap.Tool, data["expires"])
	case store.ApprovalDenied:
		data["message"] = fmt.Sprintf("%s denied approval %s (%s)", ap.DecidedBy, ap.ID, ap.Tool)
	default:
		return
	}
	s.logToGrant(ap.Grant, ev)
}

// notifyProcess tells the sessions of every grant that sees backend that
// its driver plugin exited, restarted or failed to restart.
func (s *Server) notifyProcess(backend string, pe hypervisor.ProcessEvent) {
	data := map[string]any{"backend": backend, "driver": pe.Driver, "restarts": pe.Restarts}
	ev := logEvent{data: data}
	switch pe.Kind {
	case hypervisor.ProcessExited:
		ev.level, data["event"] = mcp.LoggingLevelWarning, "plugin_exited"
		data["message"] = fmt.Sprintf("the driver plugin of backend %s exited; calls to its VMs fail until it is restarted (next try in %s)", backend, pe.RestartIn.Round(time.Millisecond))
	case hypervisor.ProcessRestarted:
		ev.level, data["event"] = mcp.LoggingLevelNotice, "plugin_restarted"
		data["message"] = fmt.Sprintf("the driver plugin of backend %s was restarted; a call that failed because it exited can be retried", backend)
	case hypervisor.ProcessRestartFailed:
		ev.level, data["event"] = mcp.LoggingLevelError, "plugin_restart_failed"
		data["message"] = fmt.Sprintf("the driver plugin of backend %s could not be restarted; it is tried again (next in %s); the operator's log says why", backend, pe.RestartIn.Round(time.Millisecond))
	default:
		return
	}
	for _, grant := range s.grantsSeeing(backend) {
		s.logToGrant(grant, ev)
	}
}

// notifyLeaseEnded tells the sessions of l's grant that the lease reaper
// deleted l's VM.
func (s *Server) notifyLeaseEnded(l store.Lease) {
	vm := leaseVM(l)
	msg := fmt.Sprintf("VM %s was deleted: its lease ended", vm)
	switch l.State {
	case store.LeaseLive:
		msg += " (it expired " + l.Expires.UTC().Format(time.RFC3339) + ")"
	case store.LeaseCreating:
		msg += " before the VM was ready (its creation did not finish)"
	default:
		msg += " (a deletion that had not finished was completed)"
	}
	s.logToGrant(l.Grant, logEvent{level: mcp.LoggingLevelWarning, data: map[string]any{
		"event": "lease_ended", "vm": vm, "template": l.Template, "message": msg,
	}})
}

// notifyLeaseEnding tells the sessions of l's grant that the reaper
// deletes l's VM in left (lease.EndingWarning before its expiry).
func (s *Server) notifyLeaseEnding(l store.Lease, left time.Duration) {
	vm := leaseVM(l)
	at := l.Expires.UTC().Format(time.RFC3339)
	s.logToGrant(l.Grant, logEvent{level: mcp.LoggingLevelWarning, data: map[string]any{
		"event": "lease_ending", "vm": vm, "template": l.Template, "expires": at, "left_s": int64(left.Round(time.Second) / time.Second),
		"message": fmt.Sprintf("VM %s will be deleted at %s (in %s): its lease ends then; copy out what you need before (vm_file_read, vm_archive_read)", vm, at, left.Round(time.Second)),
	}})
}

// leaseVM is the VM id l's events name: the backend's, else the name asked for.
func leaseVM(l store.Lease) string {
	if l.VM != "" {
		return l.VM
	}
	return l.Name
}

// notifyPolicy tells the sessions of grant that its policy changed from
// old to eng, and sends them tools/list_changed when what tools/list shows
// them changed.
func (s *Server) notifyPolicy(grant string, old, eng *policy.Engine) {
	if old != nil && old.Fingerprint() == eng.Fingerprint() {
		return
	}
	shown, hidden := []string{}, []string{}
	for _, t := range s.specs {
		was, is := old != nil && old.Visible(t.Name), eng.Visible(t.Name)
		switch {
		case is && !was:
			shown = append(shown, t.Name)
		case was && !is:
			hidden = append(hidden, t.Name)
		}
	}
	slices.Sort(shown)
	slices.Sort(hidden)
	data := map[string]any{"event": "policy_reloaded", "sha256": eng.Fingerprint(),
		"message": "the policy of this grant was reloaded; what it allows may have changed"}
	ev := logEvent{level: mcp.LoggingLevelInfo, data: data}
	if len(shown)+len(hidden) > 0 {
		ev.level = mcp.LoggingLevelNotice
		data["tools_shown"], data["tools_hidden"] = shown, hidden
		data["message"] = "the policy of this grant was reloaded and changed its tools; list them again"
	}
	s.logToGrant(grant, ev)
	if len(shown)+len(hidden) > 0 {
		s.toolsChanged(grant)
	}
}

// watchProcesses has the server told of the exits and restarts of every
// backend driver that runs in a process of its own.
func (s *Server) watchProcesses() {
	for name, d := range s.backends {
		if w, ok := d.(hypervisor.ProcessWatcher); ok {
			w.WatchProcess(func(pe hypervisor.ProcessEvent) { s.notifyProcess(name, pe) })
		}
	}
}
