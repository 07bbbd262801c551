package proxmox

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// step is one request a scripted server expects and its answer: code 0 is
// 200 with data as the answer's "data"; 500 an error with data as its
// message; 595 pveproxy's answer to a forward that failed (no body).
type step struct {
	req  string // "METHOD /path?query" under /api2/json
	code int
	data string
}

// scripted is a Proxmox API that expects the steps' requests in order.
type scripted struct {
	mu    sync.Mutex
	steps []step
	errs  []string
}

// scriptServer serves steps and returns a Config for it.
func scriptServer(t *testing.T, steps []step) (Config, *scripted) {
	t.Helper()
	s := &scripted{steps: steps}
	srv := httptest.NewTLSServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	return serverConfig(t, srv), s
}

func (s *scripted) serve(w http.ResponseWriter, r *http.Request) {
	got := r.Method + " " + strings.TrimPrefix(r.URL.RequestURI(), "/api2/json")
	s.mu.Lock()
	if len(s.steps) == 0 || s.steps[0].req != got {
		want := "nothing"
		if len(s.steps) > 0 {
			want = s.steps[0].req
		}
		s.errs = append(s.errs, fmt.Sprintf("request %q; want %s", got, want))
		s.mu.Unlock()
		http.Error(w, "unexpected", http.StatusNotImplemented)
		return
	}
	st := s.steps[0]
	s.steps = s.steps[1:]
	s.mu.Unlock()
	switch st.code {
	case 0:
		fmt.Fprintf(w, `{"data":%s}`, st.data)
	case 595:
		conn, buf, _ := w.(http.Hijacker).Hijack()
		fmt.Fprintf(buf, "HTTP/1.1 595 %s\r\nConnection: close\r\n\r\n", st.data)
		buf.Flush()
		conn.Close()
	default:
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
		w.WriteHeader(st.code)
		fmt.Fprintf(w, `{"data":null,"message":%q}`, st.data+"\n")
	}
}

// done reports requests that were not expected and steps never reached.
func (s *scripted) done(t *testing.T, name string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.errs {
		t.Errorf("%s: %s", name, e)
	}
	for _, st := range s.steps {
		t.Errorf("%s: request %q never came", name, st.req)
	}
}

// serverConfig is a driver Config for srv (its certificate trusted).
func serverConfig(t *testing.T, srv *httptest.Server) Config {
	t.Helper()
	dir := t.TempDir()
	ca, secret := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "secret")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte(emuSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Config{URL: srv.URL, TokenID: emuTokenID, TokenSecretFile: secret, CAFile: ca}
}

// resources is a /cluster/resources answer: "VMID@NODE" VMs (stopped,
// named vm-VMID) and "NODE=STATE" nodes.
func resources(entries ...string) step {
	var items []string
	for _, e := range entries {
		if vm, node, ok := strings.Cut(e, "@"); ok {
			items = append(items, fmt.Sprintf(`{"id":"qemu/%s","vmid":%s,"node":%q,"type":"qemu","status":"stopped","name":"vm-%s"}`, vm, vm, node, vm))
			continue
		}
		node, state, _ := strings.Cut(e, "=")
		items = append(items, fmt.Sprintf(`{"id":"node/%s","node":%q,"type":"node","status":%q}`, node, node, state))
	}
	return step{req: "GET /cluster/resources", data: "[" + strings.Join(items, ",") + "]"}
}

// task is a POST that starts a task of VM 101 on node, and its status.
func task(path, node, typ, exit string) []step {
	upid := fmt.Sprintf("UPID:%s:00000010:00000020:00000030:%s:101:%s:", node, typ, emuTokenID)
	return []step{
		{req: "POST " + path, data: fmt.Sprintf("%q", upid)},
		{req: "GET /nodes/" + node + "/tasks/" + upid + "/status",
			data: fmt.Sprintf(`{"upid":%q,"node":%q,"type":%q,"id":"101","status":"stopped","exitstatus":%q}`, upid, node, typ, exit)},
	}
}

func join(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

const (
	stopped     = `{"status":"stopped"}`
	noConf      = "Configuration file 'nodes/pve/qemu-server/101.conf' does not exist"
	notOnPVE    = "unable to find configuration file for VM 101 on node 'pve'"
	noConfPVE2  = "Configuration file 'nodes/pve-2/qemu-server/101.conf' does not exist"
	noConfOther = "Configuration file 'nodes/pve-9/qemu-server/101.conf' does not exist"
)

// placementCall is what a placement case does with the driver.
type placementCall func(t *testing.T, d *Driver) (string, error)

// status is Status(101) as "STATE DETAIL".
func status(t *testing.T, d *Driver) (string, error) {
	st, err := d.Status(ctxT(t), "101")
	return fmt.Sprintf("%s %s", st.State, st.Detail), err
}

// statusTwice is status, then status with the view stale.
func statusTwice(t *testing.T, d *Driver) (string, error) {
	if _, err := status(t, d); err != nil {
		return "", err
	}
	d.place.now = func() time.Time { return time.Now().Add(nodeTTL) }
	return status(t, d)
}

// statusBoth is status twice, both results.
func statusBoth(t *testing.T, d *Driver) (string, error) {
	a, _ := status(t, d)
	b, err := status(t, d)
	return a + "; " + b, err
}

func power(a hypervisor.PowerAction) placementCall {
	return func(t *testing.T, d *Driver) (string, error) { return "", d.Power(ctxT(t), "101", a) }
}

// placementCases: how the driver finds a VM's node, trusts it, follows a
// VM that moved, and treats an offline node.
var placementCases = []struct {
	name    string
	steps   []step
	call    placementCall
	want    string   // the call's result
	wantErr []error  // the error is all of these
	errHas  []string // and says these
}{
	{name: "one read for two calls",
		steps: []step{resources("101@pve", "pve=online"), {req: "GET /nodes/pve/qemu/101/status/current", data: stopped},
			{req: "GET /nodes/pve/qemu/101/status/current", data: stopped}},
		call: func(t *testing.T, d *Driver) (string, error) { status(t, d); return status(t, d) }, want: "stopped stopped"},
	{name: "a stale view is read again",
		steps: []step{resources("101@pve"), {req: "GET /nodes/pve/qemu/101/status/current", data: stopped},
			resources("101@pve-2"), {req: "GET /nodes/pve-2/qemu/101/status/current", data: stopped}},
		call: statusTwice, want: "stopped stopped"},
	{name: "load_config's wrong node: read again, sent again",
		steps: []step{resources("101@pve"), {req: "GET /nodes/pve/qemu/101/status/current", code: 500, data: noConf},
			resources("101@pve-2"), {req: "GET /nodes/pve-2/qemu/101/status/current", data: stopped}},
		call: status, want: "stopped stopped"},
	{name: "check_running's wrong node (reset): sent again",
		steps: join([]step{resources("101@pve"), {req: "POST /nodes/pve/qemu/101/status/reset", code: 500, data: notOnPVE},
			resources("101@pve-2")}, task("/nodes/pve-2/qemu/101/status/reset", "pve-2", "qmreset", "OK")),
		call: power(hypervisor.PowerReset)},
	{name: "a task that found no config (stop) is started again on the new node",
		steps: join([]step{resources("101@pve")}, task("/nodes/pve/qemu/101/status/stop", "pve", "qmstop", notOnPVE),
			[]step{resources("101@pve-2")}, task("/nodes/pve-2/qemu/101/status/stop", "pve-2", "qmstop", "OK")),
		call: power(hypervisor.PowerStop)},
	{name: "a task is started again once only",
		steps: join([]step{resources("101@pve")}, task("/nodes/pve/qemu/101/status/start", "pve", "qmstart", noConf),
			[]step{resources("101@pve-2")}, task("/nodes/pve-2/qemu/101/status/start", "pve-2", "qmstart", noConfPVE2)),
		call: power(hypervisor.PowerStart), wantErr: []error{hypervisor.ErrBackend}, errHas: []string{noConfPVE2}},
	{name: "sent again once only",
		steps: []step{resources("101@pve"), {req: "GET /nodes/pve/qemu/101/status/current", code: 500, data: noConf},
			resources("101@pve-2"), {req: "GET /nodes/pve-2/qemu/101/status/current", code: 500, data: noConfPVE2}},
		call: status, wantErr: []error{hypervisor.ErrUnknownVM}},
	{name: "a VM gone from the cluster is unknown",
		steps: []step{resources("101@pve"), {req: "GET /nodes/pve/qemu/101/status/current", code: 500, data: noConf},
			resources("102@pve")},
		call: status, wantErr: []error{hypervisor.ErrUnknownVM}},
	{name: "a VM the cluster still puts there is unknown",
		steps: []step{resources("101@pve"), {req: "GET /nodes/pve/qemu/101/status/current", code: 500, data: noConf},
			resources("101@pve")},
		call: status, wantErr: []error{hypervisor.ErrUnknownVM}},
	{name: "words naming another node are no move",
		steps: []step{resources("101@pve"), {req: "GET /nodes/pve/qemu/101/status/current", code: 500, data: noConfOther}},
		call:  status, wantErr: []error{hypervisor.ErrUnknownVM}},
	{name: "a VM on an offline node: nothing sent to it",
		steps: []step{resources("101@pve-3", "pve=online", "pve-3=offline")},
		call:  power(hypervisor.PowerStart), wantErr: []error{hypervisor.ErrBackend},
		errHas: []string{"VM 101 is on node pve-3, which is offline"}},
	{name: "the status of a VM on an offline node is unknown",
		steps: []step{resources("101@pve-3", "pve-3=offline")},
		call:  status, want: "unknown node pve-3 offline"},
	{name: "a VM that moved to an offline node",
		steps: []step{resources("101@pve"), {req: "POST /nodes/pve/qemu/101/status/reset", code: 500, data: notOnPVE},
			resources("101@pve-3", "pve-3=offline")},
		call: power(hypervisor.PowerReset), wantErr: []error{hypervisor.ErrBackend}, errHas: []string{"node pve-3, which is offline"}},
	{name: "a node Proxmox cannot reach: never sent again",
		steps: []step{resources("101@pve-3", "pve-3=online"), {req: "POST /nodes/pve-3/qemu/101/status/reset", code: 595, data: "No route to host"}},
		call:  power(hypervisor.PowerReset), wantErr: []error{hypervisor.ErrBackend},
		errHas: []string{"could not reach node pve-3", "No route to host"}},
	{name: "after an unreachable node the view is read again",
		steps: []step{resources("101@pve-3", "pve-3=online"), {req: "GET /nodes/pve-3/qemu/101/status/current", code: 595, data: "No route to host"},
			resources("101@pve-3", "pve-3=offline")},
		call: statusBoth,
		want: "unknown node pve-3 unreachable: HTTP 595: No route to host; unknown node pve-3 offline"},
	{name: "a node lost during a task",
		steps: []step{resources("101@pve-3", "pve-3=online"), {req: "POST /nodes/pve-3/qemu/101/status/start", data: `"UPID:pve-3:00000010:00000020:00000030:qmstart:101:` + emuTokenID + `:"`},
			{req: "GET /nodes/pve-3/tasks/UPID:pve-3:00000010:00000020:00000030:qmstart:101:" + emuTokenID + ":/status", code: 595, data: "No route to host"}},
		call: power(hypervisor.PowerStart), wantErr: []error{hypervisor.ErrBackend}, errHas: []string{"could not reach node pve-3", "No route to host"}},
}

// TestPlacement runs placementCases: the exact requests, in order, against
// answers worded as Proxmox words them.
func TestPlacement(t *testing.T) {
	for _, tc := range placementCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, s := scriptServer(t, tc.steps)
			d := newDriver(t, cfg)
			got, err := tc.call(t, d)
			s.done(t, tc.name)
			if len(tc.wantErr) == 0 && (err != nil || got != tc.want) {
				t.Errorf("%s = %q, %v; want %q, nil", tc.name, got, err, tc.want)
			}
			for _, w := range tc.wantErr {
				if !errors.Is(err, w) {
					t.Errorf("%s error = %v; want %v", tc.name, err, w)
				}
			}
			for _, w := range tc.errHas {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("%s error = %v; want it to say %q", tc.name, err, w)
				}
			}
		})
	}
}

// TestListVMsOffline: a VM on an offline node is listed with state unknown
// whatever its last broadcast said, and its node's state in its info.
func TestListVMsOffline(t *testing.T) {
	st := resources("101@pve", "104@pve-3", "pve=online", "pve-3=offline")
	st.data = strings.Replace(st.data, `"status":"stopped","name":"vm-104"`, `"status":"running","name":"vm-104"`, 1)
	cfg, s := scriptServer(t, []step{st})
	d := newDriver(t, cfg)
	vms, err := d.ListVMs(ctxT(t))
	s.done(t, "ListVMs")
	got := fmt.Sprint(vms)
	want := "[{101 stopped node pve, vm-101 false} {104 unknown node pve-3 (offline), vm-104 false}]"
	if err != nil || got != want {
		t.Errorf("ListVMs() = %s, %v; want %s", got, err, want)
	}
}

// TestWrongNodeMessage: the words that mean "not on this node", and only
// for the node and VM the request named.
func TestWrongNodeMessage(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want bool
	}{
		{noConf, true},
		{notOnPVE, true},
		{noConfPVE2, false},
		{noConfOther, false},
		{"Configuration file 'nodes/pve/qemu-server/1010.conf' does not exist", false},
		{"unable to find configuration file for VM 1010 on node 'pve'", false},
		{"unable to find configuration file for CT 101 on node 'pve'", false},
		{"Configuration file 'nodes/pve/lxc/101.conf' does not exist", false},
		{noConf + " ", false},
		{"x" + noConf, false},
		{"VM 101 not running", false},
	} {
		if got := wrongNodeMessage(tc.msg, "pve", 101); got != tc.want {
			t.Errorf("wrongNodeMessage(%q, pve, 101) = %v; want %v", tc.msg, got, tc.want)
		}
	}
}

// TestViewReadsShared: concurrent calls on a driver that has no view yet
// share one read of /cluster/resources.
func TestViewReadsShared(t *testing.T) {
	steps := []step{resources("101@pve")}
	for range 16 {
		steps = append(steps, step{req: "GET /nodes/pve/qemu/101/status/current", data: stopped})
	}
	cfg, s := scriptServer(t, steps)
	d := newDriver(t, cfg)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if _, err := d.Status(ctxT(t), "101"); err != nil {
				t.Errorf("Status(101) = %v", err)
			}
		})
	}
	wg.Wait()
	s.done(t, "16 concurrent Status calls")
}

// TestViewReadOutlivesCaller: a caller that gives up does not fail the
// read it started, which another caller waits for.
func TestViewReadOutlivesCaller(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		fmt.Fprint(w, `{"data":[{"id":"qemu/101","vmid":101,"node":"pve","type":"qemu","status":"stopped"}]}`)
	}))
	var once sync.Once
	t.Cleanup(srv.Close)
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	d := newDriver(t, serverConfig(t, srv))
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error)
	go func() { _, err := d.ListVMs(ctx); first <- err }()
	<-arrived // the first caller's read is in flight
	second := make(chan error)
	go func() { _, err := d.ListVMs(ctxT(t)); second <- err }()
	for d.place.waiters() < 2 { // both wait for the read in flight
		runtime.Gosched()
	}
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("ListVMs() cancelled = %v; want %v", err, context.Canceled)
	}
	once.Do(func() { close(release) })
	if err := <-second; err != nil {
		t.Errorf("ListVMs() waiting on the read of a caller that gave up = %v; want nil", err)
	}
	select {
	case <-arrived:
		t.Errorf("the second ListVMs() sent a read of its own; want it to share the first's")
	default:
	}
}
