package pveemu

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// threeNodes are the nodes of the cluster tests; pve serves the API.
var threeNodes = []string{"pve", "pve-2", "pve-3"}

// advance moves the status broadcasts' clock on by d.
func (e *Emulator) advance(d time.Duration) {
	e.mu.Lock()
	e.skew += d
	e.mu.Unlock()
}

// keys are m's keys, sorted.
func keys(m map[string]any) string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	slices.Sort(k)
	return strings.Join(k, " ")
}

// entries reads cluster/resources (of type typ unless empty) as "type:id:status" and by id.
func (c client) entries(typ string) (string, map[string]map[string]any) {
	c.t.Helper()
	var params url.Values
	if typ != "" {
		params = url.Values{"type": {typ}}
	}
	var list []map[string]any
	c.do("GET", "/cluster/resources", params).data(c.t, &list)
	var s []string
	byID := map[string]map[string]any{}
	for _, x := range list {
		s = append(s, fmt.Sprintf("%v:%v", x["id"], x["status"]))
		byID[fmt.Sprint(x["id"])] = x
	}
	return strings.Join(s, " "), byID
}

// TestClusterNodes: cluster/resources lists every node with its state to
// any token (the figures only with Sys.Audit), and a VM on a node gone
// offline keeps its last broadcast status for five minutes, then is
// "unknown" with nothing else (PVE::API2Tools extract_vm_stats without rrd
// data, pmxcfs' rrd_entry_is_old).
func TestClusterNodes(t *testing.T) {
	e, c := emuNodes(t, PVE92(), threeNodes, []string{"VM.Audit"},
		VMSpec{VMID: 1000, Node: "pve-2", Name: "big", Running: true},
		VMSpec{VMID: 101, Node: "pve", Name: "a", Running: true},
		VMSpec{VMID: 104, Node: "pve-3", Name: "far", Running: true})
	got, byID := c.entries("")
	// "sort keys %$idlist": vmids as strings.
	want := "qemu/1000:running qemu/101:running qemu/104:running node/pve:online node/pve-2:online node/pve-3:online"
	if got != want {
		t.Errorf("cluster/resources = %s; want %s", got, want)
	}
	if k := keys(byID["node/pve"]); k != "cgroup-mode id level node status type" {
		t.Errorf("node entry without Sys.Audit has %s; want no figures", k)
	}
	if got, _ := c.entries("node"); got != "node/pve:online node/pve-2:online node/pve-3:online" {
		t.Errorf("cluster/resources?type=node = %s; want the three nodes", got)
	}
	if err := e.SetNodeOnline("pve-3", false); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.entries(""); got != "qemu/1000:running qemu/101:running qemu/104:running node/pve:online node/pve-2:online node/pve-3:offline" {
		t.Errorf("cluster/resources with pve-3 offline = %s; want 104 still running (its last broadcast) and pve-3 offline", got)
	}
	e.advance(rrdExpire + statInterval)
	got, byID = c.entries("vm")
	if got != "qemu/1000:running qemu/101:running qemu/104:unknown" || keys(byID["qemu/104"]) != "id node status type vmid" {
		t.Errorf("cluster/resources?type=vm five minutes on = %s, 104 %v; want 104 unknown with id, node, status, type, vmid only", got, byID["qemu/104"])
	}
	_, byID = c.entries("node")
	if keys(byID["node/pve-3"]) != "cgroup-mode id node status type" || byID["node/pve-3"]["status"] != "offline" {
		t.Errorf("node/pve-3 five minutes offline = %v; want offline without level", byID["node/pve-3"])
	}
	if err := e.SetNodeOnline("pve-3", true); err != nil {
		t.Fatal(err)
	}
	e.advance(statInterval)
	if got, _ := c.entries(""); !strings.Contains(got, "qemu/104:running") || !strings.Contains(got, "node/pve-3:online") {
		t.Errorf("cluster/resources with pve-3 back = %s; want 104 running again and pve-3 online", got)
	}
	for node, wantErr := range map[string]string{"pve": "serves the API", "nope": "no node"} {
		if err := e.SetNodeOnline(node, false); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("SetNodeOnline(%s, false) = %v; want an error saying %q", node, err, wantErr)
		}
	}
}

// TestNodesAndClusterStatus: GET /nodes (Nodes.pm index, any token) and GET
// /cluster/status (Sys.Audit on /), with quorum lost when two of three
// nodes are offline.
func TestNodesAndClusterStatus(t *testing.T) {
	e, c := emuNodes(t, PVE84(), threeNodes, []string{"VM.Audit"})
	var nodes []map[string]any
	c.do("GET", "/nodes", nil).data(t, &nodes)
	fp := regexp.MustCompile(`^([0-9A-F]{2}:){31}[0-9A-F]{2}$`)
	if len(nodes) != 3 || nodes[2]["node"] != "pve-3" || nodes[2]["status"] != "online" || !fp.MatchString(fmt.Sprint(nodes[0]["ssl_fingerprint"])) {
		t.Errorf("GET /nodes = %v; want three online nodes with a SHA-256 fingerprint", nodes)
	}
	if r := c.do("GET", "/cluster/status", nil); r.code != 403 || r.reason != "Permission check failed (/, Sys.Audit)" {
		t.Errorf("GET /cluster/status without Sys.Audit = %d %q; want 403 naming /, Sys.Audit", r.code, r.reason)
	}
	if err := e.AddToken(Token{ID: "root@pam!top", Secret: "s", Root: true}); err != nil {
		t.Fatal(err)
	}
	root := newClient(t, e, tokenAuth("root@pam!top", "s"))
	status := func() string {
		var st []map[string]any
		root.do("GET", "/cluster/status", nil).data(t, &st)
		var s []string
		for _, x := range st {
			if x["type"] == "cluster" {
				s = append(s, fmt.Sprintf("quorate=%v nodes=%v", x["quorate"], x["nodes"]))
				continue
			}
			s = append(s, fmt.Sprintf("%v:%v:%v:%v", x["name"], x["online"], x["local"], x["ip"]))
		}
		return strings.Join(s, " ")
	}
	if got := status(); got != "quorate=1 nodes=3 pve:1:1:192.0.2.1 pve-2:1:0:192.0.2.2 pve-3:1:0:192.0.2.3" {
		t.Errorf("cluster/status = %s", got)
	}
	e.SetNodeOnline("pve-3", false)
	if got := status(); got != "quorate=1 nodes=3 pve:1:1:192.0.2.1 pve-2:1:0:192.0.2.2 pve-3:0:0:192.0.2.3" {
		t.Errorf("cluster/status with pve-3 offline = %s", got)
	}
	e.SetNodeOnline("pve-2", false)
	if got := status(); !strings.HasPrefix(got, "quorate=0 ") {
		t.Errorf("cluster/status with two of three offline = %s; want no quorum", got)
	}
	c.do("GET", "/nodes", nil).data(t, &nodes)
	if nodes[1]["status"] != "offline" || nodes[2]["status"] != "offline" {
		t.Errorf("GET /nodes with two offline = %v", nodes)
	}
}

// TestProxyToOfflineNode: a request for an offline node passes the
// permission check on the node answering, then its forward fails: 595 No
// route to host, no body (pve-http-server proxy_request).
func TestProxyToOfflineNode(t *testing.T) {
	e, c := emuNodes(t, PVE92(), threeNodes, []string{"VM.Audit"}, VMSpec{VMID: 104, Node: "pve-3", Running: true})
	e.SetNodeOnline("pve-3", false)
	upid := "UPID:pve-3:00000001:00000002:00000003:qmstart:104:" + tokID + ":"
	for _, tc := range []struct {
		method, path string
		code         int
		reason       string
	}{
		{"GET", "/nodes/pve-3/qemu/104/status/current", 595, "No route to host"},
		{"GET", "/nodes/pve-3/tasks/" + url.PathEscape(upid) + "/status", 595, "No route to host"},
		{"POST", "/nodes/pve-3/qemu/104/status/start", 403, "Permission check failed (/vms/104, VM.PowerMgmt)"},
		{"GET", "/nodes/pve-2/qemu/104/status/current", 500, "Configuration file 'nodes/pve-2/qemu-server/104.conf' does not exist"},
	} {
		r := c.do(tc.method, tc.path, nil)
		if r.code != tc.code || r.reason != tc.reason {
			t.Errorf("%s %s = %d %q; want %d %q", tc.method, tc.path, r.code, r.reason, tc.code, tc.reason)
		}
		if tc.code == 595 && r.raw != "" {
			t.Errorf("%s %s body = %q; want none", tc.method, tc.path, r.raw)
		}
	}
}

// migrateEmu is a three-node emulator with VMs 101 (running) and 102
// (stopped) on pve, and the CI token allowed to migrate.
func migrateEmu(t *testing.T) (*Emulator, client) {
	return emuNodes(t, PVE92(), threeNodes, append(allVMPrivs(PVE92()), "VM.Migrate"),
		VMSpec{VMID: 101, Node: "pve", Name: "on", Running: true}, VMSpec{VMID: 102, Node: "pve", Name: "off"})
}

// migrate posts migrate_vm.
func (c client) migrate(node string, vmid int, params url.Values) reply {
	c.t.Helper()
	return c.do("POST", fmt.Sprintf("/nodes/%s/qemu/%d/migrate", node, vmid), params)
}

// taskLog is a task's log lines.
func (c client) taskLog(node string, st map[string]any) string {
	c.t.Helper()
	var lines []map[string]any
	c.do("GET", "/nodes/"+node+"/tasks/"+url.PathEscape(fmt.Sprint(st["upid"]))+"/log", nil).data(c.t, &lines)
	var s []string
	for _, l := range lines {
		s = append(s, fmt.Sprint(l["t"]))
	}
	return strings.Join(s, "\n")
}

// stamp starts a line of AbstractMigrate's log.
const stamp = `\d{4}-\d\d-\d\d \d\d:\d\d:\d\d `

// TestMigrate: the qmigrate task on the source node, offline and online,
// and where the VM is afterwards.
func TestMigrate(t *testing.T) {
	e, c := migrateEmu(t)
	st := c.taskOf("pve", c.migrate("pve", 102, url.Values{"target": {"pve-2"}}))
	log := c.taskLog("pve", st)
	if st["type"] != "qmigrate" || st["id"] != "102" || st["node"] != "pve" || st["exitstatus"] != "OK" ||
		!regexp.MustCompile("(?m)^"+stamp+`starting migration of VM 102 to node 'pve-2' \(192\.0\.2\.2\)$`).MatchString(log) ||
		!regexp.MustCompile("(?m)^"+stamp+`migration finished successfully \(duration 00:00:0\d\)$`).MatchString(log) ||
		strings.Contains(log, "online/live") {
		t.Errorf("offline migration task = %v, log:\n%s\nwant qmigrate of 102 on pve, OK, AbstractMigrate's lines", st, log)
	}
	if r := c.do("GET", "/nodes/pve/qemu/102/status/current", nil); r.code != 500 || r.reason != "Configuration file 'nodes/pve/qemu-server/102.conf' does not exist" {
		t.Errorf("status/current on the source after migration = %d %q; want the config gone", r.code, r.reason)
	}
	if r := c.do("GET", "/nodes/pve-2/qemu/102/status/current", nil); r.code != 200 {
		t.Errorf("status/current on the target = %d %q; want 200", r.code, r.reason)
	}
	if r := c.migrate("pve", 101, url.Values{"target": {"pve-2"}}); r.code != 500 || r.reason != "can't migrate running VM without --online" {
		t.Errorf("migrate of a running VM without online = %d %q", r.code, r.reason)
	}
	st = c.taskOf("pve", c.migrate("pve", 101, url.Values{"target": {"pve-2"}, "online": {"1"}}))
	if log := c.taskLog("pve", st); st["exitstatus"] != "OK" || !strings.Contains(log, "starting online/live migration on unix:/run/qemu-server/101.migrate") || !e.Running(101) {
		t.Errorf("online migration = %v, running %v, log:\n%s\nwant OK, still running, phase2's lines", st, e.Running(101), log)
	}
	_, byID := c.entries("vm")
	if byID["qemu/101"]["node"] != "pve-2" || byID["qemu/102"]["node"] != "pve-2" || byID["qemu/101"]["lock"] != nil {
		t.Errorf("cluster/resources after the migrations = %v; want both on pve-2, unlocked", byID)
	}
	e.SetNodeOnline("pve-3", false)
	st = c.taskOf("pve-2", c.migrate("pve-2", 102, url.Values{"target": {"pve-3"}}))
	if log := c.taskLog("pve-2", st); st["exitstatus"] != "migration aborted" ||
		!regexp.MustCompile("(?m)^"+stamp+`ERROR: migration aborted \(duration 00:00:0\d\): Can't connect to destination address using public key$`).MatchString(log) {
		t.Errorf("migration to an offline node = %v, log:\n%s\nwant aborted: the target cannot be reached", st, log)
	}
	if r := c.do("GET", "/nodes/pve-2/qemu/102/config", nil); r.code != 200 {
		t.Errorf("config after a failed migration = %d %q; want the VM still on pve-2", r.code, r.reason)
	}
}

// TestMigrateRefused: migrate_vm's checks before the task.
func TestMigrateRefused(t *testing.T) {
	e, c := migrateEmu(t)
	e.SetNodeOnline("pve-3", false)
	for _, tc := range []struct {
		node   string
		params url.Values
		code   int
		reason string
		errors map[string]string
	}{
		{"pve", url.Values{"target": {"pve"}}, 400, "Parameter verification failed.", map[string]string{"target": "target is local node."}},
		{"pve", url.Values{"target": {"nope"}}, 500, "no such cluster node 'nope'", nil},
		{"pve", url.Values{"target": {"pve-2"}, "force": {"1"}}, 400, "Parameter verification failed.", map[string]string{"force": "Only root may use this option."}},
		{"pve", url.Values{"target": {"pve-2"}, "migration_type": {"insecure"}}, 400, "Parameter verification failed.", map[string]string{"migration_type": "Only root may use this option."}},
		{"pve-2", url.Values{"target": {"pve"}}, 500, "Configuration file 'nodes/pve-2/qemu-server/101.conf' does not exist", nil},
		{"pve-3", url.Values{"target": {"pve"}}, 595, "No route to host", nil},
		{"pve", url.Values{}, 400, "Parameter verification failed.", map[string]string{"target": "property is missing and it is not optional"}},
	} {
		r := c.migrate(tc.node, 101, tc.params)
		if r.code != tc.code || r.reason != tc.reason || fmt.Sprint(r.body.Errors) != fmt.Sprint(tc.errors) {
			t.Errorf("migrate 101 on %s %v = %d %q %v; want %d %q %v", tc.node, tc.params, r.code, r.reason, r.body.Errors, tc.code, tc.reason, tc.errors)
		}
	}
	e.AddToken(Token{ID: tokID, Secret: tokSecret, ACL: []ACL{{Path: "/vms", Privs: allVMPrivs(PVE92()), Propagate: true}}})
	if r := c.migrate("pve", 101, url.Values{"target": {"pve-2"}}); r.code != 403 || r.reason != "Permission check failed (/vms/101, VM.Migrate)" {
		t.Errorf("migrate without VM.Migrate = %d %q", r.code, r.reason)
	}
}

// TestMigrateNoQuorum: check_cfs_quorum refuses a migration while most
// nodes are offline.
func TestMigrateNoQuorum(t *testing.T) {
	e, c := emuNodes(t, PVE92(), threeNodes, append(allVMPrivs(PVE92()), "VM.Migrate"), VMSpec{VMID: 102, Node: "pve", Name: "off"})
	e.SetNodeOnline("pve-2", false)
	e.SetNodeOnline("pve-3", false)
	if r := c.do("POST", "/nodes/pve/qemu/102/migrate", url.Values{"target": {"pve-2"}}); r.code != 500 || r.reason != "cluster not ready - no quorum?" {
		t.Errorf("migrate without quorum = %d %q; want 500 %q", r.code, r.reason, "cluster not ready - no quorum?")
	}
}

// TestWrongNodeAnswers: what each method answers for a VM whose config is
// on another node, where upstream looks: load_config ("Configuration file
// ... does not exist") or check_running's assert_config_exists_on_node
// ("unable to find configuration file ...") before forking, or in the
// worker's first step (the task fails, the method answers a UPID).
func TestWrongNodeAnswers(t *testing.T) {
	e, c := emuNodes(t, PVE92(), threeNodes, allVMPrivs(PVE92()), VMSpec{VMID: 101, Node: "pve", Name: "on", Running: true})
	if err := e.Migrate(context.Background(), 101, "pve-2"); err != nil {
		t.Fatal(err)
	}
	const (
		noConf    = "Configuration file 'nodes/pve/qemu-server/101.conf' does not exist"
		notOnNode = "unable to find configuration file for VM 101 on node 'pve'"
	)
	for _, tc := range []struct {
		method, path string
		params       url.Values
		sync, task   string // the call's 500 reason, or the task's exit status
	}{
		{"GET", "status/current", nil, noConf, ""},                     // vm_status: load_config
		{"GET", "config", nil, noConf, ""},                             // vm_config: load_current_config
		{"POST", "agent/ping", url.Values{}, noConf, ""},               // Agent.pm register_command
		{"GET", "snapshot", nil, noConf, ""},                           // snapshot_list
		{"DELETE", "", nil, noConf, ""},                                // destroy_vm: $early_checks
		{"POST", "status/reset", url.Values{}, notOnNode, ""},          // vm_reset: check_running
		{"POST", "status/reboot", url.Values{}, notOnNode, ""},         // vm_reboot: check_running
		{"POST", "clone", url.Values{"newid": {"150"}}, notOnNode, ""}, // clone_vm: check_running
		{"POST", "status/start", url.Values{}, "", noConf},             // QemuServer.pm vm_start
		{"POST", "status/stop", url.Values{}, "", notOnNode},           // _do_vm_stop: check_running
		{"POST", "status/shutdown", url.Values{}, "", notOnNode},       // _do_vm_stop: check_running
		{"POST", "snapshot/s1/rollback", url.Values{}, "", noConf},     // AbstractConfig snapshot_rollback
		{"DELETE", "snapshot/s1", nil, "", noConf},                     // AbstractConfig snapshot_delete
	} {
		path := strings.TrimSuffix("/nodes/pve/qemu/101/"+tc.path, "/")
		r := c.do(tc.method, path, tc.params)
		if tc.sync != "" {
			if r.code != 500 || r.reason != tc.sync {
				t.Errorf("%s %s on the old node = %d %q; want 500 %q", tc.method, path, r.code, r.reason, tc.sync)
			}
			continue
		}
		if st := c.taskOf("pve", r); st["exitstatus"] != tc.task {
			t.Errorf("%s %s on the old node: task %v; want exit status %q", tc.method, path, st, tc.task)
		}
	}
	if !e.Running(101) {
		t.Errorf("VM 101 stopped by calls on the old node")
	}
}

// TestTaskAfterMigration: a task that waited for the config lock while a
// migration held it finds the config gone (lock_config, then the worker's
// first look at the config).
func TestTaskAfterMigration(t *testing.T) {
	e, c := emuNodes(t, PVE92(), threeNodes, allVMPrivs(PVE92()), VMSpec{VMID: 101, Node: "pve", Name: "on", Running: true})
	v := e.vmByID(101)
	v.cfgMu.Lock() // a migration holds the lock
	r := c.do("POST", "/nodes/pve/qemu/101/status/stop", url.Values{})
	v.mu.Lock()
	v.node = "pve-2" // phase3_cleanup's move_config_to_node
	v.mu.Unlock()
	v.cfgMu.Unlock()
	if st := c.taskOf("pve", r); st["exitstatus"] != "unable to find configuration file for VM 101 on node 'pve'" {
		t.Errorf("stop queued behind a migration: task %v; want the config gone from pve", st)
	}
	if !e.Running(101) {
		t.Errorf("VM 101 stopped by a task on the node it left")
	}
}
