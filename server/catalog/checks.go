package catalog

import "time"

// The optional capabilities of an argument struct, which the gate asks
// before the policy decides or the call runs.

// ArgChecker is an argument struct with a rule the catalogue cannot
// express (a snapshot name's grammar, an argument that excludes another):
// the gate refuses a call whose check fails before the policy sees it, so
// it parks no approval and reserves nothing.
type ArgChecker interface {
	CheckArgs() error
}

// Completer is an argument struct that checks the arguments against the
// server's own state (what the catalogue cannot know) and fills in
// defaults, in the struct and in valid (what the policy decides on and the
// audit log records), before the policy decides. An error is the
// argument's refusal.
type Completer interface {
	Complete(e *Env, valid map[string]any) error
}

// Deadliner is an argument struct that sets its call's deadline
// (vm_agent_exec: its command's timeout plus Timeouts.ExecGrace).
type Deadliner interface {
	Deadline(e *Env) time.Duration
}

// Undoable is the argument struct of a tool a policy's snapshot_before may
// apply to (policy.SnapshotBeforeTools): UndoApplies says whether this
// call is one that can destroy guest state (vm_power only for stop and
// reset).
type Undoable interface {
	UndoApplies() bool
}

// Check runs the checks of typed (t's decoded arguments, whose validated
// form is valid) that need no guest: ArgChecker, then Completer.
func (t *Tool) Check(e *Env, typed any, valid map[string]any) error {
	if ck, ok := typed.(ArgChecker); ok {
		if err := ck.CheckArgs(); err != nil {
			return err
		}
	}
	if cp, ok := typed.(Completer); ok {
		return cp.Complete(e, valid)
	}
	return nil
}

// Deadline bounds a call's run time: what its arguments say (a command's
// own timeout plus room to collect its output), or Timeouts.Call.
func (t *Tool) Deadline(e *Env, args any) time.Duration {
	if d, ok := args.(Deadliner); ok {
		return d.Deadline(e)
	}
	return e.Timeouts.Call
}

// UndoApplies reports whether args (a decoded argument struct) belong to a
// call a snapshot_before applies to.
func UndoApplies(args any) bool {
	u, ok := args.(Undoable)
	return ok && u.UndoApplies()
}

// Foreseer is an argument struct whose call may be known not to succeed
// before it runs: the session it names is already destroyed, the snapshot
// it names is not there. The gate asks it before it parks the call for an
// operator's approval, so that nobody is asked to approve what cannot
// succeed. Foresee only reads (c.Ctx is bounded by the gate) and returns
// the call's answer only when it is certain; nil when the call may
// succeed, or when it cannot tell (a store or backend that does not
// answer): then the call is parked as usual.
type Foreseer interface {
	Foresee(e *Env, c *Call) *Result
}
