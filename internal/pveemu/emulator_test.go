package pveemu

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

func TestMain(m *testing.M) {
	os.Exit(labtest.Main(m,
		lab.Spec{Name: "t1"},
		lab.Spec{Name: "noexec", Cmdline: map[string]string{"QGA_BLOCK": "guest-exec"}},
	))
}

const (
	tokID     = "vmgate@pve!ci"
	tokSecret = "5b0c3b1e-8f8d-4c55-9a3e-0d6c2b7f4a11"
)

// allVMPrivs is every privilege a VM method of version v checks.
func allVMPrivs(v Version) []string {
	p := []string{"VM.Audit", "VM.PowerMgmt", "VM.Snapshot", "VM.Clone", "VM.Allocate", "VM.Monitor"}
	if v.GuestAgentPrivileges() {
		p = append(p, "VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted")
	}
	return p
}

// client talks to an emulator with one token.
type client struct {
	t    testing.TB
	e    *Emulator
	auth string
	hc   *http.Client
}

func newClient(t testing.TB, e *Emulator, auth string) client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.CertPool()}}
	t.Cleanup(tr.CloseIdleConnections)
	return client{t: t, e: e, auth: auth, hc: &http.Client{Transport: tr, Timeout: 2 * time.Minute}}
}

// reply is one answer: status, reason phrase and the body decoded.
type reply struct {
	code   int
	reason string
	raw    string
	body   struct {
		Data    json.RawMessage   `json:"data"`
		Message *string           `json:"message"`
		Errors  map[string]string `json:"errors"`
	}
}

func (c client) do(method, path string, params url.Values) reply {
	c.t.Helper()
	if params != nil && (method == "POST" || method == "PUT") {
		return c.send(method, path, "application/x-www-form-urlencoded", strings.NewReader(params.Encode()))
	}
	if params != nil {
		path += "?" + params.Encode()
	}
	return c.send(method, path, "", nil)
}

func (c client) jsonBody(method, path string, v any) reply {
	c.t.Helper()
	b, _ := json.Marshal(v)
	return c.send(method, path, "application/json", bytes.NewReader(b))
}

// send makes one request and reads the answer.
func (c client) send(method, path, ctype string, body io.Reader) reply {
	c.t.Helper()
	req, err := http.NewRequest(method, c.e.URL()+"/api2/json"+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{code: resp.StatusCode, reason: strings.TrimSpace(strings.TrimPrefix(resp.Status, fmt.Sprint(resp.StatusCode))), raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			c.t.Fatalf("%s %s: body %q is not JSON: %v", method, path, raw, err)
		}
	}
	return r
}

// data decodes the answer's data into v.
func (r reply) data(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body.Data, v); err != nil {
		t.Fatalf("data %s: %v", r.body.Data, err)
	}
}

// taskOf waits for the task a method answered (200 and a UPID).
func (c client) taskOf(node string, r reply) map[string]any {
	c.t.Helper()
	var upid string
	r.data(c.t, &upid)
	if r.code != 200 {
		c.t.Fatalf("%d %s", r.code, r.raw)
	}
	return c.waitTask(node, upid)
}

// waitTask polls a task until it stops and returns its status.
func (c client) waitTask(node, upid string) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(testload.Scale(3 * time.Minute))
	for {
		r := c.do("GET", "/nodes/"+node+"/tasks/"+url.PathEscape(upid)+"/status", nil)
		if r.code != 200 {
			c.t.Fatalf("task status %s: %d %s %s", upid, r.code, r.reason, r.raw)
		}
		var st map[string]any
		r.data(c.t, &st)
		if st["status"] == "stopped" {
			return st
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("task %s still running", upid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tokenAuth(id, secret string) string { return "PVEAPIToken=" + id + "=" + secret }

// emu starts an emulator of version v with the CI token holding privs on
// /vms (propagated) and the VMs given.
func emu(t *testing.T, v Version, privs []string, vms ...VMSpec) (*Emulator, client) {
	t.Helper()
	return emuNodes(t, v, []string{"pve", "pve-2"}, privs, vms...)
}

// emuNodes is emu with the given nodes.
func emuNodes(t *testing.T, v Version, nodes, privs []string, vms ...VMSpec) (*Emulator, client) {
	t.Helper()
	e := Start(t, Options{Version: v, Nodes: nodes})
	if err := e.AddToken(Token{ID: tokID, Secret: tokSecret, ACL: []ACL{{Path: "/vms", Privs: privs, Propagate: true}}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range vms {
		if err := e.AddVM(s); err != nil {
			t.Fatal(err)
		}
	}
	return e, newClient(t, e, tokenAuth(tokID, tokSecret))
}

func TestVersion(t *testing.T) {
	for _, v := range Versions() {
		t.Run(v.String(), func(t *testing.T) {
			_, c := emu(t, v, nil)
			r := c.do("GET", "/version", nil)
			var got map[string]string
			r.data(t, &got)
			want := map[string]string{"version": v.Manager, "release": v.Release, "repoid": v.RepoID}
			if r.code != 200 || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("GET /version = %d %v; want 200 %v", r.code, got, want)
			}
		})
	}
}

func TestErrorAnswers(t *testing.T) {
	_, c := emu(t, PVE92(), []string{"VM.Audit"}, VMSpec{VMID: 101, Node: "pve", Name: "a", Running: true})
	for _, tc := range []struct {
		method, path string
		params       url.Values
		code         int
		reason       string
		errors       map[string]string
	}{
		{"GET", "/nodes/pve/qemu/101/nope", nil, 501, "Method 'GET /nodes/pve/qemu/101/nope' not implemented", nil},
		{"GET", "/nodes/pve/qemu/999/status/current", nil, 500, "Configuration file 'nodes/pve/qemu-server/999.conf' does not exist", nil},
		{"GET", "/nodes/pve-2/qemu/101/status/current", nil, 500, "Configuration file 'nodes/pve-2/qemu-server/101.conf' does not exist", nil},
		{"GET", "/nodes/pve/qemu/abc/status/current", nil, 400, "Parameter verification failed.",
			map[string]string{"vmid": "type check ('integer') failed - got 'abc'"}},
		{"GET", "/nodes/pve/qemu/99/status/current", nil, 400, "Parameter verification failed.",
			map[string]string{"vmid": "invalid format - value does not look like a valid VM ID\n"}},
		{"GET", "/nodes/pve/qemu/101/status/current", url.Values{"x": {"1"}}, 400, "Parameter verification failed.",
			map[string]string{"x": "property is not defined in schema and the schema does not allow additional properties"}},
		{"GET", "/cluster/resources", url.Values{"type": {"vms"}}, 400, "Parameter verification failed.",
			map[string]string{"type": "value 'vms' does not have a value in the enumeration 'vm, storage, node, sdn'"}},
		{"POST", "/nodes/pve/qemu/101/status/start", nil, 403, "Permission check failed (/vms/101, VM.PowerMgmt)", nil},
		{"GET", "/nodes/nosuch/qemu/101/status/current", nil, 500,
			"hostname lookup 'nosuch' failed - failed to get address info for: nosuch: Name or service not known", nil},
	} {
		r := c.do(tc.method, tc.path, tc.params)
		if r.code != tc.code || r.reason != tc.reason || fmt.Sprint(r.body.Errors) != fmt.Sprint(tc.errors) {
			t.Errorf("%s %s = %d %q errors %v; want %d %q errors %v", tc.method, tc.path, r.code, r.reason, r.body.Errors, tc.code, tc.reason, tc.errors)
		}
		// Formatter/Standard.pm: the message in the body is the handler's
		// (with its newline), data is null.
		if r.body.Message == nil || strings.TrimSuffix(*r.body.Message, "\n") != tc.reason || string(r.body.Data) != "null" {
			t.Errorf("%s %s body = %s; want data null and message %q", tc.method, tc.path, r.raw, tc.reason)
		}
	}
}

func TestAuthentication(t *testing.T) {
	e, _ := emu(t, PVE84(), []string{"VM.Audit"})
	for _, tc := range []struct {
		auth, reason string
	}{
		{"", "No ticket"},
		{tokenAuth(tokID, "wrong"), "Authentication failed!"},
		{tokenAuth("nobody@pve!x1", tokSecret), "Authentication failed!"},
		{"PVEAPIToken=" + tokID, "Authentication failed!"},
		{"Bearer " + tokSecret, "No ticket"},
	} {
		t.Run(tc.auth, func(t *testing.T) {
			t.Parallel()
			c := newClient(t, e, tc.auth)
			start := time.Now()
			r := c.do("GET", "/version", nil)
			took := time.Since(start)
			if r.code != 401 || r.reason != tc.reason || r.raw != "" {
				t.Errorf("GET /version with %q = %d %q %q; want 401 %q and no body", tc.auth, r.code, r.reason, r.raw, tc.reason)
			}
			if took < authFailureDelay {
				t.Errorf("GET /version with %q answered after %v; want the %v delay of a refused login", tc.auth, took, authFailureDelay)
			}
		})
	}
}

// TestAgentPrivileges: which privilege each agent method names in its 403,
// per version (qemu-server commit b92a40ce).
func TestAgentPrivileges(t *testing.T) {
	for _, tc := range []struct {
		v                       Version
		exec, info, read, write string
	}{
		{PVE84(), "VM.Monitor", "VM.Monitor", "VM.Monitor", "VM.Monitor"},
		{PVE90(), "VM.GuestAgent.Unrestricted", "VM.GuestAgent.Audit|VM.GuestAgent.Unrestricted",
			"VM.GuestAgent.FileRead|VM.GuestAgent.Unrestricted", "VM.GuestAgent.FileWrite|VM.GuestAgent.Unrestricted"},
		{PVE92(), "VM.GuestAgent.Unrestricted", "VM.GuestAgent.Audit|VM.GuestAgent.Unrestricted",
			"VM.GuestAgent.FileRead|VM.GuestAgent.Unrestricted", "VM.GuestAgent.FileWrite|VM.GuestAgent.Unrestricted"},
	} {
		t.Run(tc.v.String(), func(t *testing.T) {
			_, c := emu(t, tc.v, []string{"VM.Audit"}, VMSpec{VMID: 101, Node: "pve", Running: true})
			for _, x := range []struct {
				method, path, priv string
			}{
				{"POST", "exec", tc.exec}, {"GET", "exec-status", tc.exec}, {"GET", "info", tc.info},
				{"POST", "ping", tc.info}, {"GET", "file-read", tc.read}, {"POST", "file-write", tc.write},
				{"GET", "network-get-interfaces", tc.info},
			} {
				r := c.do(x.method, "/nodes/pve/qemu/101/agent/"+x.path, nil)
				want := "Permission check failed (/vms/101, " + x.priv + ")"
				if r.code != 403 || r.reason != want {
					t.Errorf("%s agent/%s without privileges = %d %q; want 403 %q", x.method, x.path, r.code, r.reason, want)
				}
			}
		})
	}
}

func TestAccessPermissions(t *testing.T) {
	e := Start(t, Options{Version: PVE92()})
	e.AddToken(Token{ID: tokID, Secret: tokSecret, ACL: []ACL{
		{Path: "/vms", Privs: []string{"VM.Audit"}, Propagate: true},
		{Path: "/vms/101", Privs: []string{"VM.Audit", "VM.PowerMgmt"}},
	}})
	c := newClient(t, e, tokenAuth(tokID, tokSecret))
	var all map[string]map[string]int
	c.do("GET", "/access/permissions", nil).data(t, &all)
	want := map[string]map[string]int{"/vms": {"VM.Audit": 1}, "/vms/101": {"VM.Audit": 0, "VM.PowerMgmt": 0}}
	if fmt.Sprint(all) != fmt.Sprint(want) {
		t.Errorf("GET /access/permissions = %v; want %v", all, want)
	}
	var one map[string]map[string]int
	c.do("GET", "/access/permissions", url.Values{"path": {"/vms/102"}}).data(t, &one)
	if fmt.Sprint(one) != fmt.Sprint(map[string]map[string]int{"/vms/102": {"VM.Audit": 1}}) {
		t.Errorf("GET /access/permissions?path=/vms/102 = %v; want VM.Audit inherited from /vms", one)
	}
	// Another token's permissions need Sys.Audit on /access.
	r := c.do("GET", "/access/permissions", url.Values{"userid": {"root@pam"}})
	if r.code != 403 || r.reason != "Permission check failed (/access, Sys.Audit)" {
		t.Errorf("GET /access/permissions?userid=root@pam = %d %q; want 403 naming /access, Sys.Audit", r.code, r.reason)
	}
}

// TestPowerTasks: power methods answer a UPID at once; failures are only in
// the task's exit status, except reset and reboot of a stopped VM, which
// fail before forking.
func TestPowerTasks(t *testing.T) {
	_, c := emu(t, PVE92(), allVMPrivs(PVE92()), VMSpec{VMID: 102, Node: "pve-2", Name: "off"})
	post := func(action string) reply { return c.do("POST", "/nodes/pve-2/qemu/102/status/"+action, url.Values{}) }
	task := func(action, want string) {
		t.Helper()
		r := post(action)
		var upid string
		r.data(t, &upid)
		if r.code != 200 || !upidRE.MatchString(upid) || !strings.Contains(upid, ":qm"+action+":102:"+tokID+":") {
			t.Fatalf("POST status/%s = %d %s; want 200 and a qm%s UPID", action, r.code, r.raw, action)
		}
		st := c.waitTask("pve-2", upid)
		if st["exitstatus"] != want || st["user"] != "vmgate@pve" || st["tokenid"] != "ci" {
			t.Errorf("task of status/%s = %v; want exitstatus %q, user vmgate@pve, tokenid ci", action, st, want)
		}
	}
	task("stop", "OK") // stopping a stopped VM does nothing
	for _, a := range []string{"reset", "reboot"} {
		if r := post(a); r.code != 500 || r.reason != "VM 102 not running" {
			t.Errorf("POST status/%s of a stopped VM = %d %q; want 500 %q", a, r.code, r.reason, "VM 102 not running")
		}
	}
	task("start", "OK")
	task("start", "VM 102 already running")
	task("reset", "OK")
	task("stop", "OK")
	for _, tc := range []struct{ upid, err string }{
		{"bogus", "unable to parse worker upid"},
		{"UPID:pve-2:00000001:00000002:00000003:qmstart:102:vmgate@pve!ci:", "no such task"},
	} {
		r := c.do("GET", "/nodes/pve-2/tasks/"+url.PathEscape(tc.upid)+"/status", nil)
		if r.code != 400 || r.body.Errors["upid"] != tc.err {
			t.Errorf("GET tasks/%s/status = %d %v; want 400 with upid: %q", tc.upid, r.code, r.body.Errors, tc.err)
		}
	}
}

// TestClusterResources: VMs without VM.Audit are left out; a VM pvestatd
// has not sampled yet is "unknown".
func TestClusterResources(t *testing.T) {
	e := Start(t, Options{Version: PVE84()})
	e.AddToken(Token{ID: tokID, Secret: tokSecret, ACL: []ACL{{Path: "/vms/101", Privs: []string{"VM.Audit"}}, {Path: "/vms/103", Privs: []string{"VM.Audit"}}}})
	e.AddVM(VMSpec{VMID: 101, Node: "pve", Name: "a", Running: true})
	e.AddVM(VMSpec{VMID: 102, Node: "pve", Name: "hidden"})
	c := newClient(t, e, tokenAuth(tokID, tokSecret))
	var first []map[string]any
	c.do("GET", "/cluster/resources", url.Values{"type": {"vm"}}).data(t, &first)
	e.AddVM(VMSpec{VMID: 103, Node: "pve", Name: "new", Running: true})
	var second []map[string]any
	c.do("GET", "/cluster/resources", url.Values{"type": {"vm"}}).data(t, &second)
	got := func(l []map[string]any) string {
		var s []string
		for _, x := range l {
			s = append(s, fmt.Sprintf("%v:%v", x["vmid"], x["status"]))
		}
		return strings.Join(s, " ")
	}
	if got(first) != "101:running" || got(second) != "101:running 103:unknown" {
		t.Errorf("cluster/resources = %q then %q; want %q then %q", got(first), got(second), "101:running", "101:running 103:unknown")
	}
}

func TestFileReadCountByVersion(t *testing.T) {
	for _, tc := range []struct {
		v    Version
		code int
	}{{PVE84(), 400}, {PVE91(), 400}, {PVE92(), 500}} {
		_, c := emu(t, tc.v, allVMPrivs(tc.v), VMSpec{VMID: 101, Node: "pve", Running: true})
		// 500 once count is known: the VM has no agent behind it.
		r := c.do("GET", "/nodes/pve/qemu/101/agent/file-read", url.Values{"file": {"/etc/hostname"}, "count": {"10"}})
		if r.code != tc.code {
			t.Errorf("%s: file-read with count = %d %q %v; want %d", tc.v, r.code, r.reason, r.body.Errors, tc.code)
		}
		if tc.code == 400 && !strings.Contains(r.body.Errors["count"], "property is not defined in schema") {
			t.Errorf("%s: file-read with count errors %v; want count not defined", tc.v, r.body.Errors)
		}
		if tc.code == 500 && r.reason != "QEMU guest agent is not running" {
			t.Errorf("%s: file-read with count = %q; want the agent check", tc.v, r.reason)
		}
	}
}

// TestCloneDestroy: clone and destroy are tasks with their early checks
// answered at once.
func TestCloneDestroy(t *testing.T) {
	_, c := emu(t, PVE92(), allVMPrivs(PVE92()), VMSpec{VMID: 101, Node: "pve", Name: "tmpl", Running: true})
	task := func(r reply) map[string]any { t.Helper(); return c.taskOf("pve", r) }
	if st := task(c.do("POST", "/nodes/pve/qemu/101/clone", url.Values{"newid": {"150"}})); st["exitstatus"] != "OK" || st["type"] != "qmclone" || st["id"] != "101" {
		t.Fatalf("clone task = %v; want a qmclone task of 101 ending OK", st)
	}
	var cur map[string]any
	c.do("GET", "/nodes/pve/qemu/150/status/current", nil).data(t, &cur)
	if cur["name"] != "Copy-of-VM-tmpl" || cur["status"] != "stopped" {
		t.Errorf("clone's status/current = %v; want Copy-of-VM-tmpl, stopped", cur)
	}
	for _, tc := range []struct {
		method, path string
		params       url.Values
		reason       string
	}{
		{"POST", "/nodes/pve/qemu/101/clone", url.Values{"newid": {"150"}}, "unable to create VM 150: config file already exists"},
		{"POST", "/nodes/pve/qemu/101/clone", url.Values{"newid": {"151"}, "snapname": {"nope"}}, "snapshot 'nope' does not exist"},
		{"DELETE", "/nodes/pve/qemu/101", nil, "VM 101 is running - destroy failed"},
	} {
		if r := c.do(tc.method, tc.path, tc.params); r.code != 500 || r.reason != tc.reason {
			t.Errorf("%s %s = %d %q; want 500 %q", tc.method, tc.path, r.code, r.reason, tc.reason)
		}
	}
	if st := task(c.do("DELETE", "/nodes/pve/qemu/150", nil)); st["exitstatus"] != "OK" || st["type"] != "qmdestroy" {
		t.Fatalf("destroy task = %v; want qmdestroy OK", st)
	}
	if r := c.do("GET", "/nodes/pve/qemu/150/status/current", nil); r.code != 500 || r.reason != "Configuration file 'nodes/pve/qemu-server/150.conf' does not exist" {
		t.Errorf("status/current of a destroyed VM = %d %q; want its config gone", r.code, r.reason)
	}
	var rrd []map[string]any
	c.do("GET", "/nodes/pve/qemu/101/rrddata", url.Values{"timeframe": {"hour"}}).data(t, &rrd)
	if len(rrd) != 70 || rrd[69]["maxmem"] == nil || rrd[0]["time"] == nil {
		t.Errorf("rrddata = %d points, last %v; want 70 with the current values last", len(rrd), rrd[len(rrd)-1])
	}
}

// TestHostileRequests: what pve-http-server refuses before any handler runs
// (AnyEvent.pm: body size, a body on GET, the format) and a body that is not
// JSON.
func TestHostileRequests(t *testing.T) {
	e, c := emu(t, PVE92(), allVMPrivs(PVE92()), VMSpec{VMID: 101, Node: "pve", Running: true})
	for _, tc := range []struct {
		method, path, ctype, body string
		code                      int
		reason                    string
	}{
		{"POST", "/api2/json/nodes/pve/qemu/101/status/stop", "application/json", strings.Repeat(" ", maxPost+1), 501, "for data too large"},
		{"GET", "/api2/json/version", "application/json", "{}", 501, "Unexpected content for method 'GET'"},
		{"GET", "/api2/xml/version", "", "", 501, "no formatter for uri /version, xml"},
		{"GET", "/nothing", "", "", 501, "no such uri"},
		{"POST", "/api2/json/nodes/pve/qemu/101/status/stop", "application/json", "{not json", 500, "malformed JSON string: invalid character 'n' looking for beginning of object key string"},
	} {
		req, _ := http.NewRequest(tc.method, e.URL()+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", tokenAuth(tokID, tokSecret))
		if tc.ctype != "" {
			req.Header.Set("Content-Type", tc.ctype)
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		resp.Body.Close()
		reason := strings.TrimSpace(strings.TrimPrefix(resp.Status, fmt.Sprint(resp.StatusCode)))
		if resp.StatusCode != tc.code || reason != tc.reason {
			t.Errorf("%s %s (%d bytes) = %d %q; want %d %q", tc.method, tc.path, len(tc.body), resp.StatusCode, reason, tc.code, tc.reason)
		}
	}
	if !e.Running(101) {
		t.Errorf("VM 101 stopped by a refused request")
	}
}
