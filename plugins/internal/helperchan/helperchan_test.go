package helperchan

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/mux"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/helperchan/chantest"
)

func echo(_ context.Context, r mux.Request) mux.Reply {
	return mux.Reply{Exit: 0, Stdout: []byte(strings.Join(r.Args, " ") + "|" + string(r.Stdin))}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestCallReusesOneConnection(t *testing.T) {
	path, conns := chantest.Serve(t, echo, nil)
	p := New(Options{})
	defer p.Close()
	for i := range 5 {
		rep, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"ps"}, Stdin: []byte{byte('a' + i)}})
		if err != nil || string(rep.Stdout) != "ps|"+string(rune('a'+i)) {
			t.Fatalf("Call %d = %q, %v; want the echo", i, rep.Stdout, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("connections = %d; want 1 for five calls", n)
	}
}

func TestCallErrors(t *testing.T) {
	p := New(Options{})
	defer p.Close()
	if _, err := p.Call(ctxT(t), filepath.Join(t.TempDir(), "none.sock"), hypervisor.HelperCall{Args: []string{"ps"}}); !errors.Is(err, hypervisor.ErrNoHelperChannel) {
		t.Errorf("Call on a missing socket = %v; want ErrNoHelperChannel", err)
	}
	// A socket whose peer never answers the hello (no helper in the guest).
	path := filepath.Join(t.TempDir(), "silent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	if _, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"ps"}}); !errors.Is(err, hypervisor.ErrHelperUnavailable) {
		t.Errorf("Call with no helper answering = %v; want ErrHelperUnavailable", err)
	}
}

// TestCallRedialsAfterAFailedConnection: a connection the guest side ended
// fails the call in flight (ErrHelperLost); the next call dials again.
func TestCallRedialsAfterAFailedConnection(t *testing.T) {
	var first atomic.Bool
	var srvConn atomic.Pointer[net.Conn]
	path, conns := chantest.Serve(t, func(ctx context.Context, r mux.Request) mux.Reply {
		if r.Args[0] == "die" && !first.Swap(true) {
			(*srvConn.Load()).Close()
			<-ctx.Done()
		}
		return echo(ctx, r)
	}, func(c net.Conn) net.Conn { srvConn.Store(&c); return c })
	p := New(Options{})
	defer p.Close()
	if _, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"die"}}); !errors.Is(err, hypervisor.ErrHelperLost) {
		t.Fatalf("Call whose connection ends = %v; want ErrHelperLost", err)
	}
	if rep, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"again"}}); err != nil || string(rep.Stdout) != "again|" {
		t.Fatalf("next Call = %q, %v; want the echo over a new connection", rep.Stdout, err)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("connections = %d; want 2 (the next call dialled again)", n)
	}
}
