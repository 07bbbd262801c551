package proxmox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/luthermonson/go-proxmox"

	"github.com/vmgate/vmgate/hypervisor"
)

// realDir holds real Proxmox VE answers from public material (see its README).
const realDir = "../../testdata/proxmox"

// readReal reads a .response file: the status code and reason, then the body.
func readReal(t *testing.T, name string) (int, string, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(realDir, name+".response"))
	if err != nil {
		t.Fatal(err)
	}
	line, body, _ := bytes.Cut(raw, []byte("\n"))
	codeStr, reason, _ := strings.Cut(string(line), " ")
	code, err := strconv.Atoi(codeStr)
	if err != nil {
		t.Fatalf("%s: status line %q", name, line)
	}
	return code, reason, body
}

// replayServer answers every request with exactly that status line and body.
func replayServer(t *testing.T, code int, reason string, body []byte) Config {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", code, reason, len(body), body)
		buf.Flush()
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte(emuSecret+"\n"), 0o600)
	return Config{URL: srv.URL, TokenID: emuTokenID, TokenSecretFile: secret, CAFile: ca}
}

// TestRealAnswers parses answers real Proxmox VE servers gave into the
// driver's errors.
func TestRealAnswers(t *testing.T) {
	for _, tc := range []struct {
		file   string
		msg    string
		errors map[string]string
		want   []error
	}{
		{"agent-not-running", "QEMU guest agent is not running", nil, []error{hypervisor.ErrAgentUnavailable}},
		{"exec-status-no-pid", "Parameter verification failed.", map[string]string{"pid": "property is missing and it is not optional"},
			[]error{hypervisor.ErrBackend}},
		// Before pve-http-server 5.2 the body had no message: the status
		// line's reason is all there is.
		{"permission-no-message", "Permission check failed", nil, []error{hypervisor.ErrBackend, ErrAuth}},
	} {
		code, reason, body := readReal(t, tc.file)
		d := newDriver(t, replayServer(t, code, reason, body))
		var out map[string]any
		err := d.api.do(ctxT(t), "GET", "/nodes/pve/qemu/101/agent/exec-status", nil, nil, &out)
		var ae *APIError
		if !errors.As(err, &ae) || ae.StatusCode != code || ae.Message != tc.msg || fmt.Sprint(ae.Errors) != fmt.Sprint(tc.errors) {
			t.Errorf("%s: do() = %v; want an APIError %d %q %v", tc.file, err, code, tc.msg, tc.errors)
			continue
		}
		mapped := d.classify("exec status", agentErr("guest-exec-status", err))
		for _, w := range tc.want {
			if !errors.Is(mapped, w) {
				t.Errorf("%s: classify() = %v; want %v", tc.file, mapped, w)
			}
		}
	}
}

// TestRealUPIDs: the UPIDs pve-common's own tests decode, and the ones it
// refuses.
func TestRealUPIDs(t *testing.T) {
	for file, valid := range map[string]bool{"upids.valid": true, "upids.invalid": false} {
		f, err := os.Open(filepath.Join(realDir, file))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		n := 0
		for sc.Scan() {
			upid := sc.Text()
			n++
			m := upidRE.FindStringSubmatch(upid)
			if (m != nil) != valid {
				t.Errorf("upidRE.Match(%q) = %v; want %v", upid, m != nil, valid)
				continue
			}
			if valid {
				if task := proxmox.NewTask(proxmox.UPID(upid), nil); task.Node != m[1] || task.Type != m[6] || task.ID != m[7] {
					t.Errorf("NewTask(%q) = node %q type %q id %q; want %q %q %q", upid, task.Node, task.Type, task.ID, m[1], m[6], m[7])
				}
			}
		}
		f.Close()
		if n == 0 {
			t.Errorf("%s holds no UPID", file)
		}
	}
}

// hostileServer lists VM 101 on node pve and answers status/start with
// startData; a task status says running forever.
func hostileServer(t *testing.T, startData string) Config {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/cluster/resources"):
			fmt.Fprint(w, `{"data":[{"id":"qemu/101","vmid":101,"node":"pve","type":"qemu","status":"running"}]}`)
		case strings.HasSuffix(r.URL.Path, "/status/start"):
			fmt.Fprintf(w, `{"data":%s}`, startData)
		case strings.Contains(r.URL.Path, "/tasks/"):
			fmt.Fprint(w, `{"data":{"status":"running","type":"qmstart","id":"101","node":"pve"}}`)
		default:
			http.Error(w, "no", http.StatusNotImplemented)
		}
	}))
	t.Cleanup(srv.Close)
	cfg := replayServer(t, 200, "OK", nil)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	cfg.URL, cfg.CAFile = srv.URL, ca
	return cfg
}

// TestHostileTaskAnswers: a power answer that is not a UPID of the VM's
// node is refused (go-proxmox's NewTask would index past a short one), and
// a task that never ends ends the wait at the caller's deadline.
func TestHostileTaskAnswers(t *testing.T) {
	for _, data := range []string{`"UPID:a:b:c:d:e:f"`, `"UPID:other:00000001:00000002:00000003:qmstart:101:x@pve!t:"`, `"../../etc"`, `42`, `null`, `""`} {
		d := newDriver(t, hostileServer(t, data))
		err := d.Power(ctxT(t), "101", hypervisor.PowerStart)
		if !errors.Is(err, hypervisor.ErrBackend) {
			t.Errorf("Power(start) answered %s = %v; want %v", data, err, hypervisor.ErrBackend)
		}
	}
	d := newDriver(t, hostileServer(t, `"UPID:pve:00000001:00000002:00000003:qmstart:101:vmgate@pve!ci:"`))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := d.Power(ctx, "101", hypervisor.PowerStart); !errors.Is(err, hypervisor.ErrTimeout) {
		t.Errorf("Power(start) with a task that never ends = %v; want %v", err, hypervisor.ErrTimeout)
	}
}

// TestOpenWithoutPermissionsAPI: a server that cannot answer the privilege
// check (here 501 for /access/permissions) still gives a driver; only a
// refused token or one that sees no VM stops Open.
func TestOpenWithoutPermissionsAPI(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/version") {
			fmt.Fprint(w, `{"data":{"version":"9.2.11","release":"9.2","repoid":"f6997e698c7933ea"}}`)
			return
		}
		w.WriteHeader(http.StatusNotImplemented)
	}))
	t.Cleanup(srv.Close)
	cfg := replayServer(t, 200, "OK", nil)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	cfg.URL, cfg.CAFile, cfg.Logger = srv.URL, ca, quietLogger()
	d, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("Open() against a server without /access/permissions = %v; want a driver", err)
	}
	defer d.Close()
	if d.pveMajor() != 9 {
		t.Errorf("Open() read major version %d; want 9", d.pveMajor())
	}
}

// TestRealCluster: real cluster/resources answers give the VMs their nodes
// (storage entries skipped), a VM whose node long went silent is unknown,
// and pveproxy's real 595 for an offline node is the node's error.
func TestRealCluster(t *testing.T) {
	for _, tc := range []struct {
		file string
		want string
	}{
		{"cluster-resources.json", "[{100 running node node2, server1 false} {101 stopped node node1, leap154 false} {102 stopped node node1, machine-test false} {200 stopped node node1, VM 200 false}]"},
		{"cluster-resources-offline-vm.json", "[{1002 unknown node pve2 false}]"},
	} {
		raw, err := os.ReadFile(filepath.Join(realDir, tc.file))
		if err != nil {
			t.Fatal(err)
		}
		var env struct{ Data json.RawMessage }
		if err := json.Unmarshal(raw, &env); err != nil {
			t.Fatal(err)
		}
		cfg, s := scriptServer(t, []step{{req: "GET /cluster/resources", data: string(env.Data)}})
		vms, err := newDriver(t, cfg).ListVMs(ctxT(t))
		s.done(t, tc.file)
		if got := fmt.Sprint(vms); err != nil || got != tc.want {
			t.Errorf("ListVMs() of %s = %s, %v; want %s", tc.file, got, err, tc.want)
		}
	}

	code, reason, body := readReal(t, "proxy-no-route")
	if code != 595 || len(body) != 0 {
		t.Fatalf("proxy-no-route.response = %d %q %q; want a 595 without a body", code, reason, body)
	}
	cfg, s := scriptServer(t, []step{resources("101@dell", "dell=online"),
		{req: "POST /nodes/dell/qemu/101/status/start", code: code, data: reason}})
	err := newDriver(t, cfg).Power(ctxT(t), "101", hypervisor.PowerStart)
	s.done(t, "start on an offline node")
	var ne *NodeError
	if !errors.As(err, &ne) || ne.Node != "dell" || !errors.Is(err, hypervisor.ErrBackend) || !strings.Contains(err.Error(), "HTTP 595: No route to host") {
		t.Errorf("Power(start) answered the real 595 = %v; want a NodeError for node dell with Proxmox's words", err)
	}
}
