package pveemu

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Migration follows qemu-server src/PVE/API2/Qemu.pm migrate_vm (the
// method's checks, then a qmigrate worker task on the source node) and the
// worker's PVE::QemuMigrate->migrate, which is pve-guest-common
// src/PVE/AbstractMigrate.pm migrate running qemu-server
// src/PVE/QemuMigrate.pm's prepare, phase1, phase2 (a running VM only) and
// phase3_cleanup under the VM's config lock (lock_vm).
//
// What moves is the config (AbstractConfig move_config_to_node in
// phase3_cleanup): from then on the VM is on the target node, and a request
// for it on the source finds no config. The emulated nodes share this host,
// so a running VM's QEMU (the lab VM behind it) runs on through an online
// migration, as the guest does on the target after a real one; no memory is
// copied and there is no downtime. Storage is not emulated (no local disks
// to copy, no storage checks), nor are replication and HA (never managed).

// migrateRoute is migrate_vm's registration: VM.Migrate on the VM,
// proxied to the source node.
func (e *Emulator) migrateRoute() route {
	return route{method: "POST", path: "/nodes/{node}/qemu/{vmid}/migrate", perm: vmPerm("VM.Migrate"), proxyto: true,
		schema: schema{props: map[string]prop{"node": optNode, "vmid": optVMID,
			"target":               {typ: "string", format: "pve-node"},
			"online":               {typ: "boolean", optional: true},
			"force":                {typ: "boolean", optional: true},
			"migration_type":       {typ: "string", optional: true, enum: []string{"secure", "insecure"}},
			"migration_network":    {typ: "string", optional: true},
			"with-local-disks":     {typ: "boolean", optional: true},
			"targetstorage":        {typ: "string", optional: true},
			"bwlimit":              {typ: "integer", optional: true, minimum: num(0)},
			"with-conntrack-state": {typ: "boolean", optional: true},
		}},
		run: (*Emulator).vmMigrate}
}

// vmMigrate is migrate_vm's code: the target must be another member and the
// cluster quorate; force, migration_type and migration_network are root's
// (an API token is never root@pam); the config must be on the node and
// unlocked; a running VM needs online (a stopped one ignores it).
func (e *Emulator) vmMigrate(r *request) (any, *apiError) {
	vmid, node := vmParams(r)
	target, _ := strParam(r.params, "target")
	if target == node {
		return nil, paramExc(map[string]string{"target": "target is local node."})
	}
	if !e.quorate() {
		return nil, die("cluster not ready - no quorum?") // PVE::Cluster::check_cfs_quorum
	}
	if !e.hasNode(target) {
		return nil, die("no such cluster node '%s'", target) // PVE::Cluster::check_node_exists
	}
	if err := rootOnly(r, "force"); err != nil {
		return nil, err
	}
	for _, p := range []string{"migration_type", "migration_network"} {
		if s, _ := strParam(r.params, p); s != "" {
			return nil, paramExc(map[string]string{p: "Only root may use this option."})
		}
	}
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	if err := v.checkLock(); err != nil {
		return nil, err
	}
	online := boolParam(r.params, "online", false)
	if v.machine.PID() != 0 {
		if !online {
			return nil, die("can't migrate running VM without --online")
		}
	} else {
		online = false // "VM isn't running. Doing offline migration instead."
	}
	// guest_migration_lock (PVE::GuestHelpers) is folded into the config
	// lock the worker takes.
	return e.forkWorker(r, "qmigrate", strconv.Itoa(vmid), func(t *task) *apiError {
		return e.migrate(t, v, node, target, online)
	}), nil
}

// migrate is AbstractMigrate::migrate: the phases, then "migration
// finished successfully" or, for an error, "migration aborted" as the
// task's exit status with the reason in the log.
func (e *Emulator) migrate(t *task, v *vm, source, target string, online bool) *apiError {
	start := time.Now()
	err := e.migratePhases(t, v, source, target, online)
	d := time.Since(start)
	dur := fmt.Sprintf("%02d:%02d:%02d", int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)
	if err != nil {
		migLog(t, "err", "migration aborted (duration %s): %s", dur, strings.TrimSuffix(err.msg, "\n"))
		return die("migration aborted")
	}
	migLog(t, "info", "migration finished successfully (duration %s)", dur)
	return nil
}

// migratePhases runs under lock_vm (the config lock): prepare, phase1,
// phase2 when the VM runs, phase3_cleanup.
func (e *Emulator) migratePhases(t *task, v *vm, source, target string, online bool) *apiError {
	if err := e.lockOn(v, source, v.vmid, noConfig); err != nil {
		return err // prepare's load_config: the VM left meanwhile
	}
	defer v.cfgMu.Unlock()
	// prepare
	if err := v.checkLock(); err != nil {
		return err
	}
	running := v.machine.PID() != 0
	if running && !online {
		return die("can't migrate running VM without --online")
	}
	if !e.nodeOnline(target) {
		// The ssh test (rem_ssh /bin/true) cannot reach the target.
		return die("Can't connect to destination address using public key")
	}
	// phase1: the migrate lock in the config.
	migLog(t, "info", "starting migration of VM %d to node '%s' (%s)", v.vmid, target, e.nodeIP(target))
	v.mu.Lock()
	v.lock = "migrate"
	v.mu.Unlock()
	if running {
		// phase2 with the default secure (unix socket) migration.
		uri := fmt.Sprintf("unix:/run/qemu-server/%d.migrate", v.vmid)
		migLog(t, "info", "starting VM %d on remote node '%s'", v.vmid, target)
		migLog(t, "info", "start remote tunnel")
		migLog(t, "info", "starting online/live migration on %s", uri)
		migLog(t, "info", "start migrate command to %s", uri)
		migLog(t, "info", "migration status: completed")
	}
	// phase3_cleanup: move_config_to_node, resume on the target (the
	// same QEMU here), then `qm unlock` on the target.
	v.mu.Lock()
	v.node, v.lock = target, ""
	v.mu.Unlock()
	return nil
}

// migLog is AbstractMigrate's log: "%F %H:%M:%S" local time, "ERROR:"
// after it for an error.
func migLog(t *task, level, format string, args ...any) {
	prefix := time.Now().Format("2006-01-02 15:04:05")
	if level == "err" {
		prefix += " ERROR:"
	}
	for _, line := range strings.Split(fmt.Sprintf(format, args...), "\n") {
		t.print("%s %s", prefix, line)
	}
}

// Migrate migrates VM vmid to target as root@pam would through POST
// /nodes/{node}/qemu/{vmid}/migrate (online when it runs), and waits for
// the qmigrate task. The request is not recorded in the transcript. An
// error holds the method's refusal or the task's exit status and log.
func (e *Emulator) Migrate(ctx context.Context, vmid int, target string) error {
	v := e.vmByID(vmid)
	if v == nil {
		return fmt.Errorf("pveemu: migrate: no VM %d", vmid)
	}
	v.mu.Lock()
	node := v.node
	v.mu.Unlock()
	r := &request{ctx: ctx, method: "POST", relURI: fmt.Sprintf("/nodes/%s/qemu/%d/migrate", node, vmid),
		token:  &Token{ID: "root@pam!pveemu", Root: true},
		params: map[string]any{"target": target, "online": "1"}}
	data, aerr := e.restHandler(r)
	if aerr != nil {
		return fmt.Errorf("pveemu: migrate VM %d to %s: %d %s", vmid, target, aerr.code, strings.TrimSpace(aerr.msg))
	}
	upid, _ := data.(string)
	e.mu.Lock()
	t := e.tasks[upid]
	e.mu.Unlock()
	if t == nil {
		return fmt.Errorf("pveemu: migrate VM %d: answer %v is not a task", vmid, data)
	}
	select {
	case <-t.finished:
	case <-ctx.Done():
		return ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exitstatus != "OK" {
		return fmt.Errorf("pveemu: migrate VM %d to %s: %s\n%s", vmid, target, t.exitstatus, strings.Join(t.lines, "\n"))
	}
	return nil
}
