package pveemu

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/internal/qmp"
)

// The power methods follow qemu-server src/PVE/API2/Qemu.pm (vm_start,
// vm_stop, vm_shutdown, vm_reboot, vm_reset) and the functions they run in
// the worker, src/PVE/QemuServer.pm (vm_start, _do_vm_stop, vm_reboot,
// vm_reset).

// rootOnly is the handlers' "Only root may use this option." check: an API
// token is never root@pam.
func rootOnly(r *request, names ...string) *apiError {
	for _, n := range names {
		if boolParam(r.params, n, false) {
			return paramExc(map[string]string{n: "Only root may use this option."})
		}
	}
	return nil
}

// monQMP is PVE::QemuServer::Monitor::mon_cmd for the QMP peer: "VM N not
// running" when QEMU is not, "VM N qmp command 'X' failed - DESC" for an
// error reply or a timeout. timeout 0 means QMPClient's default of 5 s.
func (e *Emulator) monQMP(ctx context.Context, v *vm, command string, args any, timeout time.Duration) (json.RawMessage, *apiError) {
	if v.machine.PID() == 0 {
		return nil, die("VM %d not running", v.vmid)
	}
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var raw json.RawMessage
	err := v.withMonitor(cctx, func() (err error) {
		raw, err = v.machine.QMP(cctx, command, args)
		return err
	})
	if err != nil {
		var qe *qmp.Error
		reason := "got timeout"
		switch {
		case errors.Is(err, errMonitorBusy):
			return nil, die("unable to connect to VM %d qmp socket - timeout after 10 retries", v.vmid)
		case errors.As(err, &qe):
			reason = qe.Desc
		case cctx.Err() == nil:
			reason = err.Error()
		}
		return nil, die("VM %d qmp command '%s' failed - %s", v.vmid, command, reason)
	}
	return raw, nil
}

// checkLock is PVE::AbstractConfig::check_lock.
func (v *vm) checkLock() *apiError {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.lock != "" {
		return die("VM is locked (%s)", v.lock)
	}
	return nil
}

// paused is PVE::QemuServer::vm_is_paused($vmid, 1).
func (e *Emulator) paused(ctx context.Context, v *vm) bool {
	raw, err := e.monQMP(ctx, v, "query-status", nil, 0)
	if err != nil {
		return false
	}
	var st struct {
		Status string `json:"status"`
	}
	json.Unmarshal(raw, &st)
	return st.Status == "paused" || st.Status == "prelaunch" || st.Status == "suspended"
}

// vmStart is vm_start: the config is loaded in the qmstart worker, under
// the config lock (QemuServer.pm vm_start), so a VM whose config is not on
// the node fails the task, not the call.
func (e *Emulator) vmStart(r *request) (any, *apiError) {
	if err := rootOnly(r, "skiplock"); err != nil {
		return nil, err
	}
	vmid, node := vmParams(r)
	return e.forkWorker(r, "qmstart", strconv.Itoa(vmid), func(t *task) *apiError {
		v := e.vmByID(vmid)
		if err := e.lockOn(v, node, vmid, noConfig); err != nil {
			return err
		}
		defer v.cfgMu.Unlock()
		return e.startLocked(v)
	}), nil
}

// startVM is PVE::QemuServer::vm_start under the config lock.
func (e *Emulator) startVM(v *vm) *apiError {
	v.cfgMu.Lock()
	defer v.cfgMu.Unlock()
	return e.startLocked(v)
}

// startLocked is vm_start's work once the config is loaded (lock held).
func (e *Emulator) startLocked(v *vm) *apiError {
	v.mu.Lock()
	template := v.template
	v.mu.Unlock()
	if template {
		return die("you can't start a vm if it's a template")
	}
	if err := v.checkLock(); err != nil {
		return err
	}
	if v.machine.PID() != 0 {
		return die("VM %d already running", v.vmid)
	}
	return e.launch(v)
}

// launch is vm_start_nolock's start of QEMU (config lock held).
func (e *Emulator) launch(v *vm) *apiError {
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if err := v.machine.Launch(ctx); err != nil {
		return die("start failed: %v", err)
	}
	v.mu.Lock()
	v.started = time.Now()
	v.mu.Unlock()
	return nil
}

// vmStop is vm_stop: vm_stop's lock_config, then _do_vm_stop's
// check_running, which asserts the config is on the node, in the worker.
func (e *Emulator) vmStop(r *request) (any, *apiError) {
	if err := rootOnly(r, "skiplock", "keepActive"); err != nil {
		return nil, err
	}
	vmid, node := vmParams(r)
	timeout := time.Duration(intParam(r.params, "timeout", -1)) * time.Second
	return e.forkWorker(r, "qmstop", strconv.Itoa(vmid), func(t *task) *apiError {
		v := e.vmByID(vmid)
		if err := e.lockOn(v, node, vmid, notOnNode); err != nil {
			return err
		}
		defer v.cfgMu.Unlock()
		return e.doStop(t, v, timeout, false, true)
	}), nil
}

// vmShutdown is vm_shutdown: vm_is_paused looks at the VM first (its
// assert_config_exists_on_node only warns), then the worker as vm_stop's.
func (e *Emulator) vmShutdown(r *request) (any, *apiError) {
	if err := rootOnly(r, "skiplock", "keepActive"); err != nil {
		return nil, err
	}
	vmid, node := vmParams(r)
	force := boolParam(r.params, "forceStop", false)
	shutdown := true
	// Sending a graceful shutdown to a paused VM runs into timeouts.
	if v := e.vmAt(vmid, node); v != nil && e.paused(r.ctx, v) {
		if !force {
			return nil, die("VM is paused - cannot shutdown")
		}
		shutdown = false
	}
	timeout := time.Duration(intParam(r.params, "timeout", -1)) * time.Second
	return e.forkWorker(r, "qmshutdown", strconv.Itoa(vmid), func(t *task) *apiError {
		v := e.vmByID(vmid)
		if err := e.lockOn(v, node, vmid, notOnNode); err != nil {
			return err
		}
		defer v.cfgMu.Unlock()
		return e.doStop(t, v, timeout, shutdown, force)
	}), nil
}

// vmReboot is vm_reboot: vm_is_paused, then check_running (the config must
// be on the node) before the worker; QemuServer.pm vm_reboot checks again
// under the lock.
func (e *Emulator) vmReboot(r *request) (any, *apiError) {
	vmid, node := vmParams(r)
	v := e.vmAt(vmid, node)
	if v != nil && e.paused(r.ctx, v) {
		return nil, die("VM is paused - cannot shutdown")
	}
	if v == nil {
		return nil, notOnNode(node, vmid)
	}
	if v.machine.PID() == 0 {
		return nil, die("VM %d not running", v.vmid)
	}
	timeout := time.Duration(intParam(r.params, "timeout", -1)) * time.Second
	return e.forkWorker(r, "qmreboot", strconv.Itoa(v.vmid), func(t *task) *apiError {
		if err := e.lockOn(v, node, vmid, notOnNode); err != nil {
			return err
		}
		if v.machine.PID() == 0 { // only reboot if running
			v.cfgMu.Unlock()
			return nil
		}
		err := e.doStop(t, v, timeout, true, false)
		v.cfgMu.Unlock()
		if err != nil {
			return err
		}
		// qmeventd sees the QEMU exit and the reboot request and starts
		// the VM again (pve-manager's qmeventd, `qm cleanup`).
		e.wg.Go(func() {
			if err := e.startVM(v); err != nil {
				e.log.Warn("pveemu: restart after reboot failed", "vmid", v.vmid, "err", err.msg)
			}
		})
		return nil
	}), nil
}

// vmReset is vm_reset: check_running before the worker, then
// QemuServer.pm vm_reset's lock_config and load_config in it.
func (e *Emulator) vmReset(r *request) (any, *apiError) {
	if err := rootOnly(r, "skiplock"); err != nil {
		return nil, err
	}
	v, err := e.assertOnNode(r)
	if err != nil {
		return nil, err
	}
	if v.machine.PID() == 0 {
		return nil, die("VM %d not running", v.vmid)
	}
	_, node := vmParams(r)
	return e.forkWorker(r, "qmreset", strconv.Itoa(v.vmid), func(t *task) *apiError {
		if err := e.lockOn(v, node, v.vmid, noConfig); err != nil {
			return err
		}
		defer v.cfgMu.Unlock()
		if err := v.checkLock(); err != nil {
			return err
		}
		_, err := e.monQMP(e.ctx, v, "system_reset", nil, 0)
		return err
	}), nil
}

// doStop is PVE::QemuServer::_do_vm_stop (the config lock held): nothing to
// do when QEMU is not running; otherwise a graceful shutdown (guest-shutdown
// through the agent when it is configured and answers, else ACPI
// system_powerdown) or QMP quit, then up to timeout (default 60 s) for QEMU
// to exit, then SIGTERM when forced (else "got timeout"), then after 10 s
// SIGKILL. Upstream checks once a second; the emulator checks more often.
func (e *Emulator) doStop(t *task, v *vm, timeout time.Duration, shutdown, force bool) *apiError {
	if v.machine.PID() == 0 {
		return nil
	}
	if err := v.checkLock(); err != nil {
		return err
	}
	var err *apiError
	if shutdown {
		v.mu.Lock()
		agentOn := v.agentOn
		v.mu.Unlock()
		if agentOn && e.qgaRunning(e.ctx, v) {
			err = e.guestShutdown(v, timeout)
		} else {
			_, err = e.monQMP(e.ctx, v, "system_powerdown", nil, 0)
		}
	} else {
		_, err = e.monQMP(e.ctx, v, "quit", nil, 60*time.Second)
	}
	if err != nil {
		if v.machine.PID() == 0 {
			t.warn("Unexpected: VM shutdown command failed, but VM not running anymore..")
			return nil
		}
		if !force {
			return die("VM quit/powerdown failed")
		}
		t.warn("VM quit/powerdown failed - terminating now with SIGTERM")
		v.machine.Signal(syscall.SIGTERM)
	} else {
		if timeout < 0 {
			timeout = 60 * time.Second
		}
		if e.waitStopped(v, timeout) {
			return nil
		}
		if !force {
			return die("VM quit/powerdown failed - got timeout")
		}
		t.warn("VM still running - terminating now with SIGTERM")
		v.machine.Signal(syscall.SIGTERM)
	}
	if !e.waitStopped(v, 10*time.Second) {
		t.warn("VM still running - terminating now with SIGKILL")
		v.machine.Signal(syscall.SIGKILL)
		e.waitStopped(v, time.Second)
	}
	return nil
}

// waitStopped waits up to d for QEMU to exit.
func (e *Emulator) waitStopped(v *vm, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for v.machine.PID() != 0 {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-e.ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	return true
}
