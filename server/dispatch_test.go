package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/server/catalog"
)

// testSession is the mcp-go client session the direct dispatch's calls are
// served in (a stdio client's, as server/stdio registers one).
type testSession struct {
	id            string
	notifications chan mcp.JSONRPCNotification
	initialized   atomic.Bool
}

func (s *testSession) SessionID() string { return s.id }
func (s *testSession) NotificationChannel() chan<- mcp.JSONRPCNotification {
	return s.notifications
}
func (s *testSession) Initialize()       { s.initialized.Store(true) }
func (s *testSession) Initialized() bool { return s.initialized.Load() }

var _ mcpserver.ClientSession = (*testSession)(nil)

// dispatchPeer is a server with a stdio session of grant "local", and
// what its driver saw.
type dispatchPeer struct {
	f       *fixture
	sess    *testSession
	ctx     context.Context
	release chan struct{} // lab/slowvm's status waits for one
	entered chan struct{} // lab/slowvm's status was called
	direct  atomic.Bool   // the last driver call ran on the direct path
}

func newDispatchPeer(t *testing.T, noDirect bool, callTimeout time.Duration) *dispatchPeer {
	p := &dispatchPeer{release: make(chan struct{}, 1), entered: make(chan struct{}, 1)}
	drv := hypervisortest.Counting(new(atomic.Int64))
	drv.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
		n := 0
		p.f.s.direct.m.Range(func(any, any) bool { n++; return true })
		p.direct.Store(n > 0)
		switch vm {
		case "vm1":
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning, AgentConnected: true}, nil
		case "boom":
			panic("fake: driver bug")
		case "hang":
			<-ctx.Done()
			return hypervisor.Status{}, fmt.Errorf("fake: status: %w", ctx.Err())
		case "slowvm":
			select {
			case p.entered <- struct{}{}:
			default:
			}
			select {
			case <-p.release:
			case <-ctx.Done():
			}
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning}, nil
		}
		return hypervisor.Status{}, fmt.Errorf("fake: status of %s: %w", vm, hypervisor.ErrUnknownVM)
	}
	p.f = newFixture(t, fixtureOpts{driver: drv, timeouts: catalog.Timeouts{Call: callTimeout}})
	p.f.s.noDirect = noDirect
	p.f.s.progressEvery = 5 * time.Millisecond
	p.sess = &testSession{id: "stdio-local-test", notifications: make(chan mcp.JSONRPCNotification, 64)}
	p.sess.Initialize()
	p.ctx = p.f.s.mcp.WithContext(context.Background(), p.sess)
	return p
}

// exchange runs msg through handle and returns the response and the
// progress token of every progress notification sent while it ran (the
// first lets lab/slowvm's status answer).
func (p *dispatchPeer) exchange(msg string) (out []byte, tokens []string) {
	p.direct.Store(false)
	done := make(chan []byte, 1)
	go func() {
		done <- p.f.s.Handle(p.ctx, &Conn{Grant: p.f.s.grants["local"], Transport: "stdio"}, []byte(msg))
	}()
	for {
		select {
		case out = <-done:
			return out, tokens
		case n := <-p.sess.notifications:
			b, _ := json.Marshal(n.Params.AdditionalFields["progressToken"])
			if len(tokens) == 0 {
				p.release <- struct{}{}
			}
			tokens = append(tokens, string(b))
		}
	}
}

// TestDirectDispatchMatchesMCPGo: a gated tools/call answered by handle
// itself (dispatch.go) gets the very bytes mcp-go's HandleMessage answers
// it with, on a server that sends every call through mcp-go; the messages
// the direct path leaves to mcp-go go there (and get the same answer).
func TestDirectDispatchMatchesMCPGo(t *testing.T) {

	call := func(id, vm, extra string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"vm_status","arguments":{"vm":%q}%s}}`, id, vm, extra)
	}
	tests := []struct {
		name     string
		msg      string
		direct   bool // the call runs on the direct path
		progress bool // progress notifications are expected
	}{
		{"ok", call("5", "lab/vm1", ""), true, false},
		{"tool error", call("6", "lab/vm3", ""), true, false},
		{"string id", call(`"a-\u00e9\"x</"`, "lab/vm1", ""), true, false},
		{"zero id", call("0", "lab/vm1", ""), true, false},
		{"largest id", call("9007199254740991", "lab/vm1", ""), true, false},
		{"smallest id", call("-9007199254740991", "lab/vm1", ""), true, false},
		{"string progress token", call("7", "lab/slowvm", `,"_meta":{"progressToken":"tok-\u2028"}`), true, true},
		{"number progress token", call("8", "lab/slowvm", `,"_meta":{"progressToken":12.50}`), true, true},
		{"exponent progress token", call("9", "lab/slowvm", `,"_meta":{"progressToken":1.5e3,"other":[1,{"x":null}]}`), true, true},
		{"null progress token", call("10", "lab/vm1", `,"_meta":{"progressToken":null}`), true, false},
		{"null _meta", call("11", "lab/vm1", `,"_meta":null`), true, false},
		{"params in another order", `{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"arguments":{"vm":"lab/vm1"},"name":"vm_status"}}`, true, false},
		{"panic in the driver", call("13", "lab/boom", ""), true, false},
		{"past the deadline", call("14", "lab/hang", ""), true, false},
		// Left to mcp-go: what encoding/json reads otherwise than the gate.
		{"result member", `{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"vm_status","arguments":{"vm":"lab/vm1"}},"result":{}}`, false, false},
		{"_meta not an object", call("21", "lab/vm1", `,"_meta":"x"`), false, false},
		{"number past float64", call("22", "lab/vm1", `,"_meta":{"n":1e400}`), false, false},
		{"modern _meta", call("23", "lab/vm1", `,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`), false, false},
	}
	direct, viaMCP := newDispatchPeer(t, false, 200*time.Millisecond), newDispatchPeer(t, true, 200*time.Millisecond)
	for _, tt := range tests {
		got, gotTokens := direct.exchange(tt.msg)
		sawDirect := direct.direct.Load()
		want, wantTokens := viaMCP.exchange(tt.msg)
		if viaMCP.direct.Load() {
			t.Fatalf("%s: the server without the direct path ran the call on it", tt.name)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: handle(%s) =\n%s\nwant (mcp-go's)\n%s", tt.name, tt.msg, got, want)
		}
		if sawDirect != tt.direct {
			t.Errorf("%s: ran on the direct path = %v; want %v", tt.name, sawDirect, tt.direct)
		}
		if tt.progress && (len(gotTokens) == 0 || len(wantTokens) == 0 || gotTokens[0] != wantTokens[0]) {
			t.Errorf("%s: progress tokens %q; want the first one equal to mcp-go's %q", tt.name, gotTokens, wantTokens)
		}
	}
	for _, p := range []*dispatchPeer{direct, viaMCP} {
		n := 0
		p.f.s.direct.m.Range(func(any, any) bool { n++; return true })
		if n != 0 {
			t.Errorf("%d direct calls still registered after every call ended; want 0", n)
		}
	}
}

// TestDirectCallCancelled: notifications/cancelled reaches a call on the
// direct path as mcp-go's cancellation reaches its own: the call's
// context (the one mcp-go would give the handler) is cancelled. The call
// is not answered, even though its driver call went on to succeed.
func TestDirectCallCancelled(t *testing.T) {
	for _, id := range []string{"31", `"c-31"`} {
		p := newDispatchPeer(t, false, 0)
		var wg sync.WaitGroup
		var answer []byte
		wg.Go(func() {
			answer, _ = p.exchange(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"vm_status","arguments":{"vm":"lab/slowvm"}}}`, id))
		})
		<-p.entered // the call registered before its handler ran
		key := fmt.Sprintf("stdio-local-test:%v", map[string]any{"31": float64(31), `"c-31"`: "c-31"}[id])
		if _, ok := p.f.s.direct.m.Load(key); !ok {
			t.Fatalf("id %s: no direct call registered under %q", id, key)
		}
		out := p.f.s.Handle(p.ctx, &Conn{Grant: p.f.s.grants["local"], Transport: "stdio"},
			[]byte(fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%s}}`, id)))
		if out != nil {
			t.Errorf("id %s: notifications/cancelled answered %s; want nothing", id, out)
		}
		if _, ok := p.f.s.direct.m.Load(key); ok {
			t.Errorf("id %s: the call is still registered after notifications/cancelled; want it cancelled", id)
		}
		p.release <- struct{}{}
		wg.Wait()
		if answer != nil {
			t.Errorf("id %s: the cancelled call was answered %.200s; want no response", id, answer)
		}
	}
}
