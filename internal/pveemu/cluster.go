package pveemu

import (
	"encoding/json"
	"runtime"
	"slices"
	"strings"
	"time"
)

// getVersion is pve-manager PVE/API2.pm "version" (permissions user => 'all').
func (e *Emulator) getVersion(*request) (any, *apiError) {
	return map[string]any{"version": e.version.Manager, "release": e.version.Release, "repoid": e.version.RepoID}, nil
}

// sample is pvestatd's status update (pve-manager PVE/Service/pvestatd.pm,
// update_qemu_status, every $updatetime seconds) as pmxcfs keeps it:
// /cluster/resources reports a VM's status as pvestatd last broadcast it,
// "unknown" before the first broadcast that included it. Each node's
// pvestatd broadcasts its own VMs, so a VM on an offline node keeps its
// last status until pmxcfs drops it after rrdExpire (cfs_rrd_dump). Sampled
// lazily, at most every statInterval.
func (e *Emulator) sample() map[int]string {
	e.mu.Lock()
	now := e.nowLocked()
	stale := now.Sub(e.lastSample) >= statInterval
	e.mu.Unlock()
	if stale {
		st := map[int]string{}
		for _, id := range e.sortedVMIDs() {
			v := e.vmByID(id)
			if v == nil {
				continue
			}
			v.mu.Lock()
			node := v.node
			v.mu.Unlock()
			if !e.nodeOnline(node) {
				continue
			}
			st[id] = "stopped"
			if v.machine.PID() != 0 {
				st[id] = "running"
			}
		}
		e.mu.Lock()
		for id, status := range st {
			e.rrd[id] = rrdEntry{status: status, at: now}
		}
		for _, n := range e.nodes {
			if !e.offline[n] {
				e.nodeSeen[n] = now
			}
		}
		e.lastSample = now
		e.mu.Unlock()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[int]string, len(e.rrd))
	for id, r := range e.rrd {
		if now.Sub(r.at) > rrdExpire {
			delete(e.rrd, id)
			continue
		}
		out[id] = r.status
	}
	return out
}

// clusterResources is pve-manager PVE/API2/Cluster.pm "resources"
// (permissions user => 'all'): every VM the caller has VM.Audit on (others
// are left out silently), with PVE::API2Tools::extract_vm_stats's fields,
// in "sort keys" order (as strings); then every node, whatever the
// caller's privileges (extract_node_stats, see nodeStats). Storage and SDN
// are not emulated: their entries are missing, as for a token without
// Datastore.Audit or SDN.Audit.
func (e *Emulator) clusterResources(r *request) (any, *apiError) {
	typ, _ := strParam(r.params, "type")
	out := []map[string]any{}
	if typ == "" || typ == "vm" {
		out = append(out, e.vmEntries(r)...)
	}
	if typ == "" || typ == "node" {
		out = append(out, e.nodeEntries(r)...)
	}
	return out, nil
}

// vmEntries are the VM entries of cluster/resources.
func (e *Emulator) vmEntries(r *request) []map[string]any {
	rrd := e.sample()
	ids := e.sortedVMIDs()
	slices.SortFunc(ids, func(a, b int) int { return strings.Compare(itoa(a), itoa(b)) })
	var out []map[string]any
	for _, id := range ids {
		v := e.vmByID(id)
		if v == nil {
			continue
		}
		if e.check(r.token, "/vms/"+itoa(id), "VM.Audit") != nil {
			continue
		}
		v.mu.Lock()
		entry := map[string]any{"id": "qemu/" + itoa(id), "vmid": id, "node": v.node, "type": "qemu", "status": "unknown"}
		if st, ok := rrd[id]; ok {
			entry["status"] = st
			entry["name"] = v.name
			entry["template"] = b2i(v.template)
			entry["maxcpu"] = v.cores
			entry["maxmem"] = int64(v.memoryMB) << 20
			entry["cpu"], entry["mem"], entry["maxdisk"], entry["disk"] = 0, 0, 0, 0
			entry["netin"], entry["netout"], entry["diskread"], entry["diskwrite"] = 0, 0, 0, 0
			entry["uptime"] = 0
			if st == "running" {
				entry["uptime"] = int64(time.Since(v.started).Seconds())
			}
		}
		if v.lock != "" {
			entry["lock"] = v.lock
		}
		v.mu.Unlock()
		out = append(out, entry)
	}
	return out
}

// accessPermissions is pve-access-control src/PVE/API2/AccessControl.pm
// "permissions": the caller's own permissions (or an owned token's); another
// user's need Sys.Audit on /access.
func (e *Emulator) accessPermissions(r *request) (any, *apiError) {
	userid, ok := strParam(r.params, "userid")
	if !ok {
		userid = r.token.ID
	}
	if userid != r.token.ID {
		if err := e.check(r.token, "/access", "Sys.Audit"); err != nil {
			return nil, err
		}
	}
	e.mu.Lock()
	tok := e.tokens[userid]
	e.mu.Unlock()
	if tok == nil {
		return map[string]any{}, nil
	}
	if path, ok := strParam(r.params, "path"); ok && path != "" {
		return map[string]any{path: privMap(e.permissions(tok, path))}, nil
	}
	out := map[string]any{}
	for p, perm := range e.effectivePermissions(tok) {
		out[p] = privMap(perm)
	}
	return out, nil
}

// privMap renders privilege => propagate as Perl does (1 or 0).
func privMap(m map[string]bool) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = b2i(v)
	}
	return out
}

// vmStatus is qemu-server src/PVE/API2/Qemu.pm vm_status: PVE::QemuServer::vmstatus
// with $full (runningStatus: the QEMU process's and monitor's figures), plus
// ha and agent. cpus is capped at the host's CPU count as vmstatus does.
func (e *Emulator) vmStatus(r *request) (any, *apiError) {
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	pid := v.machine.PID()
	v.mu.Lock()
	cpus := min(v.cores, runtime.NumCPU())
	d := map[string]any{"vmid": v.vmid, "name": v.name, "status": "stopped", "cpus": cpus,
		"maxmem": int64(v.memoryMB) << 20, "mem": 0, "cpu": 0, "disk": 0, "maxdisk": 0, "uptime": 0,
		"netin": 0, "netout": 0, "ha": map[string]any{"managed": 0}}
	if e.version.MemHost() {
		d["memhost"] = 0
	}
	if v.agentOn {
		d["agent"] = 1
	}
	if v.template {
		d["template"] = 1
	}
	if v.lock != "" {
		d["lock"] = v.lock
	}
	started := v.started
	v.mu.Unlock()
	if pid != 0 {
		d["status"], d["pid"] = "running", pid
		d["uptime"] = int64(time.Since(started).Seconds())
		// A failing monitor leaves qmpstatus and the QMP figures out.
		e.runningStatus(r, v, pid, cpus, d)
	}
	return d, nil
}

// vmRRDData is qemu-server vm "rrddata": PVE::RRD::create_rrd_data over the
// VM's RRD file, which pvestatd fills every $updatetime seconds. The emulator
// keeps no history: it answers one point per sample interval of the
// timeframe, the current values in the newest one.
func (e *Emulator) vmRRDData(r *request) (any, *apiError) {
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	step := map[string]int64{"hour": 60, "day": 1800, "week": 10800, "month": 43200, "year": 604800}[scalar(r.params["timeframe"])]
	now := time.Now().Unix() / step * step
	v.mu.Lock()
	maxmem := int64(v.memoryMB) << 20
	cores := v.cores
	v.mu.Unlock()
	running := v.machine.PID() != 0
	out := make([]map[string]any, 0, 70)
	for i := int64(69); i >= 0; i-- {
		p := map[string]any{"time": now - i*step}
		if i == 0 && running {
			p["maxmem"], p["maxcpu"], p["cpu"], p["mem"] = maxmem, cores, 0, 0
			p["netin"], p["netout"], p["diskread"], p["diskwrite"], p["disk"], p["maxdisk"] = 0, 0, 0, 0, 0, 0
		}
		out = append(out, p)
	}
	return out, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func itoa(i int) string { return jsonInt(int64(i)) }

func jsonInt(i int64) string {
	b, _ := json.Marshal(i)
	return string(b)
}
