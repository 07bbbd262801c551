package libvirt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// execEntry is a command started by ExecStart whose timeout the driver enforces.
type execEntry struct {
	pid      int64
	deadline time.Time
	maxOut   int64
	timer    *time.Timer // guarded by the domain's mu

	// mu serialises ExecStatus and the watchdog on this command and guards final.
	mu    sync.Mutex
	final *hypervisor.ExecResult // collected by the watchdog, waiting for ExecStatus
}

// preflight checks (from cached guest-info) that the exec commands are enabled.
func (d *Driver) preflight(ctx context.Context, op string, s *domState) error {
	info, err := d.info(ctx, s, false)
	if err != nil {
		return agentError(op, err)
	}
	for _, c := range []string{"guest-exec", "guest-exec-status"} {
		if !info.Enabled(c) {
			return fmt.Errorf("libvirt: %s: %w", op, &hypervisor.CommandDisabledError{Command: c})
		}
	}
	return nil
}

// execRequest validates req and converts it.
func (d *Driver) execRequest(op string, req hypervisor.ExecRequest) (qga.ExecRequest, error) {
	bad := func(msg string) (qga.ExecRequest, error) {
		return qga.ExecRequest{}, fmt.Errorf("libvirt: %s: %w: %s", op, hypervisor.ErrInvalidArgument, msg)
	}
	switch {
	case len(req.Argv) == 0 || req.Argv[0] == "":
		return bad("empty argv")
	case req.Timeout < 0:
		return bad("negative timeout")
	case req.MaxOutputBytes < 0:
		return bad("negative max output bytes")
	case req.Cwd != "" && !path.IsAbs(req.Cwd):
		return bad("cwd must be absolute")
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = d.cfg.ExecTimeout
	}
	return qga.ExecRequest{
		Path:           req.Argv[0],
		Args:           req.Argv[1:],
		Env:            req.Env,
		Stdin:          req.Stdin,
		Cwd:            req.Cwd,
		Timeout:        timeout,
		MaxOutputBytes: req.MaxOutputBytes,
	}, nil
}

func execResult(s qga.ExecStatus) hypervisor.ExecResult {
	return hypervisor.ExecResult{
		PID: s.PID, Exited: s.Exited, ExitCode: s.ExitCode, Signal: s.Signal,
		Stdout: s.Stdout, Stderr: s.Stderr,
		StdoutTruncated: s.StdoutTruncated, StderrTruncated: s.StderrTruncated,
		TimedOut: s.TimedOut,
	}
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
	return execResult(st), nil
}

// execToken is the state ExecStatus needs, carried in ExecHandle.Token so a
// restarted driver can still poll (it then enforces an overdue timeout on
// the next poll rather than by a watchdog).
type execToken struct {
	PID      int64 `json:"pid"`
	Deadline int64 `json:"deadline"` // unix nanoseconds
	MaxOut   int64 `json:"max_out"`
}

func (t execToken) encode() string {
	b, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeToken(s string) (execToken, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return execToken{}, err
	}
	var t execToken
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return execToken{}, err
	}
	if dec.More() {
		return execToken{}, errors.New("trailing data")
	}
	if t.PID <= 0 || t.MaxOut < 0 || t.Deadline < 0 {
		return execToken{}, errors.New("bad values")
	}
	return t, nil
}

// ExecStart starts req and returns at once. The driver enforces req.Timeout:
// a watchdog kills the command when it fires, even if nobody polls.
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
	started := time.Now()
	pid, err := s.agent(d).ExecStart(ctx, qreq)
	if err != nil {
		return hypervisor.ExecHandle{}, agentError("exec start", err)
	}
	tok := execToken{PID: pid, Deadline: started.Add(qreq.Timeout).UnixNano(), MaxOut: qreq.MaxOutputBytes}
	e := &execEntry{pid: pid, deadline: time.Unix(0, tok.Deadline), maxOut: tok.MaxOut}
	s.mu.Lock()
	if s.execs == nil {
		s.execs = make(map[int64]*execEntry)
	}
	if old, ok := s.execs[pid]; ok {
		old.timer.Stop() // a reused pid: the old command was collected
	}
	s.execs[pid] = e
	e.timer = time.AfterFunc(qreq.Timeout, func() { d.watchdog(s, e) })
	s.mu.Unlock()
	return hypervisor.ExecHandle{PID: pid, Token: tok.encode(), StartedAt: started}, nil
}

// watchdog runs at a command's deadline: unless it already exited, it is
// killed; the final result is kept for the caller's next ExecStatus.
func (d *Driver) watchdog(s *domState, e *execEntry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.final != nil || !s.tracked(e) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := d.collect(ctx, s, e.pid, e.maxOut, true)
	if err != nil {
		d.log.Warn("exec timeout watchdog failed", "vm", s.name, "pid", e.pid, "err", err)
		return
	}
	e.final = &res
	s.mu.Lock()
	e.timer = time.AfterFunc(resultTTL, func() { s.untrack(e) })
	s.mu.Unlock()
}

func (s *domState) tracked(e *execEntry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.execs[e.pid] == e
}

func (s *domState) untrack(e *execEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.execs[e.pid] == e {
		delete(s.execs, e.pid)
		e.timer.Stop()
	}
}

// collect polls pid; when kill is set and it still runs, it kills it and
// waits for the final status (TimedOut set).
func (d *Driver) collect(ctx context.Context, s *domState, pid, maxOut int64, kill bool) (hypervisor.ExecResult, error) {
	a := s.agent(d)
	st, err := a.ExecStatus(ctx, pid, maxOut)
	if err != nil || st.Exited || !kill {
		return execResult(st), err
	}
	if err := a.Kill(ctx, pid); err != nil {
		return hypervisor.ExecResult{}, err
	}
	var b hypervisor.Backoff
	for {
		st, err := a.ExecStatus(ctx, pid, maxOut)
		if err != nil {
			return hypervisor.ExecResult{}, err
		}
		if st.Exited {
			res := execResult(st)
			res.TimedOut = true
			return res, nil
		}
		select {
		case <-ctx.Done():
			return hypervisor.ExecResult{}, ctx.Err()
		case <-time.After(b.Next()):
		}
	}
}

// ExecStatus polls a command started by ExecStart.
func (d *Driver) ExecStatus(ctx context.Context, name string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	s, err := d.lookup(ctx, "exec status", name)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	if h.PID <= 0 {
		return hypervisor.ExecResult{}, fmt.Errorf("libvirt: exec status: %w: pid %d", hypervisor.ErrInvalidArgument, h.PID)
	}
	tok := execToken{PID: h.PID}
	if h.Token != "" {
		if tok, err = decodeToken(h.Token); err != nil || tok.PID != h.PID {
			return hypervisor.ExecResult{}, fmt.Errorf("libvirt: exec status: %w: bad handle token", hypervisor.ErrInvalidArgument)
		}
	}
	s.mu.Lock()
	e := s.execs[h.PID]
	s.mu.Unlock()
	if e == nil {
		// Not started by this driver instance (or already collected).
		overdue := tok.Deadline != 0 && time.Now().After(time.Unix(0, tok.Deadline))
		res, err := d.collect(ctx, s, h.PID, tok.MaxOut, overdue)
		if err != nil {
			return hypervisor.ExecResult{}, agentError("exec status", err)
		}
		return res, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.final != nil {
		res := *e.final
		s.untrack(e)
		return res, nil
	}
	res, err := d.collect(ctx, s, e.pid, e.maxOut, time.Now().After(e.deadline))
	if err != nil {
		return hypervisor.ExecResult{}, agentError("exec status", err)
	}
	if res.Exited {
		s.untrack(e)
	}
	return res, nil
}
