package virtualbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// execEntry is a command started by ExecStart: a goroutine owns its
// VBoxManage process.
type execEntry struct {
	vm     string
	pid    int64
	run    *running
	cancel context.CancelFunc
	done   chan struct{} // closed when the result is in

	// res and err are set before done is closed.
	res hypervisor.ExecResult
	err error
	// expires is guarded by Driver.mu.
	expires time.Time
}

// ExecStart starts req in a VBoxManage process owned by the driver and
// returns once the pid is known: it comes with the first block of
// VBoxManage's verbose text (its wait loop fills one within a moment), or
// at the end of a short command.
func (d *Driver) ExecStart(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	const op = "exec start"
	if err := d.checkName(op, vm); err != nil {
		return hypervisor.ExecHandle{}, err
	}
	if err := checkRequest(req); err != nil {
		return hypervisor.ExecHandle{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	d.mu.Lock()
	d.expireLocked()
	full, closed := len(d.execs) >= MaxExecs, d.closed
	d.mu.Unlock()
	switch {
	case closed:
		return hypervisor.ExecHandle{}, fmt.Errorf("virtualbox: %s: driver closed", op)
	case full:
		return hypervisor.ExecHandle{}, fmt.Errorf("virtualbox: %s: %d commands already tracked; poll or wait for them", op, MaxExecs)
	}
	stdinPath, ver, err := d.prepare(ctx, op, vm, req)
	if err != nil {
		return hypervisor.ExecHandle{}, err
	}
	started := time.Now()
	e, err := d.launch(ctx, op, vm, d.spec(req, stdinPath, d.cwdOption(vm, ver)), ver)
	if errors.Is(err, errCwdUnsupported) {
		d.noteNoCwd(vm)
		e, err = d.launch(ctx, op, vm, d.spec(req, stdinPath, false), ver)
	}
	if err != nil {
		return hypervisor.ExecHandle{}, err
	}
	var kb [16]byte
	rand.Read(kb[:])
	key := hex.EncodeToString(kb[:])
	d.mu.Lock()
	d.execs[key] = e
	d.mu.Unlock()
	return hypervisor.ExecHandle{PID: e.pid, Token: key, StartedAt: started}, nil
}

// launch starts s and waits for its pid. The process outlives this call:
// its context is the driver's, bounded by the command's own timeout plus a
// margin.
func (d *Driver) launch(ctx context.Context, op, vm string, s runSpec, ver vboxVersion) (*execEntry, error) {
	rctx, cancel := context.WithTimeout(context.Background(), s.timeout+backstop+time.Minute)
	r, err := d.startRun(rctx, vm, s, ver)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	e := &execEntry{vm: vm, run: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		<-r.done
		e.res, e.err = r.result("exec", s.limit)
		e.err = d.disabledOrUnavailable(context.Background(), "exec", vm, e.err)
		cancel()
		d.mu.Lock()
		e.expires = time.Now().Add(ResultTTL)
		d.mu.Unlock()
		close(e.done)
	}()
	e.pid = r.waitPID(ctx)
	if ctx.Err() != nil {
		cancel()
		<-e.done
		return nil, ctxError(op, ctx.Err())
	}
	if e.pid == 0 {
		<-e.done
		if e.err != nil {
			return nil, e.err
		}
		return nil, fmt.Errorf("virtualbox: %s: VBoxManage reported no pid", op)
	}
	return e, nil
}

// expireLocked drops finished results nobody collected in time.
func (d *Driver) expireLocked() {
	now := time.Now()
	for k, e := range d.execs {
		if !e.expires.IsZero() && now.After(e.expires) {
			delete(d.execs, k)
		}
	}
}

// ExecStatus reads the state of a command started by ExecStart. Once the
// final result was returned the handle is forgotten.
func (d *Driver) ExecStatus(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	const op = "exec status"
	if err := d.checkName(op, vm); err != nil {
		return hypervisor.ExecResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return hypervisor.ExecResult{}, ctxError(op, err)
	}
	d.mu.Lock()
	d.expireLocked()
	e := d.execs[h.Token]
	d.mu.Unlock()
	if e == nil || e.vm != vm || e.pid != h.PID {
		// Tell an unknown VM from an unknown handle.
		if _, err := d.showVMInfo(ctx, op, vm); err != nil {
			return hypervisor.ExecResult{}, err
		}
		return hypervisor.ExecResult{}, fmt.Errorf("virtualbox: %s: %w: pid %d", op, hypervisor.ErrUnknownExec, h.PID)
	}
	select {
	case <-e.done:
	default:
		return hypervisor.ExecResult{PID: e.pid}, nil
	}
	d.mu.Lock()
	delete(d.execs, h.Token)
	d.mu.Unlock()
	return e.res, e.err
}
