package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/server/mcptest"
)

// TestProgressNotifications: a long vm_agent_exec whose client sent a
// progress token gets increasing notifications/progress carrying that token
// before its result; the same call without a token gets none.
func TestProgressNotifications(t *testing.T) {
	drv := hypervisortest.Counting(new(atomic.Int64))
	var started atomic.Int64
	drv.ExecStartFunc = func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
		started.Store(time.Now().UnixNano())
		return hypervisor.ExecHandle{PID: 77, StartedAt: time.Now()}, nil
	}
	drv.ExecStatusFunc = func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
		if time.Since(time.Unix(0, started.Load())) < 450*time.Millisecond {
			return hypervisor.ExecResult{PID: h.PID}, nil
		}
		return hypervisor.ExecResult{PID: h.PID, Exited: true, Stdout: []byte("done\n")}, nil
	}
	f := newFixture(t, fixtureOpts{driver: drv})
	f.s.progressEvery = 100 * time.Millisecond

	send, lines := stdioPipe(t, f.s, "local")
	// readUntil reads messages up to the response with id, returning the
	// progress notifications seen before it.
	type progress struct {
		Method string `json:"method"`
		ID     json.RawMessage
		Params struct {
			ProgressToken any     `json:"progressToken"`
			Progress      float64 `json:"progress"`
			Message       string  `json:"message"`
		} `json:"params"`
	}
	readUntil := func(id string) []progress {
		t.Helper()
		var seen []progress
		for lines.Scan() {
			var m progress
			if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
				t.Fatalf("message %q: %v", lines.Bytes(), err)
			}
			if string(m.ID) == id {
				return seen
			}
			if m.Method == "notifications/progress" {
				seen = append(seen, m)
			}
		}
		t.Fatalf("no response with id %s: %v", id, lines.Err())
		return nil
	}
	send(mcptest.InitMsg)
	readUntil("1")
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)

	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"vm_agent_exec","arguments":{"vm":"lab/vm1","command":["sleep","1"]},"_meta":{"progressToken":"tok-7"}}}`)
	seen := readUntil("2")
	if len(seen) < 2 {
		t.Fatalf("progress notifications before the result = %d; want at least 2", len(seen))
	}
	for i, p := range seen {
		if p.Params.ProgressToken != "tok-7" {
			t.Errorf("notification %d token = %v; want tok-7", i, p.Params.ProgressToken)
		}
		if i > 0 && p.Params.Progress <= seen[i-1].Params.Progress {
			t.Errorf("notification %d progress %v after %v; want increasing", i, p.Params.Progress, seen[i-1].Params.Progress)
		}
	}

	send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"vm_agent_exec","arguments":{"vm":"lab/vm1","command":["sleep","1"]}}}`)
	if seen := readUntil("3"); len(seen) != 0 {
		t.Errorf("progress notifications without a token = %d; want 0", len(seen))
	}
}

// TestProgressCarriesTheHandlersReport: what a handler reports through its
// call's Progress (the latest output line of a command) is in the next
// progress notification, after the tool and the time it has run.
func TestProgressCarriesTheHandlersReport(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.s.progressEvery = 10 * time.Millisecond
	sess := &testSession{id: "progress-test", notifications: make(chan mcp.JSONRPCNotification, 64)}
	sess.Initialize()
	if err := f.s.mcp.RegisterSession(context.Background(), sess); err != nil {
		t.Fatal(err)
	}
	defer f.s.mcp.UnregisterSession(context.Background(), sess.id)
	ctx := f.s.mcp.WithContext(context.Background(), sess)
	var req mcp.CallToolRequest
	req.Params.Meta = &mcp.Meta{ProgressToken: "tok"}
	prog, stop := f.s.reportProgress(ctx, req, "vm_agent_exec")
	defer stop()
	if prog == nil {
		t.Fatal("reportProgress with a progress token gave no Progress for the handler")
	}
	prog.Report("compiling 3/7")
	deadline := time.After(30 * time.Second)
	for {
		select {
		case n := <-sess.notifications:
			msg, _ := n.Params.AdditionalFields["message"].(string)
			if strings.HasPrefix(msg, "vm_agent_exec running for ") && strings.HasSuffix(msg, ": compiling 3/7") {
				return
			}
		case <-deadline:
			t.Fatal("no progress notification carried the handler's report")
		}
	}
}

// stdioPipe serves s over stdio as grant for the test: send writes one
// message, lines reads what the server writes (up to 64 MiB a line: file
// results of the message limit).
func stdioPipe(t *testing.T, s *Server, grant string) (send func(msg string), lines *bufio.Scanner) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go func() { serveStdio(context.Background(), s, grant, inR, outW); outW.Close() }()
	t.Cleanup(func() { inW.Close() })
	lines = bufio.NewScanner(outR)
	lines.Buffer(nil, 64<<20)
	return func(msg string) {
		t.Helper()
		if _, err := io.WriteString(inW, msg+"\n"); err != nil {
			t.Fatalf("write: %v", err)
		}
	}, lines
}
