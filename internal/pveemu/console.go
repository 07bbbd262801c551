package pveemu

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The console endpoints of qemu-server src/PVE/API2/Qemu.pm (vm_sendkey,
// vncproxy, termproxy, vncwebsocket), with the lab VM's own devices
// behind them:
//
//   - sendkey: PVE::QemuServer::vm_sendkey, the HMP command "sendkey KEY"
//     on the VM's monitor, under the config lock;
//   - vncproxy with websocket=1: a VNC password set on the VM's VNC server
//     (qm vncproxy's set_password and expire_password "+30", src/PVE/CLI/
//     qm.pm), a TCP listener on a port of 5900..5999 on localhost
//     (PVE::Tools::next_vnc_port), one connection accepted within 10 s and
//     relayed to the VM's VNC socket (qm.pm run_vnc_proxy) in a vncproxy
//     task. The lab VM's QEMU serves VNC on a unix socket with password=on,
//     as qemu-server starts it (-vnc unix:/var/run/qemu-server/VMID.vnc,password=on);
//   - termproxy: the same kind of listener, run by pve-xtermjs's termproxy
//     (termproxy/src/main.rs): the first line "USER:TICKET\n" is checked
//     against the ticket (--vncticket-endpoint), "OK" is answered, then
//     what qm terminal's socat relays (qm.pm, terminal: the VM's serial
//     socket, /var/run/qemu-server/VMID.serial0, raw): input framed as
//     "0:LEN:DATA" (resize "1:COLS:ROWS:", ping "2"), output raw;
//   - vncwebsocket: the ticket checked against user, path and port; the
//     websocket itself is pve-http-server's (websocket.go).
//
// A ticket here is an HMAC of the user, the path and the port with a key
// of the emulator's (PVE::AccessControl::assemble_vnc_ticket signs the
// same data with the cluster's RSA key); it is valid for 40 s, as
// verify_vnc_ticket's window (-20 .. 40).

// consoleMachine is a Machine that has a display (VNC) and a serial port
// (serial0: socket) a client can reach.
type consoleMachine interface {
	VNCSocket() string
	SerialSocket() string
}

// vncTicketLife is how long a ticket verifies.
const vncTicketLife = 40 * time.Second

// vncPorts are PVE::Tools::next_vnc_port's range.
const vncPortFirst, vncPortLast = 5900, 5999

// acceptTimeout is vncproxy's $timeout and termproxy's wait for a client.
const acceptTimeout = 10 * time.Second

// ticketKey is the emulator's signing key, made on first use.
type ticketKey struct {
	once sync.Once
	key  []byte
}

func (k *ticketKey) get() []byte {
	k.once.Do(func() {
		k.key = make([]byte, 32)
		rand.Read(k.key)
	})
	return k.key
}

// vncTicket is assemble_vnc_ticket(user, path, port): PVEVNC:TIME::SIG.
func (e *Emulator) vncTicket(user, path string, port int) string {
	ts := strconv.FormatInt(time.Now().Unix(), 16)
	return "PVEVNC:" + strings.ToUpper(ts) + "::" + e.ticketSig(ts, user, path, port)
}

func (e *Emulator) ticketSig(ts, user, path string, port int) string {
	m := hmac.New(sha256.New, e.vncKey.get())
	fmt.Fprintf(m, "%s:%s:%s:%d", strings.ToUpper(ts), user, path, port)
	return hex.EncodeToString(m.Sum(nil))
}

// verifyVNCTicket is verify_vnc_ticket: a ticket vncproxy handed out (its
// password prefix, the "FIXME: MAJOR VERSION" hack, taken off) for user,
// path and port, within its life.
func (e *Emulator) verifyVNCTicket(ticket, user, path string, port int) *apiError {
	if i := strings.Index(ticket, "PVEVNC:"); i > 0 {
		ticket = ticket[i:]
	}
	rest, ok := strings.CutPrefix(ticket, "PVEVNC:")
	ts, sig, ok2 := strings.Cut(rest, "::")
	t, err := strconv.ParseInt(ts, 16, 64)
	if !ok || !ok2 || err != nil || !hmac.Equal([]byte(sig), []byte(e.ticketSig(ts, user, path, port))) {
		return &apiError{code: 401, msg: "permission denied - invalid PVEVNC ticket"}
	}
	if age := time.Since(time.Unix(t, 0)); age < -20*time.Second || age > vncTicketLife {
		return &apiError{code: 401, msg: "permission denied - invalid PVEVNC ticket"}
	}
	return nil
}

// consoleRoutes are the console methods.
func (e *Emulator) consoleRoutes() []route {
	return []route{
		{method: "PUT", path: "/nodes/{node}/qemu/{vmid}/sendkey", perm: vmPerm("VM.Console"), proxyto: true,
			schema: vmSchema(map[string]prop{"skiplock": {typ: "boolean", optional: true}, "key": {typ: "string"}}), run: (*Emulator).vmSendKey},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/vncproxy", perm: vmPerm("VM.Console"),
			schema: vmSchema(map[string]prop{"websocket": {typ: "boolean", optional: true}, "generate-password": {typ: "boolean", optional: true}}),
			run:    (*Emulator).vncProxy},
		{method: "POST", path: "/nodes/{node}/qemu/{vmid}/termproxy", perm: vmPerm("VM.Console"),
			schema: vmSchema(map[string]prop{"serial": {typ: "string", optional: true, enum: []string{"serial0", "serial1", "serial2", "serial3"}}}),
			run:    (*Emulator).termProxy},
		{method: "GET", path: "/nodes/{node}/qemu/{vmid}/vncwebsocket", perm: vmPerm("VM.Console"),
			schema: vmSchema(map[string]prop{"vncticket": {typ: "string", maxLength: 512},
				"port": {typ: "integer", minimum: num(vncPortFirst), maximum: num(vncPortLast)}}),
			run: (*Emulator).vncWebsocket},
	}
}

// vmSendKey is vm_sendkey: skiplock for root only, then
// PVE::QemuServer::vm_sendkey under lock_config; HMP's answer, when not
// empty, is the error.
func (e *Emulator) vmSendKey(r *request) (any, *apiError) {
	if err := rootOnly(r, "skiplock"); err != nil {
		return nil, err
	}
	vmid, node := vmParams(r)
	v := e.vmAt(vmid, node)
	if err := e.lockOn(v, node, vmid, noConfig); err != nil {
		return nil, err
	}
	defer v.cfgMu.Unlock()
	raw, err := e.monQMP(r.ctx, v, "human-monitor-command", map[string]any{"command-line": "sendkey " + scalar(r.params["key"])}, 0)
	if err != nil {
		return nil, err
	}
	var res string
	if json.Unmarshal(raw, &res) == nil && res != "" {
		return nil, die("%s", res)
	}
	return nil, nil
}

// consoleOf is the VM's display and serial port, as load_config finds it.
func (e *Emulator) consoleOf(r *request) (*vm, consoleMachine, *apiError) {
	vmid, node := vmParams(r)
	v := e.vmAt(vmid, node)
	if v == nil {
		return nil, nil, noConfig(node, vmid)
	}
	cm, ok := v.machine.(consoleMachine)
	if !ok {
		return nil, nil, die("VM %d has no display or serial port in this emulator", vmid)
	}
	return v, cm, nil
}

// listenVNCPort is next_vnc_port: the first free port of 5900..5999 on
// localhost, held open.
func listenVNCPort() (*net.TCPListener, int, error) {
	for p := vncPortFirst; p <= vncPortLast; p++ {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p})
		if err == nil {
			return ln, p, nil
		}
	}
	return nil, 0, errors.New("unable to find free port (5900-5999)")
}

// acceptOne is the workers' accept: one connection within acceptTimeout,
// then the listener is closed.
func acceptOne(ln *net.TCPListener) (net.Conn, error) {
	defer ln.Close()
	ln.SetDeadline(time.Now().Add(acceptTimeout))
	c, err := ln.Accept()
	if err != nil {
		return nil, fmt.Errorf("connection timed out")
	}
	return c, nil
}

// vncProxy is vncproxy for a VM whose display is its VGA (no serial vga
// type), with websocket set or not (the emulator listens without TLS in
// both cases, as websocket=1 does).
func (e *Emulator) vncProxy(r *request) (any, *apiError) {
	v, cm, aerr := e.consoleOf(r)
	if aerr != nil {
		return nil, aerr
	}
	ln, port, err := listenVNCPort()
	if err != nil {
		return nil, die("%v", err)
	}
	user, path := r.token.ID, "/vms/"+strconv.Itoa(v.vmid)
	password := vncPassword()
	ticket := password + ":" + e.vncTicket(user, path, port)
	upid := e.forkWorker(r, "vncproxy", strconv.Itoa(v.vmid), func(t *task) *apiError {
		if _, err := e.monQMP(e.ctx, v, "set_password", map[string]any{"protocol": "vnc", "password": password}, 0); err != nil {
			ln.Close()
			return err
		}
		if _, err := e.monQMP(e.ctx, v, "expire_password", map[string]any{"protocol": "vnc", "time": "+30"}, 0); err != nil {
			ln.Close()
			return err
		}
		c, err := acceptOne(ln)
		if err != nil {
			return die("%v", err)
		}
		defer c.Close()
		return relayUnix(e.ctx, c, cm.VNCSocket())
	})
	return map[string]any{"user": user, "ticket": ticket, "port": port, "upid": upid, "cert": "", "password": password}, nil
}

// vncPassword is PVE::Ticket::generate_vnc_password: 8 printable ASCII
// characters ('!' .. '~').
func vncPassword() string {
	b := make([]byte, 8)
	rand.Read(b)
	for i := range b {
		b[i] = '!' + b[i]%('~'-'!'+1)
	}
	return string(b)
}

// relayUnix is run_vnc_proxy: the client's bytes to the unix socket and
// back until either side ends.
func relayUnix(ctx context.Context, c net.Conn, sock string) *apiError {
	var d net.Dialer
	u, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return die("unable to connect to socket '%s' - %v", sock, err)
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(u, c); done <- struct{}{} }()
	go func() { io.Copy(c, u); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// termProxy is termproxy: a listener for termproxy, the serial port (the
// serial parameter, else the first one) checked when the terminal starts.
func (e *Emulator) termProxy(r *request) (any, *apiError) {
	v, cm, aerr := e.consoleOf(r)
	if aerr != nil {
		return nil, aerr
	}
	if s := scalar(r.params["serial"]); s != "" && s != "serial0" {
		return nil, die("serial interface '%s' is not configured", s)
	}
	ln, port, err := listenVNCPort()
	if err != nil {
		return nil, die("%v", err)
	}
	user, path := r.token.ID, "/vms/"+strconv.Itoa(v.vmid)
	ticket := e.vncTicket(user, path, port)
	upid := e.forkWorker(r, "vncproxy", strconv.Itoa(v.vmid), func(t *task) *apiError {
		c, err := acceptOne(ln)
		if err != nil {
			return die("failed waiting for client: %v", err)
		}
		defer c.Close()
		return e.termSession(c, ticket, user, path, port, cm.SerialSocket())
	})
	return map[string]any{"user": user, "ticket": ticket, "port": port, "upid": upid}, nil
}

// termSession is termproxy's do_main after the accept: the ticket line
// within 10 s, "OK", then the terminal.
func (e *Emulator) termSession(c net.Conn, pinned, user, path string, port int, serial string) *apiError {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(c, 4096)
	line, err := br.ReadString('\n')
	if err != nil {
		return die("failed reading ticket: %v", err)
	}
	authid, ticket, ok := strings.Cut(strings.TrimSuffix(line, "\n"), ":")
	if !ok {
		return die("failed reading ticket: authentication data is invalid")
	}
	if ticket != pinned || authid != user || e.verifyVNCTicket(ticket, user, path, port) != nil {
		return die("authentication request failed")
	}
	c.SetReadDeadline(time.Time{})
	if _, err := io.WriteString(c, "OK"); err != nil {
		return nil
	}
	var d net.Dialer
	s, err := d.DialContext(e.ctx, "unix", serial)
	if err != nil {
		return die("unable to connect to socket '%s' - %v", serial, err)
	}
	defer s.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(c, s); done <- struct{}{} }()
	go func() { termInput(br, s); done <- struct{}{} }()
	select {
	case <-done:
	case <-e.ctx.Done():
	}
	return nil
}

// termInput is termproxy's process_queue: "0:LEN:DATA" carries input
// (LEN bytes), "1:COLS:ROWS:" a resize (no terminal size on a serial
// socket), anything else one byte to skip (pings, "2").
func termInput(r *bufio.Reader, w io.Writer) {
	for {
		t, err := r.ReadByte()
		if err != nil {
			return
		}
		switch t {
		case '0', '1':
			if c, err := r.ReadByte(); err != nil || c != ':' {
				continue
			}
			n, err := readNumber(r)
			if err != nil {
				return
			}
			if t == '1' {
				readNumber(r) // rows
				continue
			}
			if _, err := io.CopyN(w, r, int64(n)); err != nil {
				return
			}
		}
	}
}

// readNumber is remove_number: digits up to ':' (at most 20 bytes).
func readNumber(r *bufio.Reader) (int, error) {
	s, err := r.ReadString(':')
	if err != nil || len(s) > 21 {
		return 0, errors.New("bad number")
	}
	return strconv.Atoi(strings.TrimSuffix(s, ":"))
}

// vncWebsocket is vncwebsocket: the ticket for this user, path and port,
// the VM's config on the node; the answer is the port to proxy to.
func (e *Emulator) vncWebsocket(r *request) (any, *apiError) {
	vmid, node := vmParams(r)
	port := int(intParam(r.params, "port", 0))
	if err := e.verifyVNCTicket(scalar(r.params["vncticket"]), r.token.ID, "/vms/"+strconv.Itoa(vmid), port); err != nil {
		return nil, err
	}
	if e.vmAt(vmid, node) == nil {
		return nil, noConfig(node, vmid)
	}
	return map[string]any{"port": strconv.Itoa(port)}, nil
}
