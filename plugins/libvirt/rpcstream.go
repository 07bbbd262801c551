package libvirt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"
)

// A libvirt RPC connection of our own for one download stream (a
// screenshot). go-libvirt's requestStream registers an unbuffered reply
// channel and delivers packets while holding its callbacks lock; when a
// stream ends with an empty "continue" packet, requestStream returns, its
// deferred deregister waits for that lock, and the stream's closing "ok"
// packet then blocks the delivery forever: the call, the connection and
// every later call on it hang (go-libvirt issue 241, seen here as a
// screenshot that never returned). This client queues every packet
// without blocking, so nothing the server sends can stall it, and
// reads the stream itself.
//
// The protocol, from libvirt's src/rpc/virnetprotocol.x and
// src/remote/remote_protocol.x: each packet is a length, a header
// (program, version, procedure, type, serial, status) and an XDR body.
// A call gets one reply (type REPLY, status OK or ERROR); a download
// stream sends STREAM packets with status CONTINUE and data, and ends
// with an empty one with status OK (or ERROR with a remote_error); its
// packets may come before the call's reply (see call).

// Procedures and types of libvirt's remote program (remote_protocol.x).
const (
	remoteProgram         = 0x20008086 // REMOTE_PROGRAM
	procConnectOpen       = 1          // REMOTE_PROC_CONNECT_OPEN
	procAuthList          = 66         // REMOTE_PROC_AUTH_LIST
	procAuthPolkit        = 70         // REMOTE_PROC_AUTH_POLKIT
	procDomainOpenConsole = 201        // REMOTE_PROC_DOMAIN_OPEN_CONSOLE
	procDomainScreenshot  = 211        // REMOTE_PROC_DOMAIN_SCREENSHOT
	authNone              = 0          // REMOTE_AUTH_NONE
	authPolkit            = 2          // REMOTE_AUTH_POLKIT
)

// rpcPacket is one packet a streamConn received.
type rpcPacket struct {
	h    socket.Header
	body []byte
}

// streamConn is one libvirt RPC connection used by one goroutine for
// calls in sequence. Route (go-libvirt's reader goroutine) appends to
// queue under mu and never blocks; next takes from it.
type streamConn struct {
	s      *socket.Socket
	serial int32

	mu     sync.Mutex
	queue  []rpcPacket
	queued int  // bytes in queue
	over   bool // queue passed maxQueued: the connection is given up
	wake   chan struct{}
}

// maxQueued bounds the bytes a streamConn holds unread.
const maxQueued = maxScreenBytes + 1<<20

var _ socket.Router = (*streamConn)(nil)

// Route queues a packet (socket.Router).
func (c *streamConn) Route(h *socket.Header, body []byte) {
	c.mu.Lock()
	if c.queued+len(body) > maxQueued {
		c.over = true
	} else {
		c.queue = append(c.queue, rpcPacket{*h, body})
		c.queued += len(body)
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// dialStream connects to libvirtd at ep and opens ep.name, authenticating
// as go-libvirt does (none, or polkit where the daemon lists it).
func dialStream(ctx context.Context, d socket.Dialer, uri string) (*streamConn, error) {
	c := &streamConn{wake: make(chan struct{}, 1)}
	c.s = socket.New(d, c)
	if err := c.s.Connect(); err != nil {
		return nil, err
	}
	if err := c.open(ctx, uri); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// open lists the auth types, does polkit if asked, and opens uri.
func (c *streamConn) open(ctx context.Context, uri string) error {
	ret, err := c.call(ctx, procAuthList, nil)
	if err != nil {
		return fmt.Errorf("auth list: %w", err)
	}
	types, err := xdrUint32s(ret)
	if err != nil {
		return fmt.Errorf("auth list: %w", err)
	}
	for _, t := range types {
		switch t {
		case authNone:
		case authPolkit:
			if _, err := c.call(ctx, procAuthPolkit, nil); err != nil {
				return fmt.Errorf("polkit: %w", err)
			}
		default:
			continue
		}
		break
	}
	var args bytes.Buffer
	xdrPutUint32(&args, 1) // remote_string: present
	xdrPutString(&args, uri)
	xdrPutUint32(&args, 0) // flags
	if _, err := c.call(ctx, procConnectOpen, args.Bytes()); err != nil {
		return fmt.Errorf("connect open: %w", err)
	}
	return nil
}

// close closes the connection; the reader goroutine ends with it.
func (c *streamConn) close() { _ = c.s.Disconnect() }

// call sends a call and returns its reply's body, or the remote error.
//
// The call's own stream packets may come before its reply: libvirtd's
// worker thread registers a download stream (daemonAddClientStream in
// remoteDispatchDomainScreenshot) before the dispatcher queues the reply
// (virNetServerProgramDispatchCall), and its event loop may send the
// stream's first packets, or the whole of a small image and its end, in
// between; libvirt's own client queues them on the stream registered
// before the call. call keeps them and puts them back at the head of the
// queue for readStream; dropping them left the stream waiting for data
// already gone (a screenshot "stalled" on a loaded machine).
func (c *streamConn) call(ctx context.Context, proc uint32, args []byte) ([]byte, error) {
	c.serial++
	serial := c.serial
	if err := c.s.SendPacket(serial, proc, remoteProgram, args, socket.Call, socket.StatusOK); err != nil {
		return nil, err
	}
	var early []rpcPacket
	defer func() { c.requeue(early) }()
	for {
		p, err := c.next(ctx, 0)
		if err != nil {
			return nil, err
		}
		if p.h.Serial == serial && p.h.Type == socket.Stream {
			early = append(early, p)
			continue
		}
		if p.h.Serial != serial || p.h.Type != socket.Reply {
			continue // not ours: an event, or a late packet of an earlier call
		}
		if p.h.Status == socket.StatusError {
			return nil, decodeRemoteError(p.body)
		}
		return p.body, nil
	}
}

// requeue puts ps back at the head of the queue, in their order.
func (c *streamConn) requeue(ps []rpcPacket) {
	if len(ps) == 0 {
		return
	}
	c.mu.Lock()
	for _, p := range ps {
		c.queued += len(p.body)
	}
	c.queue = append(ps, c.queue...)
	c.mu.Unlock()
}

// errStreamClosed: the connection closed before the packet awaited.
var errStreamClosed = errors.New("libvirtd closed the connection")

// next returns the next queued packet, waiting for one; it gives up when
// ctx ends, the connection closes or the queue overflowed, or (stall > 0)
// when no packet came for stall (errStreamStalled).
func (c *streamConn) next(ctx context.Context, stall time.Duration) (rpcPacket, error) {
	var stalled <-chan time.Time
	if stall > 0 {
		t := time.NewTimer(stall)
		defer t.Stop()
		stalled = t.C
	}
	for {
		c.mu.Lock()
		over := c.over
		if !over && len(c.queue) > 0 {
			p := c.queue[0]
			c.queue[0] = rpcPacket{}
			c.queue = c.queue[1:]
			c.queued -= len(p.body)
			c.mu.Unlock()
			return p, nil
		}
		c.mu.Unlock()
		if over {
			return rpcPacket{}, fmt.Errorf("libvirtd sent more than %d bytes unread", maxQueued)
		}
		select {
		case <-c.wake:
		case <-ctx.Done():
			return rpcPacket{}, ctx.Err()
		case <-stalled:
			return rpcPacket{}, fmt.Errorf("%w: no packet for %s", errStreamStalled, stall)
		case <-c.s.Disconnected():
			c.mu.Lock()
			empty := len(c.queue) == 0
			c.mu.Unlock()
			if empty {
				return rpcPacket{}, errStreamClosed
			}
		}
	}
}

// readStream writes the data of the download stream of the last call to
// w until its end: an empty packet, whatever its status (libvirtd ends a
// stream with an empty OK packet; go-libvirt saw empty CONTINUE ones too),
// or a remote error. A stream that brings no packet for stall is given up
// (errStreamStalled).
func (c *streamConn) readStream(ctx context.Context, stall time.Duration, w io.Writer) error {
	serial := c.serial
	for {
		p, err := c.next(ctx, stall)
		if err != nil {
			return err
		}
		if p.h.Serial != serial || p.h.Type != socket.Stream {
			continue
		}
		switch {
		case p.h.Status == socket.StatusError:
			return decodeRemoteError(p.body)
		case len(p.body) == 0:
			return nil
		}
		if _, err := w.Write(p.body); err != nil {
			return err
		}
	}
}

// DomainOpenConsoleBidirectional opens dom's console (dev, or the first
// one) and runs its stream both ways until it ends: what the guest
// writes goes to in, what out gives goes to the guest. It returns when
// the stream ends, fails or the connection closes. Its sender goroutine
// ends when out's Read fails: the caller closes out after the return
// (console.go closes its pipe).
func (c *streamConn) DomainOpenConsoleBidirectional(dom golibvirt.Domain, dev golibvirt.OptString, out io.Reader, in io.Writer, flags uint32) error {
	var args bytes.Buffer
	putDomain(&args, dom)
	if len(dev) > 0 {
		xdrPutUint32(&args, 1)
		xdrPutString(&args, dev[0])
	} else {
		xdrPutUint32(&args, 0)
	}
	xdrPutUint32(&args, flags)
	ctx := context.Background()
	if _, err := c.call(ctx, procDomainOpenConsole, args.Bytes()); err != nil {
		return err
	}
	serial := c.serial
	abort := make(chan bool, 1)
	go func() { _ = c.s.SendStream(serial, procDomainOpenConsole, remoteProgram, out, abort) }()
	err := c.readStream(ctx, 0, in)
	abort <- true
	return err
}

// Disconnect closes the connection (consoleConn).
func (c *streamConn) Disconnect() error {
	c.close()
	return nil
}

// decodeRemoteError reads a remote_error's code and message
// (virnetprotocol.x: int code; int domain; remote_string message; …)
// as go-libvirt's Error, so the driver's error mapping applies.
func decodeRemoteError(b []byte) error {
	r := bytes.NewReader(b)
	var code, domain, present uint32
	for _, v := range []*uint32{&code, &domain, &present} {
		if err := binary.Read(r, binary.BigEndian, v); err != nil {
			return fmt.Errorf("libvirt error undecodable: %w", err)
		}
	}
	msg := "(no message)"
	if present != 0 {
		s, err := xdrReadString(r)
		if err != nil {
			return fmt.Errorf("libvirt error undecodable: %w", err)
		}
		msg = s
	}
	return golibvirt.Error{Code: code, Message: msg}
}

// screenshotArgs encodes remote_domain_screenshot_args: the domain
// (remote_nonnull_domain: name, uuid, id), screen and flags.
func screenshotArgs(dom golibvirt.Domain, screen, flags uint32) []byte {
	var b bytes.Buffer
	putDomain(&b, dom)
	xdrPutUint32(&b, screen)
	xdrPutUint32(&b, flags)
	return b.Bytes()
}

// putDomain encodes a remote_nonnull_domain: name, uuid, id.
func putDomain(b *bytes.Buffer, dom golibvirt.Domain) {
	xdrPutString(b, dom.Name)
	b.Write(dom.UUID[:])
	xdrPutUint32(b, uint32(dom.ID))
}

// screenshotMime decodes remote_domain_screenshot_ret (remote_string mime).
func screenshotMime(b []byte) string {
	r := bytes.NewReader(b)
	var present uint32
	if binary.Read(r, binary.BigEndian, &present) != nil || present == 0 {
		return ""
	}
	s, _ := xdrReadString(r)
	return s
}

func xdrPutUint32(b *bytes.Buffer, v uint32) {
	b.Write(binary.BigEndian.AppendUint32(nil, v))
}

func xdrPutString(b *bytes.Buffer, s string) {
	xdrPutUint32(b, uint32(len(s)))
	b.WriteString(s)
	b.Write(make([]byte, (4-len(s)%4)%4))
}

func xdrReadString(r *bytes.Reader) (string, error) {
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		return "", err
	}
	if int64(n) > int64(r.Len()) {
		return "", fmt.Errorf("string of %d bytes in %d", n, r.Len())
	}
	s := make([]byte, n)
	if _, err := io.ReadFull(r, s); err != nil {
		return "", err
	}
	_, err := r.Seek(int64((4-n%4)%4), io.SeekCurrent)
	return string(s), err
}

// xdrUint32s decodes a variable-length array of uint32 (auth list).
func xdrUint32s(b []byte) ([]uint32, error) {
	r := bytes.NewReader(b)
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		return nil, err
	}
	if int64(n)*4 > int64(r.Len()) {
		return nil, fmt.Errorf("array of %d in %d bytes", n, r.Len())
	}
	out := make([]uint32, n)
	err := binary.Read(r, binary.BigEndian, out)
	return out, err
}
