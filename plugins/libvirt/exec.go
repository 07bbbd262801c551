package libvirt

import (
	"context"
	"fmt"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/agentexec"
)

// preflight checks (from cached guest-info) that the exec commands are enabled.
func (d *Driver) preflight(ctx context.Context, op string, s *domState) error {
	info, err := d.info(ctx, s, false)
	if err != nil {
		return agentError(op, err)
	}
	if err := agentexec.CheckEnabled(info); err != nil {
		return fmt.Errorf("libvirt: %s: %w", op, err)
	}
	return nil
}

// execRequest validates req and converts it.
func (d *Driver) execRequest(op string, req hypervisor.ExecRequest) (qga.ExecRequest, error) {
	q, err := agentexec.Request(req, d.cfg.ExecTimeout)
	if err != nil {
		return q, fmt.Errorf("libvirt: %s: %w", op, err)
	}
	return q, nil
}

// Run runs req to completion with qga.Agent's exec logic (adaptive polling,
// timeout and kill), every agent command going through libvirt.
func (d *Driver) Run(ctx context.Context, name string, req hypervisor.ExecRequest) (hypervisor.ExecResult, error) {
	s, err := d.lookup(ctx, "exec", name)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	qreq, err := d.execRequest("exec", req)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	if err := d.preflight(ctx, "exec", s); err != nil {
		return hypervisor.ExecResult{}, err
	}
	st, err := s.agent(d).Exec(ctx, qreq)
	if err != nil {
		return hypervisor.ExecResult{}, agentError("exec", err)
	}
	return agentexec.Result(st), nil
}

// ExecStart starts req and returns at once. The driver enforces req.Timeout:
// a watchdog kills the command's tree when it fires, even if nobody polls.
func (d *Driver) ExecStart(ctx context.Context, name string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	s, err := d.lookup(ctx, "exec start", name)
	if err != nil {
		return hypervisor.ExecHandle{}, err
	}
	qreq, err := d.execRequest("exec start", req)
	if err != nil {
		return hypervisor.ExecHandle{}, err
	}
	if err := d.preflight(ctx, "exec start", s); err != nil {
		return hypervisor.ExecHandle{}, err
	}
	h, err := d.execs.Start(ctx, s.name, s.agent(d), qreq)
	if err != nil {
		return hypervisor.ExecHandle{}, agentError("exec start", err)
	}
	return h, nil
}

// ExecStatus polls a command started by ExecStart.
func (d *Driver) ExecStatus(ctx context.Context, name string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	s, err := d.lookup(ctx, "exec status", name)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	res, err := d.execs.Status(ctx, s.name, s.agent(d), h)
	if err != nil {
		return hypervisor.ExecResult{}, agentError("exec status", err)
	}
	return res, nil
}
