package pveemu

import (
	"net/url"
	"testing"
)

// TestConfigAndNextID: a clone keeps its description (clone_vm), the
// config is read back (vm_config) and its memory and cores changed
// (update_vm) with the privilege of each option, a digest guards against a
// concurrent change, and nextid hands out the lowest free vmid.
func TestConfigAndNextID(t *testing.T) {
	privs := append(allVMPrivs(PVE92()), "VM.Config.Memory")
	_, c := emu(t, PVE92(), privs, VMSpec{VMID: 100, Node: "pve", Name: "tmpl", Template: true, MemoryMB: 256, Cores: 2})
	var next any
	c.do("GET", "/cluster/nextid", nil).data(t, &next)
	if next != float64(101) {
		t.Fatalf("nextid = %v; want 101 (100 is taken)", next)
	}
	if r := c.do("GET", "/cluster/nextid", url.Values{"vmid": {"100"}}); r.code != 400 || r.body.Errors["vmid"] != "VM 100 already exists" {
		t.Errorf("nextid?vmid=100 = %d %v; want 400 VM 100 already exists", r.code, r.body.Errors)
	}
	st := c.taskOf("pve", c.do("POST", "/nodes/pve/qemu/100/clone", url.Values{"newid": {"101"}, "name": {"small-a"}, "description": {"vmgate-lease: LMARK\n"}}))
	if st["exitstatus"] != "OK" {
		t.Fatalf("clone = %v", st)
	}
	var conf map[string]any
	c.do("GET", "/nodes/pve/qemu/101/config", nil).data(t, &conf)
	if conf["name"] != "small-a" || conf["description"] != "vmgate-lease: LMARK\n" || conf["memory"] != "256" || conf["cores"] != float64(2) || conf["template"] != nil {
		t.Errorf("clone's config = %v; want its name, the description, the template's memory and cores, not a template", conf)
	}
	digest := conf["digest"].(string)
	if r := c.do("PUT", "/nodes/pve/qemu/101/config", url.Values{"memory": {"512"}, "digest": {digest}}); r.code != 200 {
		t.Fatalf("PUT config memory = %d %s", r.code, r.raw)
	}
	c.do("GET", "/nodes/pve/qemu/101/config", nil).data(t, &conf)
	if conf["memory"] != "512" {
		t.Errorf("memory after PUT = %v; want 512", conf["memory"])
	}
	// The old digest no longer matches; cores needs VM.Config.CPU, which the token lacks.
	if r := c.do("PUT", "/nodes/pve/qemu/101/config", url.Values{"memory": {"384"}, "digest": {digest}}); r.code != 500 || r.reason != "detected modified configuration - file changed by other user? Try again." {
		t.Errorf("PUT with a stale digest = %d %q", r.code, r.reason)
	}
	if r := c.do("PUT", "/nodes/pve/qemu/101/config", url.Values{"cores": {"4"}}); r.code != 403 {
		t.Errorf("PUT cores without VM.Config.CPU = %d %s; want 403", r.code, r.raw)
	}
	if r := c.do("PUT", "/nodes/pve/qemu/101/config", url.Values{"memory": {"lots"}}); r.code != 400 {
		t.Errorf("PUT memory=lots = %d %s; want 400", r.code, r.raw)
	}
	c.do("GET", "/cluster/nextid", nil).data(t, &next)
	if next != float64(102) {
		t.Errorf("nextid after the clone = %v; want 102", next)
	}
}
