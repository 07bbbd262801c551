package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/consolebuf"
)

// The serial console through virDomainOpenConsole: a stream both ways on
// a libvirt connection of its own (so a console never holds up the
// driver's other calls). libvirt keeps no history for it: the stream
// carries what the guest writes while it is open. So the driver opens a
// domain's console at the first console call and keeps it open, a reader
// goroutine it owns putting the output into a bounded buffer with byte
// offsets (plugins/internal/consolebuf), until Close or until the stream
// ends (the domain stopped, or another client took the console by force);
// the next call opens it again, the offsets going on. Boot messages are
// seen for the boots the console was open for.
//
// The console is opened without VIR_DOMAIN_CONSOLE_FORCE: a person's
// `virsh console` is never kicked off; while one holds it, the driver's
// open fails, saying so.
//
// Driver.consMu guards Driver.consoles (nil once Close began) and is
// never held with Driver.mu; a console's own fields are set before it is
// shared, or published by closing its done channel.

var (
	_ hypervisor.ConsoleReader = (*Driver)(nil)
	_ hypervisor.ConsoleWriter = (*Driver)(nil)
)

// consoleConn is what a console stream needs of its own connection;
// *streamConn implements it (rpcstream.go: go-libvirt's streams can hang
// at their end, and Disconnect with them).
type consoleConn interface {
	DomainOpenConsoleBidirectional(dom golibvirt.Domain, devName golibvirt.OptString, outStream io.Reader, inStream io.Writer, flags uint32) error
	Disconnect() error
}

var _ consoleConn = (*streamConn)(nil)

// consoleRingBytes is how much output the driver keeps per domain.
const consoleRingBytes = 1 << 20

// console is one domain's console stream.
type console struct {
	uuid [16]byte
	ring *consolebuf.Ring
	in   *io.PipeWriter // ConsoleWrite's data; the stream sends what it reads
	c    consoleConn
	wmu  sync.Mutex    // one write at a time
	done chan struct{} // closed when the stream has ended
	err  error         // why it ended; set before done is closed
}

func (k *console) ended() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

// consoleOf returns the domain's open console, opening it when there is
// none (or the last one ended), and waits until libvirt has opened it.
func (d *Driver) consoleOf(ctx context.Context, op string, s *domState) (*console, error) {
	h := s.handle()
	d.consMu.Lock()
	if d.consoles == nil {
		d.consMu.Unlock()
		return nil, fmt.Errorf("libvirt: %s: driver closed", op)
	}
	k := d.consoles[s.name]
	if k == nil || k.ended() || k.uuid != h.UUID {
		ring := consolebuf.New(consoleRingBytes)
		if k != nil && k.uuid == h.UUID {
			ring = k.ring // the same domain: its offsets go on
		}
		var err error
		if k, err = d.openConsole(h, ring); err != nil {
			d.consMu.Unlock()
			return nil, fmt.Errorf("libvirt: %s: %w", op, err)
		}
		d.consoles[s.name] = k
	}
	d.consMu.Unlock()
	// An empty write returns once the stream reads its input, which it
	// starts only after libvirt has opened the console, or fails when the
	// open did.
	if _, err := k.write(ctx, nil); err != nil {
		return nil, consoleError(op, err)
	}
	return k, nil
}

// openConsole starts a console stream on a connection of its own.
func (d *Driver) openConsole(h golibvirt.Domain, ring *consolebuf.Ring) (*console, error) {
	c, err := d.dialConsole()
	if err != nil {
		return nil, fmt.Errorf("connect for the console: %w", err)
	}
	pr, pw := io.Pipe()
	k := &console{uuid: h.UUID, ring: ring, in: pw, c: c, done: make(chan struct{})}
	d.consWG.Add(1)
	go func() {
		defer d.consWG.Done()
		err := c.DomainOpenConsoleBidirectional(h, golibvirt.OptString{}, pr, ring, 0)
		if err == nil {
			err = errors.New("the console stream ended")
		}
		k.err = err
		pr.CloseWithError(err)
		close(k.done)
		c.Disconnect()
		d.log.Debug("console stream ended", "domain", h.Name, "err", err)
	}()
	return k, nil
}

// write hands data to the stream, bounded by ctx (the stream may still
// send it after ctx ended).
func (k *console) write(ctx context.Context, data []byte) (int, error) {
	type result struct {
		n   int
		err error
	}
	res := make(chan result, 1)
	go func() {
		k.wmu.Lock()
		defer k.wmu.Unlock()
		n, err := k.in.Write(data)
		res <- result{n, err}
	}()
	select {
	case r := <-res:
		if r.err != nil && k.ended() {
			return r.n, k.err
		}
		return r.n, r.err
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: the console stream did not take the input: %w", hypervisor.ErrTimeout, ctx.Err())
	}
}

// consoleError says what a failed console open or write means.
func consoleError(op string, err error) error {
	msg := err.Error()
	switch {
	case isLibvirtError(err) && strings.Contains(msg, "session exists"):
		return fmt.Errorf("libvirt: %s: %w: another client holds the domain's console (libvirt said %q); the driver does not take it by force: close that console (virsh console) first",
			op, hypervisor.ErrBackend, msg)
	case isLibvirtError(err) && strings.Contains(msg, "character device"):
		return fmt.Errorf("libvirt: %s: %w: the domain has no serial console (libvirt said %q): add <serial type='pty'><target port='0'/></serial> and <console type='pty'><target type='serial' port='0'/></console> to its XML",
			op, hypervisor.ErrNotSupported, msg)
	}
	return opError(op, err)
}

// ConsoleRead reads the domain's console output kept since the driver
// opened it.
func (d *Driver) ConsoleRead(ctx context.Context, name string, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
	if err := req.Validate(); err != nil {
		return hypervisor.ConsoleChunk{}, fmt.Errorf("libvirt: %w", err)
	}
	s, err := d.lookup(ctx, "console read", name)
	if err != nil {
		return hypervisor.ConsoleChunk{}, err
	}
	k, err := d.consoleOf(ctx, "console read", s)
	if err != nil {
		return hypervisor.ConsoleChunk{}, err
	}
	return k.ring.Read(req), nil
}

// ConsoleWrite sends data to the domain's console input.
func (d *Driver) ConsoleWrite(ctx context.Context, name string, data []byte) error {
	if err := hypervisor.ValidateConsoleWrite(data); err != nil {
		return fmt.Errorf("libvirt: %w", err)
	}
	s, err := d.lookup(ctx, "console write", name)
	if err != nil {
		return err
	}
	k, err := d.consoleOf(ctx, "console write", s)
	if err != nil {
		return err
	}
	if _, err := k.write(ctx, data); err != nil {
		return consoleError("console write", err)
	}
	return nil
}

// closeConsoles ends every console stream and waits (bounded) for their
// reader goroutines.
func (d *Driver) closeConsoles() error {
	d.consMu.Lock()
	cons := d.consoles
	d.consoles = nil // no console opens after Close
	d.consMu.Unlock()
	for _, k := range cons {
		k.in.Close()
		k.c.Disconnect()
	}
	done := make(chan struct{})
	go func() { d.consWG.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(5 * time.Second):
		return errors.New("libvirt: close: a console stream did not end")
	}
}
