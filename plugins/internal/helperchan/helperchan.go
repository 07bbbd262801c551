// Package helperchan is the drivers' side of vmgate-guest's resident
// helper channel: one guest/mux connection per VM, over the unix socket
// that is the host end of the VM's virtio-serial port org.vmgate.guest.0
// (QEMU's chardev socket, libvirt's <channel type='unix'>), dialled on
// first use and again after it fails. The QEMU and libvirt drivers
// implement hypervisor.HelperCaller with it.
//
// A QEMU chardev socket serves one client at a time: a second client's
// connect succeeds but nothing reads it until the first leaves, so its
// hello goes unanswered (ErrHelperUnavailable) and its caller uses the
// guest agent instead.
//
// Liveness: each connection pings the helper and is given up once the
// guest has owed an answer and sent nothing for Options.SilenceLimit
// (guest/mux's liveness check; the drivers' helper_silence_limit setting).
//
// Concurrency: Pool is safe for concurrent use. mu guards conns; each
// conn's mu is held while it dials (one dial per socket at a time) and
// never across a call, which the mux client multiplexes.
package helperchan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/mux"
	"github.com/vmgate/vmgate/hypervisor"
)

// PortName is the resident helper's virtio-serial port.
const PortName = "org.vmgate.guest.0"

// HelloTimeout bounds the wait for the helper's answer to a new
// connection's hello (the helper polls a closed port every 100 ms at most).
const HelloTimeout = 3 * time.Second

// Silence limit bounds (Options.SilenceLimit): below two pings the check
// could not tell a slow guest from a dead one; above an hour a dead helper
// behind an open port would hold its callers that long.
const (
	MinSilenceLimit = 2 * mux.DefaultPingEvery
	MaxSilenceLimit = time.Hour
)

// Options configure a Pool.
type Options struct {
	// SilenceLimit is how long a helper may send nothing while it owes an
	// answer before its connection is given up (mux.Options.SilenceLimit);
	// zero means mux.DefaultSilenceLimit.
	SilenceLimit time.Duration
}

// CheckSilenceLimit validates a configured silence limit: zero (the
// default) or between MinSilenceLimit and MaxSilenceLimit.
func CheckSilenceLimit(d time.Duration) error {
	if d != 0 && (d < MinSilenceLimit || d > MaxSilenceLimit) {
		return fmt.Errorf("%v: want between %v and %v (0 or unset: %v)", d, MinSilenceLimit, MaxSilenceLimit, mux.DefaultSilenceLimit)
	}
	return nil
}

// Pool holds the connections. The zero value is not usable: use New.
type Pool struct {
	mu    sync.Mutex
	conns map[string]*conn
	opt   mux.Options
}

type conn struct {
	mu sync.Mutex
	cl *mux.Client
	// dropped and cause: the last client Drop closed, and why (its calls
	// in flight name it).
	dropped *mux.Client
	cause   error
}

// New returns an empty Pool whose connections check liveness with o.
func New(o Options) *Pool {
	return &Pool{conns: map[string]*conn{}, opt: mux.Options{SilenceLimit: o.SilenceLimit}}
}

// SilenceLimit is the silence limit the Pool's connections use (the
// default applied).
func (p *Pool) SilenceLimit() time.Duration {
	if p.opt.SilenceLimit > 0 {
		return p.opt.SilenceLimit
	}
	return mux.DefaultSilenceLimit
}

// Call sends one helper command over the channel whose host end is the
// socket at path. ErrNoHelperChannel when there is no socket there;
// ErrHelperUnavailable when nothing answers on it (the call was not sent);
// ErrHelperLost when the connection fails during the call (the command
// may have run).
func (p *Pool) Call(ctx context.Context, path string, call hypervisor.HelperCall) (hypervisor.HelperReply, error) {
	cl, err := p.client(ctx, path)
	if err != nil {
		return hypervisor.HelperReply{}, err
	}
	req := mux.Request{Args: call.Args, Stdin: call.Stdin}
	if call.Timeout > 0 {
		req.TimeoutMS = call.Timeout.Milliseconds()
	}
	rep, err := cl.Call(ctx, req)
	switch {
	case err == nil:
		return hypervisor.HelperReply{Exit: rep.Exit, Stdout: rep.Stdout}, nil
	case ctx.Err() != nil:
		return hypervisor.HelperReply{}, fmt.Errorf("helper channel: %w: %w", hypervisor.ErrTimeout, ctx.Err())
	case errors.Is(err, mux.ErrRejected):
		return hypervisor.HelperReply{}, fmt.Errorf("helper channel: %w: %w", hypervisor.ErrBackend, err)
	case errors.Is(err, mux.ErrNeedHello):
		p.drop(path, cl)
		return hypervisor.HelperReply{}, fmt.Errorf("helper channel %s: %w: %w", path, hypervisor.ErrHelperUnavailable, err)
	}
	p.drop(path, cl)
	if cause := p.causeOf(path, cl); cause != nil {
		err = cause
	}
	return hypervisor.HelperReply{}, fmt.Errorf("helper channel %s: %w: %w", path, hypervisor.ErrHelperLost, err)
}

// Drop closes path's connection because of cause (the backend said the
// guest closed its side of the port: the helper is gone), without waiting
// for the silence limit: calls in flight fail with ErrHelperLost naming
// cause; the next call dials again.
func (p *Pool) Drop(path string, cause error) {
	c := p.connOf(path)
	if c == nil {
		return
	}
	c.mu.Lock()
	cl := c.cl
	if cl != nil {
		c.cl, c.dropped, c.cause = nil, cl, cause
	}
	c.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
}

// causeOf is why Drop closed cl, nil when it did not.
func (p *Pool) causeOf(path string, cl *mux.Client) error {
	c := p.connOf(path)
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dropped == cl {
		return c.cause
	}
	return nil
}

// client returns the live connection to path, dialling one if needed.
func (p *Pool) client(ctx context.Context, path string) (*mux.Client, error) {
	p.mu.Lock()
	c, ok := p.conns[path]
	if !ok {
		c = &conn{}
		p.conns[path] = c
	}
	p.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cl != nil {
		select {
		case <-c.cl.Done():
			c.cl = nil
		default:
			return c.cl, nil
		}
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("helper channel: %w: no socket at %s (the VM has no port %s): %w", hypervisor.ErrNoHelperChannel, path, PortName, err)
	}
	hctx, cancel := context.WithTimeout(ctx, HelloTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(hctx, "unix", path)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("helper channel %s: %w: nothing listens (is the VM running?): %w", path, hypervisor.ErrHelperUnavailable, err)
		}
		return nil, fmt.Errorf("helper channel %s: %w: %w", path, hypervisor.ErrHelperUnavailable, err)
	}
	cl, _, err := mux.DialWith(hctx, nc, p.opt)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("helper channel: %w: %w", hypervisor.ErrTimeout, ctx.Err())
		}
		return nil, fmt.Errorf("helper channel %s: %w: no resident vmgate-guest answered in %v (not started, or another client holds the port): %w",
			path, hypervisor.ErrHelperUnavailable, HelloTimeout, err)
	}
	c.cl = cl
	return cl, nil
}

// connOf is path's entry, nil when none.
func (p *Pool) connOf(path string) *conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[path]
}

// drop closes cl if it is still path's connection.
func (p *Pool) drop(path string, cl *mux.Client) {
	c := p.connOf(path)
	if c == nil {
		return
	}
	c.mu.Lock()
	if c.cl == cl {
		c.cl = nil
	}
	c.mu.Unlock()
	cl.Close()
}

// Forget closes path's connection (its VM stopped or was deleted).
func (p *Pool) Forget(path string) {
	p.mu.Lock()
	c := p.conns[path]
	delete(p.conns, path)
	p.mu.Unlock()
	if c != nil {
		c.mu.Lock()
		if c.cl != nil {
			c.cl.Close()
		}
		c.mu.Unlock()
	}
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	paths := make([]string, 0, len(p.conns))
	for path := range p.conns {
		paths = append(paths, path)
	}
	p.mu.Unlock()
	for _, path := range paths {
		p.Forget(path)
	}
}
