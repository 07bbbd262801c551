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
)

// muteConn is the guest end of a port whose helper can die behind it: once
// dead is set, nothing more reaches the host and what the host sends is
// read and dropped, while the connection stays open (as QEMU keeps a
// chardev socket open when the guest closes its side of the port).
type muteConn struct {
	net.Conn
	dead *atomic.Bool
}

func (m muteConn) Read(b []byte) (int, error) {
	for {
		n, err := m.Conn.Read(b)
		if err != nil || !m.dead.Load() {
			return n, err
		}
	}
}

func (m muteConn) Write(b []byte) (int, error) {
	if m.dead.Load() {
		return len(b), nil
	}
	return m.Conn.Write(b)
}

// mortalPort serves a helper whose "die" command makes it fall silent for
// good behind the open socket; every other command echoes.
func mortalPort(t *testing.T) (string, *atomic.Bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "guest.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); ln.Close() })
	dead := new(atomic.Bool)
	srv := &mux.Server{Handler: func(ctx context.Context, r mux.Request) mux.Reply {
		if r.Args[0] == "die" {
			dead.Store(true)
			<-ctx.Done()
		}
		return echo(ctx, r)
	}, Hello: func() []byte { return []byte(`{}`) }}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go srv.ServeConn(ctx, muteConn{Conn: c, dead: dead})
		}
	}()
	return path, dead
}

// TestSilenceLimitPassedThrough: the Pool's connections give a helper
// that fell silent up after Options.SilenceLimit, and say so: the call in
// flight fails with ErrHelperLost naming the mux's silence and the
// configured limit.
func TestSilenceLimitPassedThrough(t *testing.T) {
	for _, tc := range []struct {
		opt  Options
		want time.Duration
	}{{Options{}, mux.DefaultSilenceLimit}, {Options{SilenceLimit: MinSilenceLimit}, MinSilenceLimit}} {
		if got := New(tc.opt).SilenceLimit(); got != tc.want {
			t.Errorf("New(%+v).SilenceLimit() = %v; want %v", tc.opt, got, tc.want)
		}
	}
	path, _ := mortalPort(t)
	p := New(Options{SilenceLimit: MinSilenceLimit})
	defer p.Close()
	if rep, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"ps"}}); err != nil || string(rep.Stdout) != "ps|" {
		t.Fatalf("Call = %q, %v; want the echo", rep.Stdout, err)
	}
	_, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"die"}})
	if !errors.Is(err, hypervisor.ErrHelperLost) || !errors.Is(err, mux.ErrSilent) || !strings.Contains(err.Error(), "(limit "+MinSilenceLimit.String()+")") {
		t.Errorf("Call to a helper that fell silent = %v; want ErrHelperLost for the mux's silence, limit %v", err, MinSilenceLimit)
	}
}

// TestCheckSilenceLimit: the bounds a configured limit must keep.
func TestCheckSilenceLimit(t *testing.T) {
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{
		{0, true}, {MinSilenceLimit, true}, {30 * time.Second, true}, {MaxSilenceLimit, true},
		{-time.Second, false}, {time.Second, false}, {MinSilenceLimit - 1, false}, {MaxSilenceLimit + 1, false},
	} {
		if err := CheckSilenceLimit(tc.d); (err == nil) != tc.ok {
			t.Errorf("CheckSilenceLimit(%v) = %v; want ok %v", tc.d, err, tc.ok)
		}
	}
}

// TestDropNamesItsCause: a connection dropped because the backend said
// the helper is gone fails the call in flight at once with ErrHelperLost
// naming that cause (not the silence limit, an hour here); the next call
// dials again.
func TestDropNamesItsCause(t *testing.T) {
	path, dead := mortalPort(t)
	p := New(Options{SilenceLimit: MaxSilenceLimit})
	defer p.Close()
	if _, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"ps"}}); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("the guest closed the port")
	done := make(chan error, 1)
	go func() {
		_, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"die"}})
		done <- err
	}()
	// Drop once the call is in flight: the helper has gone silent.
	for !dead.Load() {
		select {
		case err := <-done:
			t.Fatalf("the call ended before the drop: %v", err)
		default:
		}
	}
	p.Drop(path, cause)
	if err := <-done; !errors.Is(err, hypervisor.ErrHelperLost) || !errors.Is(err, cause) || errors.Is(err, mux.ErrSilent) {
		t.Errorf("Call in flight when dropped = %v; want ErrHelperLost naming %q", err, cause)
	}
	p.Drop(filepath.Join(t.TempDir(), "none.sock"), cause) // no connection there: nothing happens
	if rep, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"again"}}); err == nil || !errors.Is(err, hypervisor.ErrHelperUnavailable) {
		t.Errorf("next Call = %q, %v; want a new dial, unanswered behind the dead helper (ErrHelperUnavailable)", rep.Stdout, err)
	}
}
