package proxmox

// The Proxmox VE API emulator the tests run the driver against: an
// httptest TLS server with Proxmox's envelopes ({"data": …}), its error
// answers (the message in the HTTP status line, parameter errors in
// {"data":null,"errors":{…}}), the API token check, and the agent/*
// endpoints relayed to a lab VM's real qemu-ga through guest/qga, with
// Proxmox's conversions (exec output and file content as byte strings,
// input-data and file-write limits). VMs without a lab VM behind them are
// power-state only: their agent is "not running".

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
)

type emuVM struct {
	vmid   int
	node   string
	name   string
	status string      // running, stopped
	agent  *qga.Client // nil: no guest agent behind this VM
}

type pveEmulator struct {
	srv     *httptest.Server
	tokenID string
	secret  string

	// mu guards vms, log and upid.
	mu   sync.Mutex
	vms  map[int]*emuVM
	log  []exchange
	upid int
}

// exchange is one recorded request and answer.
type exchange struct {
	Request  string // METHOD path?query, then the body if any
	Response string // status line, then the body
}

const (
	emuTokenID = "vmgate@pve!ci"
	emuSecret  = "5b0c3b1e-8f8d-4c55-9a3e-0d6c2b7f4a11"
)

func newPVEEmulator(t *testing.T) *pveEmulator {
	t.Helper()
	e := &pveEmulator{tokenID: emuTokenID, secret: emuSecret, vms: map[int]*emuVM{}}
	e.srv = httptest.NewTLSServer(http.HandlerFunc(e.serve))
	t.Cleanup(func() {
		e.srv.Close()
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, vm := range e.vms {
			if vm.agent != nil {
				vm.agent.Close()
			}
		}
	})
	return e
}

func (e *pveEmulator) addVM(vmid int, node, name, status, qgaSocket string) {
	vm := &emuVM{vmid: vmid, node: node, name: name, status: status}
	if qgaSocket != "" {
		vm.agent = qga.New(qgaSocket)
	}
	e.mu.Lock()
	e.vms[vmid] = vm
	e.mu.Unlock()
}

// files writes the CA (the server's own certificate) and the token secret
// into dir and returns a Config for the driver.
func (e *pveEmulator) config(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: e.srv.Certificate().Raw})
	if err := os.WriteFile(ca, cert, 0o600); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte(e.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Config{URL: e.srv.URL, TokenID: e.tokenID, TokenSecretFile: secret, CAFile: ca}
}

func (e *pveEmulator) transcript() []exchange {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]exchange(nil), e.log...)
}

func (e *pveEmulator) resetLog() {
	e.mu.Lock()
	e.log = nil
	e.mu.Unlock()
}

// answer is what a handler returns: a status, a message for the status
// line, and data or parameter errors.
type answer struct {
	code   int
	msg    string
	data   any
	errors map[string]string
}

func ok(data any) answer { return answer{code: 200, msg: "OK", data: data} }

func fail(code int, msg string) answer { return answer{code: code, msg: msg} }

func paramErr(errs map[string]string) answer {
	return answer{code: 400, msg: "Parameter verification failed.", errors: errs}
}

var vmPath = regexp.MustCompile(`^/api2/json/nodes/([^/]+)/qemu/([^/]+)/(.+)$`)

func (e *pveEmulator) serve(w http.ResponseWriter, r *http.Request) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(io.LimitReader(r.Body, 1<<20))
	}
	req := r.Method + " " + r.URL.RequestURI()
	if len(body) > 0 {
		req += "\n" + string(body)
	}
	a := e.route(r, body)
	var resp []byte
	if a.errors != nil {
		resp, _ = json.Marshal(map[string]any{"data": nil, "errors": a.errors})
	} else {
		resp, _ = json.Marshal(map[string]any{"data": a.data})
	}
	e.mu.Lock()
	e.log = append(e.log, exchange{Request: req, Response: fmt.Sprintf("%d %s\n%s", a.code, a.msg, resp)})
	e.mu.Unlock()
	writeRaw(w, a.code, a.msg, resp)
}

// writeRaw writes the answer with msg as the status line's reason phrase,
// as Proxmox does (net/http would put the standard text there).
func writeRaw(w http.ResponseWriter, code int, msg string, body []byte) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		w.WriteHeader(code)
		w.Write(body)
		return
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	msg = strings.NewReplacer("\r", " ", "\n", " ").Replace(msg)
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json;charset=UTF-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", code, msg, len(body))
	buf.Write(body)
	buf.Flush()
}

func (e *pveEmulator) route(r *http.Request, body []byte) answer {
	if r.Header.Get("Authorization") != "PVEAPIToken="+e.tokenID+"="+e.secret {
		return fail(401, "No ticket")
	}
	params, a, bad := parseParams(r, body)
	if bad {
		return a
	}
	if r.URL.Path == "/api2/json/cluster/resources" && r.Method == "GET" {
		if a, bad := allowOnly(params, "type"); bad {
			return a
		}
		return e.resources(params["type"])
	}
	m := vmPath.FindStringSubmatch(r.URL.Path)
	if m == nil {
		return fail(501, fmt.Sprintf("Method '%s %s' not implemented", r.Method, strings.TrimPrefix(r.URL.Path, "/api2/json")))
	}
	vmid, err := strconv.Atoi(m[2])
	if err != nil || strconv.Itoa(vmid) != m[2] || vmid < 100 {
		return paramErr(map[string]string{"vmid": "invalid format - value does not look like a valid VM ID\n"})
	}
	e.mu.Lock()
	vm := e.vms[vmid]
	e.mu.Unlock()
	if vm == nil || vm.node != m[1] {
		return fail(500, fmt.Sprintf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", m[1], vmid))
	}
	ctx, cancel := context.WithTimeout(r.Context(), 60*time.Second)
	defer cancel()
	switch op := r.Method + " " + m[3]; op {
	case "GET status/current":
		e.mu.Lock()
		st := vm.status
		e.mu.Unlock()
		d := map[string]any{"vmid": vm.vmid, "name": vm.name, "status": st, "agent": 1}
		if st == "running" {
			d["qmpstatus"] = "running"
		} else {
			d["qmpstatus"] = "stopped"
		}
		return ok(d)
	case "POST status/start", "POST status/stop", "POST status/shutdown", "POST status/reboot", "POST status/reset":
		return e.power(vm, strings.TrimPrefix(m[3], "status/"))
	case "POST agent/ping":
		return e.agent(ctx, vm, "guest-ping", nil, func(raw json.RawMessage) answer { return ok(map[string]any{"result": map[string]any{}}) })
	case "GET agent/info":
		return e.agent(ctx, vm, "guest-info", nil, func(raw json.RawMessage) answer { return ok(map[string]any{"result": raw}) })
	case "POST agent/exec":
		return e.exec(ctx, vm, params)
	case "GET agent/exec-status":
		return e.execStatus(ctx, vm, params)
	case "GET agent/file-read":
		return e.fileRead(ctx, vm, params)
	case "POST agent/file-write":
		return e.fileWrite(ctx, vm, params)
	default:
		return fail(501, fmt.Sprintf("Method '%s %s' not implemented", r.Method, strings.TrimPrefix(r.URL.Path, "/api2/json")))
	}
}

// parseParams merges query and body parameters (JSON or form).
func parseParams(r *http.Request, body []byte) (map[string]any, answer, bool) {
	params := map[string]any{}
	for k, v := range r.URL.Query() {
		params[k] = v[0]
	}
	if len(body) == 0 {
		return params, answer{}, false
	}
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		return nil, fail(415, "Unsupported Media Type"), true
	}
	var b map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&b); err != nil {
		return nil, fail(400, "malformed JSON body: "+err.Error()), true
	}
	for k, v := range b {
		params[k] = v
	}
	return params, answer{}, false
}

func allowOnly(params map[string]any, names ...string) (answer, bool) {
	errs := map[string]string{}
	for k := range params {
		if !containsStr(names, k) {
			errs[k] = "property is not defined in schema and the schema does not allow additional properties"
		}
	}
	if len(errs) > 0 {
		return paramErr(errs), true
	}
	return answer{}, false
}

func containsStr(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func (e *pveEmulator) resources(typ any) answer {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []int
	for id := range e.vms {
		ids = append(ids, id)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(ids))) // Proxmox does not promise an order
	out := []map[string]any{}
	for _, id := range ids {
		vm := e.vms[id]
		out = append(out, map[string]any{
			"id": fmt.Sprintf("qemu/%d", id), "vmid": id, "node": vm.node, "name": vm.name,
			"status": vm.status, "type": "qemu", "template": 0, "maxmem": 268435456,
		})
	}
	if typ == nil || typ == "" {
		out = append(out, map[string]any{"id": "node/" + "pve", "node": "pve", "type": "node", "status": "online"})
	}
	return ok(out)
}

func (e *pveEmulator) power(vm *emuVM, action string) answer {
	e.mu.Lock()
	defer e.mu.Unlock()
	if vm.agent != nil {
		return fail(500, "emulator: power actions are emulated only for VMs without a lab VM behind them")
	}
	switch action {
	case "start":
		if vm.status == "running" {
			return fail(500, fmt.Sprintf("VM %d already running", vm.vmid))
		}
		vm.status = "running"
	case "stop", "shutdown":
		if vm.status != "running" {
			return fail(500, fmt.Sprintf("VM %d not running", vm.vmid))
		}
		vm.status = "stopped"
	case "reset", "reboot":
		if vm.status != "running" {
			return fail(500, fmt.Sprintf("VM %d not running", vm.vmid))
		}
	}
	e.upid++
	return ok(fmt.Sprintf("UPID:%s:%08X:%08X:%08X:qm%s:%d:%s:", vm.node, 4242+e.upid, 1000+e.upid, 0x66000000+e.upid, action, vm.vmid, e.tokenID))
}

// agent relays command to the VM's qemu-ga and builds the answer with then.
func (e *pveEmulator) agent(ctx context.Context, vm *emuVM, command string, args any, then func(json.RawMessage) answer) answer {
	e.mu.Lock()
	running := vm.status == "running"
	e.mu.Unlock()
	if !running {
		return fail(500, fmt.Sprintf("VM %d is not running", vm.vmid))
	}
	if vm.agent == nil {
		return fail(500, "QEMU guest agent is not running")
	}
	var raw json.RawMessage
	if err := vm.agent.Call(ctx, command, args, &raw); err != nil {
		return agentFailure(vm, command, err)
	}
	return then(raw)
}

func agentFailure(vm *emuVM, command string, err error) answer {
	var qe *qga.Error
	var de *qga.DisabledError
	switch {
	case errors.As(err, &de):
		return fail(500, fmt.Sprintf("VM %d qmp command '%s' failed - %s", vm.vmid, command, de.Err.Desc))
	case errors.As(err, &qe):
		return fail(500, fmt.Sprintf("VM %d qmp command '%s' failed - %s", vm.vmid, command, qe.Desc))
	case errors.Is(err, qga.ErrNoAgent):
		return fail(500, "QEMU guest agent is not running")
	}
	return fail(500, fmt.Sprintf("VM %d qmp command '%s' failed - got timeout", vm.vmid, command))
}

// latin1 decodes a Proxmox byte string; ok false if a character is above U+00FF.
func latin1(s string) ([]byte, bool) {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			return nil, false
		}
		b = append(b, byte(r))
	}
	return b, true
}

func toLatin1(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		sb.WriteRune(rune(c))
	}
	return sb.String()
}

func (e *pveEmulator) exec(ctx context.Context, vm *emuVM, params map[string]any) answer {
	if a, bad := allowOnly(params, "command", "input-data"); bad {
		return a
	}
	list, isList := params["command"].([]any)
	if !isList || len(list) == 0 {
		return paramErr(map[string]string{"command": "type check ('array') failed"})
	}
	args := map[string]any{"capture-output": true}
	var argv []string
	for _, v := range list {
		s, isStr := v.(string)
		if !isStr {
			return paramErr(map[string]string{"command": "type check ('string') failed"})
		}
		argv = append(argv, s)
	}
	args["path"] = argv[0]
	if len(argv) > 1 {
		args["arg"] = argv[1:]
	}
	if in, present := params["input-data"]; present {
		s, isStr := in.(string)
		if !isStr {
			return paramErr(map[string]string{"input-data": "type check ('string') failed"})
		}
		if n := len([]rune(s)); n > MaxInputData {
			return paramErr(map[string]string{"input-data": fmt.Sprintf("value may only be %d characters long", MaxInputData)})
		}
		b, ok1 := latin1(s)
		if !ok1 {
			return fail(500, "Wide character in subroutine entry")
		}
		args["input-data"] = base64.StdEncoding.EncodeToString(b)
	}
	return e.agent(ctx, vm, "guest-exec", args, func(raw json.RawMessage) answer { return ok(raw) })
}

func (e *pveEmulator) execStatus(ctx context.Context, vm *emuVM, params map[string]any) answer {
	if a, bad := allowOnly(params, "pid"); bad {
		return a
	}
	s, _ := params["pid"].(string)
	pid, err := strconv.ParseInt(s, 10, 64)
	if err != nil || pid < 0 {
		return paramErr(map[string]string{"pid": "type check ('integer') failed - got '" + s + "'"})
	}
	return e.agent(ctx, vm, "guest-exec-status", map[string]int64{"pid": pid}, func(raw json.RawMessage) answer {
		var st map[string]any
		if err := json.Unmarshal(raw, &st); err != nil {
			return fail(500, err.Error())
		}
		for _, k := range []string{"out-data", "err-data"} {
			if v, present := st[k].(string); present {
				b, err := base64.StdEncoding.DecodeString(v)
				if err != nil {
					return fail(500, err.Error())
				}
				st[k] = toLatin1(b)
			}
		}
		return ok(st)
	})
}

func (e *pveEmulator) fileRead(ctx context.Context, vm *emuVM, params map[string]any) answer {
	if a, bad := allowOnly(params, "file"); bad {
		return a
	}
	file, _ := params["file"].(string)
	if file == "" {
		return paramErr(map[string]string{"file": "property is missing and it is not optional"})
	}
	e.mu.Lock()
	running := vm.status == "running"
	e.mu.Unlock()
	if !running || vm.agent == nil {
		return e.agent(ctx, vm, "guest-file-open", nil, nil)
	}
	data, truncated, err := vm.agent.FileRead(ctx, file, MaxFileRead)
	if err != nil {
		return agentFailure(vm, "guest-file-open", err)
	}
	d := map[string]any{"content": toLatin1(data), "bytes-read": len(data)}
	if truncated {
		d["truncated"] = true
	}
	return ok(d)
}

func (e *pveEmulator) fileWrite(ctx context.Context, vm *emuVM, params map[string]any) answer {
	if a, bad := allowOnly(params, "file", "content", "encode"); bad {
		return a
	}
	file, _ := params["file"].(string)
	content, isStr := params["content"].(string)
	if file == "" || !isStr {
		return paramErr(map[string]string{"file": "property is missing and it is not optional"})
	}
	if n := len([]rune(content)); n > MaxFileWriteContent {
		return paramErr(map[string]string{"content": fmt.Sprintf("value may only be %d characters long", MaxFileWriteContent)})
	}
	encode := true
	switch v := params["encode"].(type) {
	case nil:
	case bool:
		encode = v
	case json.Number:
		encode = v.String() != "0"
	default:
		return paramErr(map[string]string{"encode": "type check ('boolean') failed"})
	}
	var data []byte
	if encode {
		b, ok1 := latin1(content)
		if !ok1 {
			return fail(500, "Wide character in subroutine entry")
		}
		data = b
	} else {
		b, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return fail(500, fmt.Sprintf("VM %d qmp command 'guest-file-write' failed - Invalid parameter 'buf-b64'", vm.vmid))
		}
		data = b
	}
	e.mu.Lock()
	running := vm.status == "running"
	e.mu.Unlock()
	if !running || vm.agent == nil {
		return e.agent(ctx, vm, "guest-file-open", nil, nil)
	}
	if err := vm.agent.FileWrite(ctx, file, data, 0); err != nil {
		return agentFailure(vm, "guest-file-open", err)
	}
	return ok(nil)
}

// --- a tiny txtar reader and writer (golang.org/x/tools/txtar is not a dependency) ---

type txtarFile struct {
	Name string
	Data string
}

func parseTxtar(data string) []txtarFile {
	var files []txtarFile
	var cur *txtarFile
	sc := bufio.NewScanner(strings.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-- ") && strings.HasSuffix(line, " --") && len(line) > 6 {
			files = append(files, txtarFile{Name: strings.TrimSpace(line[3 : len(line)-3])})
			cur = &files[len(files)-1]
			continue
		}
		if cur != nil {
			cur.Data += line + "\n"
		}
	}
	return files
}

func formatTxtar(comment string, files []txtarFile) string {
	var sb strings.Builder
	sb.WriteString(comment)
	for _, f := range files {
		fmt.Fprintf(&sb, "-- %s --\n%s", f.Name, f.Data)
		if !strings.HasSuffix(f.Data, "\n") {
			sb.WriteString("\n")
		}
	}
	return sb.String()
}
