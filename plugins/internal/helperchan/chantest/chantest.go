// Package chantest helps test the helper channel's users: a resident
// helper that can die behind its open socket, and the cases of the
// drivers' helper_silence_limit setting.
package chantest

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

// Serve listens on a unix socket in a temporary directory, where a VM's
// helper socket would be, and serves each connection with a mux.Server
// running handler, as a resident helper behind QEMU would; wrap, when not
// nil, wraps each connection first. It returns the socket's path and the
// number of connections accepted so far; everything ends with the test.
func Serve(t testing.TB, handler func(context.Context, mux.Request) mux.Reply, wrap func(net.Conn) net.Conn) (path string, conns *atomic.Int32) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "guest.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); ln.Close() })
	conns = new(atomic.Int32)
	srv := &mux.Server{Handler: handler, Hello: func() []byte { return []byte(`{}`) }}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			if wrap != nil {
				c = wrap(c)
			}
			go srv.ServeConn(ctx, c)
		}
	}()
	return path, conns
}

// MortalHelper serves a resident helper (Serve): "die" makes it fall
// silent for good (dead is set and nothing more reaches the host, while
// the socket stays open, as QEMU keeps a chardev socket open when the
// guest closes its side of the port); any other command answers its
// arguments joined, "|", and its stdin.
func MortalHelper(t testing.TB) (path string, dead *atomic.Bool) {
	t.Helper()
	dead = new(atomic.Bool)
	path, _ = Serve(t, func(ctx context.Context, r mux.Request) mux.Reply {
		if r.Args[0] == "die" {
			dead.Store(true)
			<-ctx.Done()
		}
		return mux.Reply{Stdout: []byte(strings.Join(r.Args, " ") + "|" + string(r.Stdin))}
	}, func(c net.Conn) net.Conn { return muteConn{Conn: c, dead: dead} })
	return path, dead
}

// muteConn carries nothing either way once dead is set (what the host
// sends is read and dropped), staying open.
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

// SilenceCase is one helper_silence_limit setting.
type SilenceCase struct {
	Setting string // the JSON value; "" leaves it out
	Want    time.Duration
	OK      bool
	Named   bool // the refusal names the setting (the bounds' check; a value that does not decode is refused by registry.Duration)
}

// SilenceCases are the cases every driver with the setting passes.
func SilenceCases() []SilenceCase {
	return []SilenceCase{
		{"", mux.DefaultSilenceLimit, true, false},
		{`"2s"`, 2 * time.Second, true, false},
		{`"90s"`, 90 * time.Second, true, false},
		{`"1h"`, time.Hour, true, false},
		{`"1s"`, 0, false, true},
		{`"1999ms"`, 0, false, true},
		{`"1h1s"`, 0, false, true},
		{`"0s"`, 0, false, false},
		{`"-5s"`, 0, false, false},
		{`"soon"`, 0, false, false},
		{`30`, 0, false, false},
	}
}

// CheckSilenceSetting runs SilenceCases through a driver's settings:
// build makes the driver from its settings with helper_silence_limit set
// to the case's JSON value (left out for ""), and returns the silence
// limit its helper channel uses and a close. A refusal must be
// ErrInvalidArgument, naming the setting where the case says so.
func CheckSilenceSetting(t *testing.T, build func(setting string) (limit func() time.Duration, closeDriver func(), err error)) {
	t.Helper()
	for _, tt := range SilenceCases() {
		limit, closeDriver, err := build(tt.Setting)
		if closeDriver != nil {
			defer closeDriver()
		}
		switch {
		case !tt.OK && (err == nil || !errors.Is(err, hypervisor.ErrInvalidArgument) || tt.Named && !strings.Contains(err.Error(), "helper_silence_limit")):
			t.Errorf("settings with helper_silence_limit %s = %v; want refused (naming helper_silence_limit: %v)", tt.Setting, err, tt.Named)
		case tt.OK && err != nil:
			t.Errorf("settings with helper_silence_limit %s = %v; want nil", tt.Setting, err)
		case tt.OK:
			if got := limit(); got != tt.Want {
				t.Errorf("settings with helper_silence_limit %s: the helper channel's silence limit = %v; want %v", tt.Setting, got, tt.Want)
			}
		}
	}
}
