package pveemu

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The snapshot methods follow qemu-server src/PVE/API2/Qemu.pm (snapshot_list,
// snapshot, rollback, delsnapshot) and pve-guest-common
// src/PVE/AbstractConfig.pm (snapshot_create, snapshot_rollback,
// snapshot_delete). What is real: the snapshot tree in the VM config, the
// locks, the tasks and their errors, and for a snapshot with vmstate the
// whole guest state (RAM, so every file of the lab guest, which runs from
// RAM) saved and restored through QMP snapshot-save/snapshot-load in a qcow2
// image added to the running QEMU. A snapshot without vmstate snapshots the
// VM's disks upstream; the lab guest has none, so it records the config only
// and a rollback to it leaves the VM stopped (as upstream), to boot afresh.

// snapshotList is "snapshot_list": every snapshot, then "current".
func (e *Emulator) snapshotList(r *request) (any, *apiError) {
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	names := make([]string, 0, len(v.snapshots))
	for n := range v.snapshots {
		names = append(names, n)
	}
	sort.Strings(names)
	out := []map[string]any{}
	for _, n := range names {
		s := v.snapshots[n]
		item := map[string]any{"name": n, "snaptime": s.snaptime, "vmstate": b2i(s.vmstate), "description": s.description}
		if s.parent != "" {
			item["parent"] = s.parent
		}
		out = append(out, item)
	}
	sum := sha1.Sum([]byte(fmt.Sprintf("%d %s %v %s %d", v.vmid, v.name, names, v.parent, v.memoryMB)))
	cur := map[string]any{"name": "current", "digest": hex.EncodeToString(sum[:]), "running": b2i(v.machine.PID() != 0),
		"description": "You are here!"}
	if v.parent != "" {
		cur["parent"] = v.parent
	}
	return append(out, cur), nil
}

// snapshotCreate is "snapshot": the reserved names are refused at once; the
// rest runs in a qmsnapshot task.
func (e *Emulator) snapshotCreate(r *request) (any, *apiError) {
	name, _ := strParam(r.params, "snapname")
	if name == "current" {
		return nil, die("unable to use snapshot name 'current' (reserved name)")
	}
	if strings.ToLower(name) == "pending" {
		return nil, die("unable to use snapshot name 'pending' (reserved name)")
	}
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	vmstate := boolParam(r.params, "vmstate", false)
	desc, _ := strParam(r.params, "description")
	return e.forkWorker(r, "qmsnapshot", strconv.Itoa(v.vmid), func(t *task) *apiError {
		return e.createSnapshot(v, name, desc, vmstate)
	}), nil
}

// createSnapshot is AbstractConfig::snapshot_create: prepare under the
// config lock (lock 'snapshot', snapstate 'prepare'), save the state, commit.
func (e *Emulator) createSnapshot(v *vm, name, desc string, vmstate bool) *apiError {
	v.cfgMu.Lock()
	v.mu.Lock()
	switch {
	case v.template:
		v.mu.Unlock()
		v.cfgMu.Unlock()
		return die("you can't take a snapshot if it's a template")
	case v.lock != "":
		lock := v.lock
		v.mu.Unlock()
		v.cfgMu.Unlock()
		return die("VM is locked (%s)", lock)
	case v.snapshots[name] != nil:
		v.mu.Unlock()
		v.cfgMu.Unlock()
		return die("snapshot name '%s' already used", name)
	}
	running := v.machine.PID() != 0
	// $save_vmstate = 0 if !$snap->{vmstate}: only a running VM saves RAM.
	vmstate = vmstate && running
	v.lock = "snapshot"
	v.snapshots[name] = &snapshot{name: name, description: desc, parent: v.parent, snaptime: time.Now().Unix(), vmstate: vmstate}
	v.mu.Unlock()
	v.cfgMu.Unlock()

	var serr *apiError
	if vmstate {
		serr = e.withSnapshotter(v, func(ctx context.Context, s Snapshotter) error { return s.SaveState(ctx, name) })
	}
	v.cfgMu.Lock()
	defer v.cfgMu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.lock = ""
	if serr != nil {
		delete(v.snapshots, name)
		return die("%s", strings.TrimSuffix(serr.msg, "\n"))
	}
	v.parent = name
	return nil
}

// withSnapshotter runs f on the machine's Snapshotter holding the monitor.
func (e *Emulator) withSnapshotter(v *vm, f func(ctx context.Context, s Snapshotter) error) *apiError {
	s, ok := v.machine.(Snapshotter)
	if !ok {
		return die("snapshot feature is not available")
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Minute)
	defer cancel()
	if err := v.withMonitor(ctx, func() error { return f(ctx, s) }); err != nil {
		return die("VM %d qmp command failed - %v", v.vmid, err)
	}
	return nil
}

// snapshotRollback is "rollback": start needs VM.PowerMgmt; the rest runs in
// a qmrollback task.
func (e *Emulator) snapshotRollback(r *request) (any, *apiError) {
	start := boolParam(r.params, "start", false)
	if start {
		if err := e.check(r.token, "/vms/"+scalar(r.params["vmid"]), "VM.PowerMgmt"); err != nil {
			return nil, err
		}
	}
	v, err := e.loadVM(r)
	if err != nil {
		return e.failedWorker(r, "qmrollback", err), nil
	}
	name, _ := strParam(r.params, "snapname")
	return e.forkWorker(r, "qmrollback", strconv.Itoa(v.vmid), func(t *task) *apiError {
		if err := e.rollback(t, v, name); err != nil {
			return err
		}
		if start && v.machine.PID() == 0 {
			return e.startVM(v)
		}
		return nil
	}), nil
}

// rollback is AbstractConfig::snapshot_rollback: check, stop the VM
// (__snapshot_rollback_vm_stop), lock 'rollback', apply, then with vmstate
// start it from the saved state (__snapshot_rollback_vm_start).
func (e *Emulator) rollback(t *task, v *vm, name string) *apiError {
	v.cfgMu.Lock()
	defer v.cfgMu.Unlock()
	v.mu.Lock()
	snap := v.snapshots[name]
	template, lock := v.template, v.lock
	v.mu.Unlock()
	switch {
	case template:
		return die("you can't rollback if vm is a template")
	case snap == nil:
		return die("snapshot '%s' does not exist", name)
	case lock != "":
		return die("VM is locked (%s)", lock)
	}
	if err := e.doStop(t, v, -1, false, true); err != nil {
		return err
	}
	if v.machine.PID() != 0 {
		return die("unable to rollback vm %d: vm is running", v.vmid)
	}
	v.mu.Lock()
	v.lock = "rollback"
	v.mu.Unlock()
	defer func() {
		v.mu.Lock()
		v.lock = ""
		v.parent = name
		v.mu.Unlock()
	}()
	if !snap.vmstate {
		return nil
	}
	if err := e.launch(v); err != nil {
		return err
	}
	return e.withSnapshotter(v, func(ctx context.Context, s Snapshotter) error { return s.LoadState(ctx, name) })
}

// snapshotDelete is "delsnapshot": a qmdelsnapshot task.
func (e *Emulator) snapshotDelete(r *request) (any, *apiError) {
	v, err := e.loadVM(r)
	if err != nil {
		return e.failedWorker(r, "qmdelsnapshot", err), nil
	}
	name, _ := strParam(r.params, "snapname")
	force := boolParam(r.params, "force", false)
	return e.forkWorker(r, "qmdelsnapshot", strconv.Itoa(v.vmid), func(t *task) *apiError {
		return e.deleteSnapshot(v, name, force)
	}), nil
}

// deleteSnapshot is AbstractConfig::snapshot_delete: lock 'snapshot-delete',
// remove the state, re-parent the children, drop the entry.
func (e *Emulator) deleteSnapshot(v *vm, name string, force bool) *apiError {
	v.cfgMu.Lock()
	defer v.cfgMu.Unlock()
	v.mu.Lock()
	snap := v.snapshots[name]
	lock := v.lock
	v.mu.Unlock()
	if snap == nil {
		return die("snapshot '%s' does not exist", name)
	}
	if lock != "" && !force {
		return die("VM is locked (%s)", lock)
	}
	v.mu.Lock()
	v.lock = "snapshot-delete"
	v.mu.Unlock()
	var derr *apiError
	if snap.vmstate {
		if v.machine.PID() != 0 {
			derr = e.withSnapshotter(v, func(ctx context.Context, s Snapshotter) error { return s.DeleteState(ctx, name) })
		} else if lm, ok := v.machine.(*LabMachine); ok {
			file := filepath.Join(lm.dir, "pveemu-state.qcow2")
			if out, err := exec.Command("qemu-img", "snapshot", "-d", name, file).CombinedOutput(); err != nil {
				derr = die("%s", strings.TrimSpace(string(out)))
			}
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.lock = ""
	if derr != nil && !force {
		return derr
	}
	for _, s := range v.snapshots {
		if s.parent == name {
			s.parent = snap.parent
		}
	}
	if v.parent == name {
		v.parent = snap.parent
	}
	delete(v.snapshots, name)
	return nil
}
