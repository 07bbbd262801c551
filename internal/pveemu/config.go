package pveemu

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
)

// A VM's config as the API reads and writes it: GET and PUT
// /nodes/{node}/qemu/{vmid}/config, and /cluster/nextid, which clients use
// to pick the vmid of a clone.

// configRoutes are the config methods' routes (added to routeTable).
func (e *Emulator) configRoutes() []route {
	return []route{
		{method: "GET", path: "/cluster/nextid", run: (*Emulator).nextID,
			schema: schema{props: map[string]prop{"vmid": {typ: "integer", optional: true, format: "pve-vmid", minimum: num(100), maximum: num(999999999)}}}},
		{method: "GET", path: "/nodes/{node}/qemu/{vmid}/config", perm: vmPerm("VM.Audit"), proxyto: true,
			schema: vmSchema(map[string]prop{"current": {typ: "boolean", optional: true},
				"snapshot": {typ: "string", optional: true, format: "pve-configid", maxLength: 40}}),
			run: (*Emulator).vmConfig},
		{method: "PUT", path: "/nodes/{node}/qemu/{vmid}/config", perm: vmPermAny(vmConfigPermList...), proxyto: true,
			schema: vmSchema(map[string]prop{
				"memory":      {typ: "string", optional: true},
				"cores":       {typ: "integer", optional: true, minimum: num(1), maximum: num(1024)},
				"name":        {typ: "string", optional: true, format: "dns-name"},
				"description": {typ: "string", optional: true, maxLength: 8192},
				"digest":      {typ: "string", optional: true, maxLength: 40},
				"skiplock":    {typ: "boolean", optional: true}}),
			run: (*Emulator).vmUpdateConfig},
	}
}

// nextID is pve-manager PVE/API2/Cluster.pm "nextid" (permissions user =>
// 'all'): with vmid, that vmid if no VM has it, else a parameter error;
// without, the lowest free vmid from 100 (datacenter.cfg's next-id lower
// bound, default 100) below 1000000.
func (e *Emulator) nextID(r *request) (any, *apiError) {
	if _, ok := r.params["vmid"]; ok {
		vmid := int(intParam(r.params, "vmid", 0))
		if e.vmByID(vmid) == nil {
			return strconv.Itoa(vmid), nil
		}
		return nil, paramExc(map[string]string{"vmid": fmt.Sprintf("VM %d already exists", vmid)})
	}
	for i := 100; i < 1000*1000; i++ {
		if e.vmByID(i) == nil {
			return i, nil
		}
	}
	return nil, die("unable to get any free VMID in range [100, 1000000]")
}

// vmConfigPermList is qemu-server src/PVE/API2/Qemu.pm $vm_config_perm_list,
// update_vm's check (any => 1).
var vmConfigPermList = []string{"VM.Config.Disk", "VM.Config.CDROM", "VM.Config.CPU", "VM.Config.Memory",
	"VM.Config.Network", "VM.Config.HWType", "VM.Config.Options", "VM.Config.Cloudinit"}

// configMap is the part of a VM's config the emulator keeps, as
// PVE::QemuConfig->load_current_config returns it, with its digest (the
// SHA1 of the config file; here of the keys and values in order).
func (v *vm) configMap() map[string]any {
	v.mu.Lock()
	defer v.mu.Unlock()
	conf := map[string]any{"memory": strconv.Itoa(v.memoryMB), "cores": v.cores}
	if v.name != "" {
		conf["name"] = v.name
	}
	if v.agentOn {
		conf["agent"] = "1"
	}
	if v.template {
		conf["template"] = 1
	}
	if _, ok := v.machine.(consoleMachine); ok {
		conf["serial0"] = "socket" // the lab VM's serial console (console.go)
	}
	if v.description != "" {
		conf["description"] = v.description
	}
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha1.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%s: %v\n", k, conf[k])
	}
	conf["digest"] = hex.EncodeToString(h.Sum(nil))
	return conf
}

// vmConfig is qemu-server src/PVE/API2/Qemu.pm vm_config: snapshot and
// current exclude each other; the config with pending changes applied (the
// emulator applies changes at once, so there are none).
func (e *Emulator) vmConfig(r *request) (any, *apiError) {
	snap, _ := strParam(r.params, "snapshot")
	if snap != "" && boolParam(r.params, "current", false) {
		return nil, paramExc(map[string]string{
			"snapshot": "cannot use 'snapshot' parameter with 'current'",
			"current":  "cannot use 'snapshot' parameter with 'current'"})
	}
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	if snap != "" {
		v.mu.Lock()
		_, ok := v.snapshots[snap]
		v.mu.Unlock()
		if !ok {
			return nil, die("snapshot '%s' does not exist", snap)
		}
	}
	return v.configMap(), nil
}

// vmUpdateConfig is update_vm (PUT, synchronous) for the options the
// emulator keeps: $check_vm_modify_config_perm checks each option's
// privilege (cores: VM.Config.CPU, memory: VM.Config.Memory, name and
// description: VM.Config.Options), the config is locked, a digest that
// does not match fails (PVE::Tools::assert_if_modified), and a locked VM
// refuses unless skiplock (root only).
func (e *Emulator) vmUpdateConfig(r *request) (any, *apiError) {
	if err := rootOnly(r, "skiplock"); err != nil {
		return nil, err
	}
	need := map[string]string{"cores": "VM.Config.CPU", "memory": "VM.Config.Memory", "name": "VM.Config.Options", "description": "VM.Config.Options"}
	for opt, priv := range need {
		if _, ok := r.params[opt]; ok {
			if err := e.check(r.token, "/vms/"+scalar(r.params["vmid"]), priv); err != nil {
				return nil, err
			}
		}
	}
	memory := -1
	if s, ok := strParam(r.params, "memory"); ok {
		// memory is "[current=]<integer>" (PVE::QemuServer::Memory), 16 MiB at least.
		n, err := strconv.Atoi(s)
		if err != nil || n < 16 {
			return nil, paramExc(map[string]string{"memory": "value does not match the regex pattern"})
		}
		memory = n
	}
	v, err := e.loadVM(r)
	if err != nil {
		return nil, err
	}
	v.cfgMu.Lock()
	defer v.cfgMu.Unlock()
	if d, ok := strParam(r.params, "digest"); ok && d != v.configMap()["digest"] {
		return nil, die("detected modified configuration - file changed by other user? Try again.")
	}
	if !boolParam(r.params, "skiplock", false) {
		if err := v.checkLock(); err != nil {
			return nil, err
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if memory > 0 {
		v.memoryMB = memory
	}
	if _, ok := r.params["cores"]; ok {
		v.cores = int(intParam(r.params, "cores", 1))
	}
	if s, ok := strParam(r.params, "name"); ok {
		v.name = s
	}
	if s, ok := strParam(r.params, "description"); ok {
		v.description = s
	}
	return nil, nil
}
