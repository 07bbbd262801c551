package libvirt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/hypervisor"
)

// conn is what the driver needs of a libvirt connection; *golibvirt.Libvirt
// implements it. Its methods may block without bound: the driver calls
// them through call, which enforces the caller's deadline.
type conn interface {
	ConnectListAllDomains(needResults int32, flags golibvirt.ConnectListAllDomainsFlags) ([]golibvirt.Domain, uint32, error)
	DomainLookupByName(name string) (golibvirt.Domain, error)
	DomainGetState(dom golibvirt.Domain, flags uint32) (int32, int32, error)
	DomainGetMetadata(dom golibvirt.Domain, typ int32, uri golibvirt.OptString, flags golibvirt.DomainModificationImpact) (string, error)
	DomainGetXMLDesc(dom golibvirt.Domain, flags golibvirt.DomainXMLFlags) (string, error)
	DomainIsPersistent(dom golibvirt.Domain) (int32, error)
	QEMUDomainAgentCommand(dom golibvirt.Domain, cmd string, timeout int32, flags uint32) (golibvirt.OptString, error)
	DomainShutdownFlags(dom golibvirt.Domain, flags golibvirt.DomainShutdownFlagValues) error
	DomainReboot(dom golibvirt.Domain, flags golibvirt.DomainRebootFlagValues) error
	DomainReset(dom golibvirt.Domain, flags uint32) error
	DomainDestroy(dom golibvirt.Domain) error
	DomainCreate(dom golibvirt.Domain) error
	Disconnected() <-chan struct{}
	Disconnect() error
}

var _ conn = (*golibvirt.Libvirt)(nil)

// dialLibvirt connects to ep with go-libvirt.
func dialLibvirt(ep endpoint, timeout time.Duration) (conn, error) {
	l := golibvirt.NewWithDialer(dialer{ep: ep, timeout: timeout})
	if err := l.ConnectToURI(golibvirt.ConnectURI(ep.name)); err != nil {
		return nil, err
	}
	return l, nil
}

// dialer implements go-libvirt's socket.Dialer for a unix or tcp endpoint.
type dialer struct {
	ep      endpoint
	timeout time.Duration
}

func (d dialer) Dial() (net.Conn, error) {
	return net.DialTimeout(d.ep.network, d.ep.address, d.timeout)
}

func disconnected(c conn) bool {
	select {
	case <-c.Disconnected():
		return true
	default:
		return false
	}
}

// connection returns the shared connection, dialling it when there is none
// or the last one broke. Dialling runs in its own goroutine (go-libvirt's
// handshake takes no context); a caller whose ctx ends first returns, and
// the dial still completes for the next caller.
func (d *Driver) connection(ctx context.Context) (conn, error) {
	d.mu.Lock()
	c, closed := d.conn, d.closed
	d.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("libvirt: driver closed")
	}
	if c != nil && !disconnected(c) {
		return c, nil
	}
	select {
	case d.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("libvirt: connect: %w: %w", hypervisor.ErrTimeout, ctx.Err())
	}
	d.mu.Lock()
	c = d.conn
	d.mu.Unlock()
	if c != nil && !disconnected(c) {
		<-d.dialing
		return c, nil
	}
	type result struct {
		c   conn
		err error
	}
	res := make(chan result, 1)
	go func() {
		defer func() { <-d.dialing }()
		c, err := d.dial()
		if err == nil {
			d.mu.Lock()
			if d.closed {
				err = fmt.Errorf("libvirt: driver closed")
				go c.Disconnect()
			} else {
				if old := d.conn; old != nil {
					go old.Disconnect()
				}
				d.conn = c
			}
			d.mu.Unlock()
		}
		res <- result{c, err}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			return nil, fmt.Errorf("libvirt: connect %s: %w", d.ep.address, r.err)
		}
		d.log.Debug("connected to libvirtd", "address", d.ep.address)
		return r.c, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("libvirt: connect: %w: %w", hypervisor.ErrTimeout, ctx.Err())
	}
}

// drop forgets c after a transport failure, so the next call re-dials.
func (d *Driver) drop(c conn, why error) {
	d.mu.Lock()
	mine := d.conn == c
	if mine {
		d.conn = nil
	}
	d.mu.Unlock()
	if mine {
		d.log.Info("libvirt connection dropped; the next call reconnects", "err", why)
		go c.Disconnect()
	}
}

// isLibvirtError reports whether err is an error reply from libvirtd (as
// opposed to a transport failure).
func isLibvirtError(err error) bool {
	var e golibvirt.Error
	return errors.As(err, &e) || errors.Is(err, golibvirt.ErrUnsupported)
}

// libvirtCode returns err's libvirt error number, or -1.
func libvirtCode(err error) golibvirt.ErrorNumber {
	var e golibvirt.Error
	if errors.As(err, &e) {
		return golibvirt.ErrorNumber(e.Code)
	}
	return -1
}

// call runs fn on the shared connection and returns its error, or a
// timeout when ctx ends first (fn then finishes in the background). A
// transport failure drops the connection; with retry (for calls that
// change nothing) fn runs once more on a fresh one.
func (d *Driver) call(ctx context.Context, retry bool, fn func(c conn) error) error {
	return d.callTracked(ctx, retry, nil, fn)
}

// callTracked is call that also reports (in *launched, when not nil)
// whether fn was started.
func (d *Driver) callTracked(ctx context.Context, retry bool, launched *bool, fn func(c conn) error) error {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: %w", hypervisor.ErrTimeout, err)
		}
		c, err := d.connection(ctx)
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		if launched != nil {
			*launched = true
		}
		go func() { done <- fn(c) }()
		select {
		case err = <-done:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", hypervisor.ErrTimeout, ctx.Err())
		}
		if err == nil || isLibvirtError(err) {
			return err
		}
		d.drop(c, err)
		if !retry || attempt > 0 {
			return fmt.Errorf("connection to libvirtd failed: %w", err)
		}
	}
}
