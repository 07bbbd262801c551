package pveemu

import (
	"fmt"
	"strings"
)

// route is one registered API method (PVE::RESTHandler::register_method):
// its permission check, parameter schema and code.
type route struct {
	method  string
	path    string // relative to /api2/json, with {param} components
	perm    func(e *Emulator, r *request) *apiError
	schema  schema
	proxyto bool // proxyto => 'node'
	run     func(e *Emulator, r *request) (any, *apiError)
}

// routeTable lists the emulated methods (built once, by New).
func (e *Emulator) routeTable() []route {
	var out []route
	for _, rs := range [][]route{e.configRoutes(), e.consoleRoutes(), e.clusterRoutes(), e.powerRoutes(), e.agentRoutes(), e.vmRoutes()} {
		out = append(out, rs...)
	}
	return out
}

// agentRoute is the guest agent method name (…/agent/NAME).
func (e *Emulator) agentRoute(name, method string, run func(e *Emulator, r *request) (any, *apiError), extra map[string]prop) route {
	return route{method: method, path: "/nodes/{node}/qemu/{vmid}/agent/" + name, perm: e.agentPerm(name),
		schema: vmSchema(extra), proxyto: true, run: run}
}

// clusterRoutes are the methods on the cluster, its nodes and tasks.
func (e *Emulator) clusterRoutes() []route {
	return []route{
		{method: "GET", path: "/version", schema: schema{props: map[string]prop{}}, run: (*Emulator).getVersion},
		{method: "GET", path: "/cluster/resources", run: (*Emulator).clusterResources,
			schema: schema{props: map[string]prop{"type": {typ: "string", optional: true, enum: []string{"vm", "storage", "node", "sdn"}}}}},
		{method: "GET", path: "/cluster/status", perm: rootPerm("Sys.Audit"), schema: schema{props: map[string]prop{}}, run: (*Emulator).clusterStatus},
		{method: "GET", path: "/nodes", schema: schema{props: map[string]prop{}}, run: (*Emulator).nodesIndex},
		e.migrateRoute(),
		{method: "GET", path: "/access/permissions", run: (*Emulator).accessPermissions,
			schema: schema{props: map[string]prop{"userid": {typ: "string", optional: true}, "path": {typ: "string", optional: true}}}},
		{method: "GET", path: "/nodes/{node}/tasks/{upid}/status", proxyto: true, run: (*Emulator).taskStatus,
			schema: schema{props: map[string]prop{"node": optNode, "upid": {typ: "string"}}}},
		{method: "GET", path: "/nodes/{node}/tasks/{upid}/log", proxyto: true, run: (*Emulator).taskLog,
			schema: schema{props: map[string]prop{"node": optNode, "upid": {typ: "string"},
				"start": {typ: "integer", optional: true, minimum: num(0)}, "limit": {typ: "integer", optional: true, minimum: num(0)}}}},
	}
}

// powerRoutes are a VM's status and power methods.
func (e *Emulator) powerRoutes() []route {
	return []route{
		{method: "GET", path: "/nodes/{node}/qemu/{vmid}/status/current", perm: vmPerm("VM.Audit"), proxyto: true,
			schema: vmSchema(nil), run: (*Emulator).vmStatus},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/status/start", perm: vmPerm("VM.PowerMgmt"), proxyto: true,
			schema: vmSchema(map[string]prop{"skiplock": {typ: "boolean", optional: true}, "timeout": {typ: "integer", optional: true, minimum: num(0)}}),
			run:    (*Emulator).vmStart},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/status/stop", perm: vmPerm("VM.PowerMgmt"), proxyto: true,
			schema: vmSchema(map[string]prop{"skiplock": {typ: "boolean", optional: true}, "timeout": {typ: "integer", optional: true, minimum: num(0)},
				"keepActive": {typ: "boolean", optional: true}, "overrule-shutdown": {typ: "boolean", optional: true}}),
			run: (*Emulator).vmStop},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/status/shutdown", perm: vmPerm("VM.PowerMgmt"), proxyto: true,
			schema: vmSchema(map[string]prop{"skiplock": {typ: "boolean", optional: true}, "timeout": {typ: "integer", optional: true, minimum: num(0)},
				"forceStop": {typ: "boolean", optional: true}, "keepActive": {typ: "boolean", optional: true}}),
			run: (*Emulator).vmShutdown},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/status/reboot", perm: vmPerm("VM.PowerMgmt"), proxyto: true,
			schema: vmSchema(map[string]prop{"timeout": {typ: "integer", optional: true, minimum: num(0)}}), run: (*Emulator).vmReboot},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/status/reset", perm: vmPerm("VM.PowerMgmt"), proxyto: true,
			schema: vmSchema(map[string]prop{"skiplock": {typ: "boolean", optional: true}}), run: (*Emulator).vmReset},
	}
}

// agentRoutes are the guest agent's methods.
func (e *Emulator) agentRoutes() []route {
	return []route{
		e.agentRoute("ping", "POST", e.agentSimple("ping"), nil),
		e.agentRoute("info", "GET", e.agentSimple("info"), nil),
		e.agentRoute("network-get-interfaces", "GET", e.agentSimple("network-get-interfaces"), nil),
		e.agentRoute("get-osinfo", "GET", e.agentSimple("get-osinfo"), nil),
		e.agentRoute("get-host-name", "GET", e.agentSimple("get-host-name"), nil),
		e.agentRoute("exec", "POST", (*Emulator).agentExec, map[string]prop{
			"command":    {typ: "array"},
			"input-data": {typ: "string", optional: true, maxLength: 64 * 1024}}),
		e.agentRoute("exec-status", "GET", (*Emulator).agentExecStatus, map[string]prop{"pid": {typ: "integer"}}),
		e.agentRoute("file-read", "GET", (*Emulator).agentFileRead, e.fileReadProps()),
		e.agentRoute("file-write", "POST", (*Emulator).agentFileWrite, map[string]prop{
			"file":    {typ: "string"},
			"content": {typ: "string", maxLength: 60 * 1024},
			"encode":  {typ: "boolean", optional: true}}),
	}
}

// vmRoutes are a VM's snapshot, clone, destroy and rrddata methods.
func (e *Emulator) vmRoutes() []route {
	return []route{
		{method: "GET", path: "/nodes/{node}/qemu/{vmid}/snapshot", perm: vmPerm("VM.Audit"), proxyto: true,
			schema: vmSchema(nil), run: (*Emulator).snapshotList},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/snapshot", perm: vmPerm("VM.Snapshot"), proxyto: true,
			schema: vmSchema(map[string]prop{"snapname": optSnapname, "vmstate": {typ: "boolean", optional: true},
				"description": {typ: "string", optional: true}}), run: (*Emulator).snapshotCreate},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback", proxyto: true,
			perm:   vmPermAny("VM.Snapshot", "VM.Snapshot.Rollback"),
			schema: vmSchema(map[string]prop{"snapname": optSnapname, "start": {typ: "boolean", optional: true}}), run: (*Emulator).snapshotRollback},
		{method: "DELETE", path: "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}", perm: vmPerm("VM.Snapshot"), proxyto: true,
			schema: vmSchema(map[string]prop{"snapname": optSnapname, "force": {typ: "boolean", optional: true}}), run: (*Emulator).snapshotDelete},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/clone", perm: clonePerm, proxyto: true,
			schema: vmSchema(map[string]prop{"newid": optVMID, "name": {typ: "string", optional: true, format: "dns-name"},
				"description": {typ: "string", optional: true}, "full": {typ: "boolean", optional: true},
				"snapname": {typ: "string", optional: true, format: "pve-configid", maxLength: 40},
				"target":   {typ: "string", optional: true, format: "pve-node"}, "pool": {typ: "string", optional: true}}),
			run: (*Emulator).vmClone},
		{method: "DELETE", path: "/nodes/{node}/qemu/{vmid}", perm: vmPerm("VM.Allocate"), proxyto: true,
			schema: vmSchema(map[string]prop{"skiplock": {typ: "boolean", optional: true}, "purge": {typ: "boolean", optional: true},
				"destroy-unreferenced-disks": {typ: "boolean", optional: true}}), run: (*Emulator).vmDestroy},
		{method: "GET", path: "/nodes/{node}/qemu/{vmid}/rrddata", perm: vmPerm("VM.Audit"), proxyto: true,
			schema: vmSchema(map[string]prop{"timeframe": {typ: "string", enum: []string{"hour", "day", "week", "month", "year"}},
				"cf": {typ: "string", optional: true, enum: []string{"AVERAGE", "MAX"}}}), run: (*Emulator).vmRRDData},
	}
}

// vmSchema is a VM method's parameters: node, vmid and extra.
func vmSchema(extra map[string]prop) schema {
	p := map[string]prop{"node": optNode, "vmid": optVMID}
	for k, v := range extra {
		p[k] = v
	}
	return schema{props: p}
}

// vmPerm is check => ['perm', '/vms/{vmid}', [PRIVS]].
func vmPerm(privs ...string) func(e *Emulator, r *request) *apiError {
	return func(e *Emulator, r *request) *apiError {
		return e.check(r.token, "/vms/"+scalar(r.params["vmid"]), privs...)
	}
}

// rootPerm is check => ['perm', '/', [PRIVS]].
func rootPerm(privs ...string) func(e *Emulator, r *request) *apiError {
	return func(e *Emulator, r *request) *apiError { return e.check(r.token, "/", privs...) }
}

// vmPermAny is check => ['perm', '/vms/{vmid}', [PRIVS], any => 1].
func vmPermAny(privs ...string) func(e *Emulator, r *request) *apiError {
	return func(e *Emulator, r *request) *apiError {
		return e.checkAny(r.token, "/vms/"+scalar(r.params["vmid"]), privs...)
	}
}

// clonePerm is clone_vm's check: VM.Clone on the source and VM.Allocate on
// the new vmid (qemu-server src/PVE/API2/Qemu.pm, clone_vm).
func clonePerm(e *Emulator, r *request) *apiError {
	if err := e.check(r.token, "/vms/"+scalar(r.params["vmid"]), "VM.Clone"); err != nil {
		return err
	}
	return e.check(r.token, "/vms/"+scalar(r.params["newid"]), "VM.Allocate")
}

// matchRoute is PVE::API2->find_handler: the route and its URI parameters.
func matchRoute(routes []route, method, rel string) (*route, map[string]string) {
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	for i := range routes {
		rt := &routes[i]
		if rt.method != method {
			continue
		}
		pat := strings.Split(strings.Trim(rt.path, "/"), "/")
		if len(pat) != len(parts) {
			continue
		}
		uri := map[string]string{}
		ok := true
		for j, p := range pat {
			if strings.HasPrefix(p, "{") {
				if parts[j] == "" {
					ok = false
					break
				}
				uri[strings.Trim(p, "{}")] = parts[j]
			} else if p != parts[j] {
				ok = false
				break
			}
		}
		if ok {
			return rt, uri
		}
	}
	return nil, nil
}

// restHandler is PVE::HTTPServer::rest_handler: find the method, merge the
// URI parameters, check permissions, resolve proxyto, validate the
// parameters (PVE::RESTHandler::handle) and run the code.
func (e *Emulator) restHandler(r *request) (any, *apiError) {
	rt, uri := matchRoute(e.routes, r.method, r.relURI)
	if rt == nil {
		return nil, &apiError{code: 501, msg: fmt.Sprintf("Method '%s %s' not implemented", r.method, r.relURI)}
	}
	for k, v := range r.params {
		if u, ok := uri[k]; ok && u != scalar(v) {
			return nil, paramExc(map[string]string{k: "duplicate parameter (already defined in URI) with conflicting values!"})
		}
	}
	for k, v := range uri {
		r.params[k] = v
	}
	if rt.perm != nil {
		if err := rt.perm(e, r); err != nil {
			return nil, err
		}
	}
	if rt.proxyto {
		node := scalar(r.params["node"])
		if !e.hasNode(node) {
			// PVE::API2Tools::resolve_proxyto, then remote_node_ip falling
			// back to PVE::Network::get_ip_from_hostname.
			return nil, die("hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known", node, node)
		}
		if !e.nodeOnline(node) {
			// The permission check ran on the node answering; the forward
			// fails (proxy_request, see proxyFailure).
			return nil, proxyFailure()
		}
	}
	if err := rt.schema.validate(r.params); err != nil {
		return nil, err
	}
	return rt.run(e, r)
}

// loadVM is PVE::QemuConfig->load_config on the node the request was
// proxied to: the config must exist there.
func (e *Emulator) loadVM(r *request) (*vm, *apiError) {
	vmid, node := vmParams(r)
	if v := e.vmAt(vmid, node); v != nil {
		return v, nil
	}
	return nil, noConfig(node, vmid)
}

// vmParams are the request's vmid and node.
func vmParams(r *request) (int, string) {
	return int(intParam(r.params, "vmid", 0)), scalar(r.params["node"])
}

// vmAt is the VM whose config is on node, or nil.
func (e *Emulator) vmAt(vmid int, node string) *vm {
	if v := e.vmByID(vmid); v != nil && v.on(node) {
		return v
	}
	return nil
}

// on reports whether v's config is on node.
func (v *vm) on(node string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.node == node
}

// noConfig is PVE::AbstractConfig::load_config's error for a VM whose
// config is not on node (pve-guest-common src/PVE/AbstractConfig.pm).
func noConfig(node string, vmid int) *apiError {
	return die("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", node, vmid)
}

// notOnNode is PVE::QemuConfig::assert_config_exists_on_node's error
// (qemu-server src/PVE/QemuConfig.pm), which PVE::QemuServer::check_running
// runs first.
func notOnNode(node string, vmid int) *apiError {
	return die("unable to find configuration file for VM %d on node '%s'", vmid, node)
}

// assertOnNode is PVE::QemuConfig::assert_config_exists_on_node for the
// request's VM and node, check_running's first step.
func (e *Emulator) assertOnNode(r *request) (*vm, *apiError) {
	vmid, node := vmParams(r)
	if v := e.vmAt(vmid, node); v != nil {
		return v, nil
	}
	return nil, notOnNode(node, vmid)
}

// lockOn is a worker's first step: lock_config, then the config looked
// up on node, worded by wrong (noConfig or notOnNode) when it is not there
// (v nil, or a migration moved it while the worker waited for the lock).
// On success the config lock is held and the caller unlocks it.
func (e *Emulator) lockOn(v *vm, node string, vmid int, wrong func(string, int) *apiError) *apiError {
	if v == nil {
		return wrong(node, vmid)
	}
	v.cfgMu.Lock()
	if !v.on(node) {
		v.cfgMu.Unlock()
		return wrong(node, vmid)
	}
	return nil
}
