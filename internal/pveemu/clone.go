package pveemu

import (
	"context"
	"strconv"
	"time"
)

// vmClone is qemu-server src/PVE/API2/Qemu.pm clone_vm: check_running, then
// $load_and_check before the qmclone task (named after the source vmid) and
// again in it; the new VM is locked 'clone' until the copy is done. Its Machine comes from
// Options.NewMachine; without one the clone is power-state only.
func (e *Emulator) vmClone(r *request) (any, *apiError) {
	v, err := e.assertOnNode(r)
	if err != nil {
		return nil, err
	}
	newid := int(intParam(r.params, "newid", 0))
	snapname, _ := strParam(r.params, "snapname")
	name, hasName := strParam(r.params, "name")
	target, _ := strParam(r.params, "target")
	if target == "" || target == "localhost" {
		target = scalar(r.params["node"])
	}
	loadAndCheck := func() *apiError {
		if !e.hasNode(target) {
			return die("no such cluster node '%s'", target)
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		v.mu.Lock()
		_, hasSnap := v.snapshots[snapname]
		v.mu.Unlock()
		if snapname != "" && !hasSnap {
			return die("snapshot '%s' does not exist", snapname)
		}
		if e.vmByID(newid) != nil {
			return die("unable to create VM %d: config file already exists", newid)
		}
		return nil
	}
	if err := loadAndCheck(); err != nil {
		return nil, err
	}
	v.mu.Lock()
	if !hasName {
		name = "Copy-of-VM-" + v.name
		if v.name == "" {
			name = "Copy-of-VM-" + strconv.Itoa(v.vmid)
		}
	}
	spec := VMSpec{VMID: newid, Node: target, Name: name, NoAgent: !v.agentOn, MemoryMB: v.memoryMB, Cores: v.cores}
	v.mu.Unlock()
	// "$newconf->{description} = $param->{description} if $param->{description}"
	description, _ := strParam(r.params, "description")
	return e.forkWorker(r, "qmclone", strconv.Itoa(v.vmid), func(t *task) *apiError {
		if err := loadAndCheck(); err != nil {
			return err
		}
		return e.cloneInto(spec, description)
	}), nil
}

// cloneInto is the qmclone task's copy: the new VM of spec, locked
// 'clone' until its machine (Options.NewMachine) is made; removed again
// when that fails.
func (e *Emulator) cloneInto(spec VMSpec, description string) *apiError {
	newid := spec.VMID
	nv := newVM(spec)
	nv.lock, nv.description = "clone", description
	e.mu.Lock()
	if e.vms[newid] != nil {
		e.mu.Unlock()
		return die("unable to create VM %d: config file already exists", newid)
	}
	e.vms[newid] = nv
	e.mu.Unlock()
	fail := func(msg string) *apiError {
		e.mu.Lock()
		delete(e.vms, newid)
		e.mu.Unlock()
		nv.close()
		return die("clone failed: %s", msg)
	}
	if e.opts.NewMachine != nil {
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
		m, err := e.opts.NewMachine(ctx, newid, spec.Name)
		cancel()
		if err != nil {
			return fail(err.Error())
		}
		nv.machine, nv.ownMachine = m, true
		if sock := m.AgentSocket(); sock != "" {
			nv.agent = newAgentClient(sock)
		}
	}
	nv.mu.Lock()
	nv.lock = ""
	nv.mu.Unlock()
	return nil
}

// vmDestroy is destroy_vm: $early_checks before the qmdestroy task and
// again in it under the config lock.
func (e *Emulator) vmDestroy(r *request) (any, *apiError) {
	if err := rootOnly(r, "skiplock"); err != nil {
		return nil, err
	}
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	early := func() *apiError {
		if v.machine.PID() != 0 {
			return die("VM %d is running - destroy failed", v.vmid)
		}
		return nil
	}
	if err := early(); err != nil {
		return nil, err
	}
	return e.forkWorker(r, "qmdestroy", strconv.Itoa(v.vmid), func(t *task) *apiError {
		v.cfgMu.Lock()
		defer v.cfgMu.Unlock()
		if err := early(); err != nil {
			return err
		}
		if err := v.checkLock(); err != nil {
			return err
		}
		e.mu.Lock()
		delete(e.vms, v.vmid)
		e.mu.Unlock()
		v.close()
		return nil
	}), nil
}
