package proxmox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/consolebuf"
)

// The serial console through termproxy (qemu-server src/PVE/API2/Qemu.pm
// termproxy; pve-xtermjs termproxy/src/main.rs): POST .../termproxy with
// serial=serial0 gives a ticket for a port; GET .../vncwebsocket upgraded
// to a websocket reaches termproxy, which takes "USER:TICKET\n", answers
// "OK" and then relays qm terminal (socat to the VM's serial socket): the
// guest's output raw, input framed as "0:LEN:DATA". Proxmox keeps no
// history of a serial console, and its socket serves one client: the
// driver opens a VM's console at the first console call and keeps it
// open, a reader goroutine it owns putting the output into a bounded
// buffer with byte offsets (plugins/internal/consolebuf), until Close or
// until the session ends (the VM stopped, the task was stopped); the next
// call opens it again, the offsets going on. Boot messages are seen for
// the boots the console was open for. The VM needs "serial0: socket" in
// its config (qm set VMID --serial0 socket).

var (
	_ hypervisor.ConsoleReader = (*Driver)(nil)
	_ hypervisor.ConsoleWriter = (*Driver)(nil)
)

// consoleRingBytes is how much output the driver keeps per VM.
const consoleRingBytes = 1 << 20

// termSession is one VM's open serial console.
type termSession struct {
	ring *consolebuf.Ring
	ws   *wsStream
	done chan struct{} // closed when the reader has ended
	err  error         // why; set before done is closed
}

func (s *termSession) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// consoles are the open sessions by vmid; nil once Close began.
type consoles struct {
	mu   sync.Mutex
	byID map[int]*termSession
	wg   sync.WaitGroup
}

// session returns v's open console, opening it when there is none or the
// last one ended.
func (d *Driver) session(ctx context.Context, op string, v vmRef) (*termSession, error) {
	d.cons.mu.Lock()
	defer d.cons.mu.Unlock()
	if d.cons.byID == nil {
		return nil, fmt.Errorf("proxmox: %s: driver closed", op)
	}
	s := d.cons.byID[v.vmid]
	if s != nil && !s.ended() {
		return s, nil
	}
	ring := consolebuf.New(consoleRingBytes)
	if s != nil {
		ring = s.ring // the offsets go on
	}
	s, err := d.openTerm(ctx, op, v, ring)
	if err != nil {
		return nil, err
	}
	d.cons.byID[v.vmid] = s
	return s, nil
}

// openTerm checks the VM has a serial socket, starts termproxy, opens the
// websocket, authenticates and starts the reader.
func (d *Driver) openTerm(ctx context.Context, op string, v vmRef, ring *consolebuf.Ring) (*termSession, error) {
	var conf map[string]any
	if err := d.api.do(ctx, "GET", v.path+"/config", nil, nil, &conf); err != nil {
		return nil, d.classify(op, err)
	}
	if conf["serial0"] != "socket" {
		return nil, fmt.Errorf("proxmox: %s: %w: VM %d has no serial console the API can reach (serial0 is %v): set one with qm set %d --serial0 socket (and console=ttyS0 in the guest)",
			op, hypervisor.ErrNotSupported, v.vmid, conf["serial0"], v.vmid)
	}
	var ans vncProxyAnswer
	if err := d.api.do(ctx, "POST", v.path+"/termproxy", nil, map[string]any{"serial": "serial0"}, &ans); err != nil {
		return nil, d.classify(op, err)
	}
	ws, err := d.api.dialVNCWebsocket(ctx, v.path, int(ans.Port), ans.Ticket)
	if err != nil {
		return nil, fmt.Errorf("proxmox: %s: %w: %w", op, hypervisor.ErrBackend, err)
	}
	if err := termLogin(ctx, ws, ans.User, ans.Ticket); err != nil {
		ws.Close()
		return nil, fmt.Errorf("proxmox: %s: %w: termproxy: %w", op, hypervisor.ErrBackend, err)
	}
	s := &termSession{ring: ring, ws: ws, done: make(chan struct{})}
	d.cons.wg.Add(1)
	go func() {
		defer d.cons.wg.Done()
		_, err := io.Copy(ring, ws)
		if err == nil {
			err = errors.New("the console session ended")
		}
		s.err = err
		close(s.done)
		ws.Close()
		d.log.Debug("console session ended", "vmid", v.vmid, "err", err)
	}()
	return s, nil
}

// termLogin sends termproxy's ticket line and waits for its "OK".
func termLogin(ctx context.Context, ws *wsStream, user, ticket string) error {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(30 * time.Second)
	}
	ws.SetDeadline(dl)
	defer ws.SetDeadline(time.Time{})
	if _, err := ws.Write([]byte(user + ":" + ticket + "\n")); err != nil {
		return err
	}
	var ok2 [2]byte
	if _, err := io.ReadFull(ws, ok2[:]); err != nil {
		return fmt.Errorf("no answer to the ticket: %w", err)
	}
	if string(ok2[:]) != "OK" {
		return fmt.Errorf("the ticket was refused (%q)", ok2)
	}
	return nil
}

// ConsoleRead reads the VM's console output kept since the driver opened it.
func (d *Driver) ConsoleRead(ctx context.Context, name string, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
	const op = "console read"
	if err := req.Validate(); err != nil {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("proxmox: %w", err)
	}
	v, err := d.lookup(ctx, op, name)
	if err != nil {
		return hypervisor.ConsoleChunk{}, err
	}
	s, err := d.session(ctx, op, v)
	if err != nil {
		return hypervisor.ConsoleChunk{}, err
	}
	return s.ring.Read(req), nil
}

// ConsoleWrite sends data to the VM's console input, as termproxy's data
// messages.
func (d *Driver) ConsoleWrite(ctx context.Context, name string, data []byte) error {
	const op = "console write"
	if err := hypervisor.ValidateConsoleWrite(data); err != nil {
		return fmt.Errorf("proxmox: %w", err)
	}
	v, err := d.lookup(ctx, op, name)
	if err != nil {
		return err
	}
	s, err := d.session(ctx, op, v)
	if err != nil {
		return err
	}
	msg := append([]byte("0:"+strconv.Itoa(len(data))+":"), data...)
	if _, err := s.ws.Write(msg); err != nil {
		if s.ended() {
			err = s.err
		}
		return fmt.Errorf("proxmox: %s: %w: the console session: %w", op, hypervisor.ErrBackend, err)
	}
	return nil
}

// closeConsoles ends every console session and waits (bounded) for the
// readers.
func (d *Driver) closeConsoles() {
	d.cons.mu.Lock()
	byID := d.cons.byID
	d.cons.byID = nil
	d.cons.mu.Unlock()
	for _, s := range byID {
		s.ws.Close()
	}
	done := make(chan struct{})
	go func() { d.cons.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		d.log.Warn("a console session did not end")
	}
}
