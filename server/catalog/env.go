package catalog

import (
	"log/slog"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/lease"
)

// Env is what every handler may use besides its call: the server's caps
// and timeouts, its clock and logger, the drivers, the state the tools keep
// between calls, and the policy (through Redecide). The gate builds one at
// New; handlers never see the gate itself.
//
// Concurrency: an Env is shared by every call. Its fields are set before
// the first call and not changed after; each service is safe for
// concurrent use.
type Env struct {
	Limits   Limits
	Timeouts Timeouts
	Now      func() time.Time
	Log      *slog.Logger
	// Backends are the drivers by backend name (list_vms walks them all;
	// a call's own is Call.Driver).
	Backends map[string]hypervisor.Driver
	// Guest is vmgate-guest: its helpers and the session store (guest.go).
	Guest *Guest
	// Execs are the commands started with wait: false (exectable.go).
	Execs *ExecTable
	// Snapshots keeps who made each snapshot, and the bounds (snapowners.go).
	Snapshots *SnapOwners
	// Leases are the created VMs (vm_create); nil without a lease store.
	Leases *lease.Keeper
	// Templates are what vm_create makes VMs from, by name.
	Templates map[string]*config.Template
	// Policy answers Redecide: the gate, with each grant's current policy.
	Policy Decider
}

// Timeouts bound how long a call runs (its Call.Ctx), by what it does.
type Timeouts struct {
	// Call bounds every tool without a deadline of its own.
	Call time.Duration
	// ExecGrace is the room vm_agent_exec gets past its own timeout to
	// collect the output.
	ExecGrace time.Duration
	// Snapshot bounds a snapshot call: saving or loading a VM's memory
	// takes longer than the other tools.
	Snapshot time.Duration
	// Create bounds vm_create: a TCG guest on a loaded machine may take
	// minutes to boot.
	Create time.Duration
	// Undo is added to the deadline of a call that takes an undo snapshot
	// first (the gate's, server/undo.go).
	Undo time.Duration
}

// DefaultTimeouts are the timeouts of a server that sets none.
func DefaultTimeouts() Timeouts {
	return Timeouts{
		Call:      60 * time.Second,
		ExecGrace: 15 * time.Second,
		Snapshot:  10 * time.Minute,
		Create:    lease.CreateDeadline,
		Undo:      10 * time.Minute,
	}
}

// WithDefaults is t with DefaultTimeouts in place of every value not set.
func (t Timeouts) WithDefaults() Timeouts {
	d := DefaultTimeouts()
	for _, p := range []struct{ v, def *time.Duration }{
		{&t.Call, &d.Call}, {&t.ExecGrace, &d.ExecGrace}, {&t.Snapshot, &d.Snapshot}, {&t.Create, &d.Create}, {&t.Undo, &d.Undo},
	} {
		if *p.v <= 0 {
			*p.v = *p.def
		}
	}
	return t
}
