package stdio

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

// stdioClient is one client of Serve over pipes: it reads every line the
// server writes and sorts replies (by id) from notifications (in order).
type stdioClient struct {
	t       *testing.T
	in      io.WriteCloser
	replies chan mcptest.Reply
	notes   chan string
	raw     chan string // every line, for the secret checks
}

func startStdio(t *testing.T, f *servertest.Fixture) *stdioClient {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), f.S, "local", inR, outW); outW.Close() }()
	c := &stdioClient{t: t, in: inW, replies: make(chan mcptest.Reply, 16), notes: make(chan string, 64), raw: make(chan string, 256)}
	go func() {
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			c.raw <- line
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			json.Unmarshal([]byte(line), &m)
			if m.Method != "" && m.ID == nil {
				c.notes <- line
				continue
			}
			var r mcptest.Reply
			json.Unmarshal([]byte(line), &r)
			c.replies <- r
		}
		close(c.replies)
	}()
	t.Cleanup(func() {
		inW.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return at EOF")
		}
	})
	return c
}

// send writes msg and, when it has an id, returns the reply.
func (c *stdioClient) send(msg string, reply bool) mcptest.Reply {
	c.t.Helper()
	if _, err := io.WriteString(c.in, msg+"\n"); err != nil {
		c.t.Fatalf("write: %v", err)
	}
	if !reply {
		return mcptest.Reply{}
	}
	select {
	case r := <-c.replies:
		return r
	case <-time.After(10 * time.Second):
		c.t.Fatalf("no reply to %.80s", msg)
	}
	return mcptest.Reply{}
}

// note sums up the next notification (mcptest.NextNote).
func (c *stdioClient) note() string {
	c.t.Helper()
	summary, _ := mcptest.NextNote(c.t, c.notes)
	return summary
}

// Over stdio: logging/setLevel is answered {}; notifications arrive at the
// level set and not below; tools/list_changed follows a reload that
// changes the tools the grant sees and not one that does not; a parked
// call's notification carries neither its stdin nor its env values.
func TestStdioLoggingAndToolsListChanged(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	c := startStdio(t, f)
	if r := c.send(mcptest.InitMsg, true); r.Result == nil {
		t.Fatalf("initialize = %+v", r.Error)
	}
	c.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, false)
	setLevel := func(level string) {
		t.Helper()
		if r := c.send(`{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"`+level+`"}}`, true); r.Error != nil {
			t.Fatalf("logging/setLevel %s = %+v; want {}", level, r.Error)
		}
	}

	all := c.send(`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, true)
	if all.Result == nil {
		t.Fatalf("tools/list = %+v", all.Error)
	}
	setLevel("notice")
	f.SetPolicy(t, "local", `{"version":"1","default":"allow","tools":{"vm_status":{"action":"allow","reason":"a"}}}`) // info: below notice
	f.SetPolicy(t, "local", `{"version":"1","default":"allow","hide":["vm_power"]}`)                                   // notice, tools changed
	for i, want := range []string{"notifications/message notice policy_reloaded", "notifications/tools/list_changed"} {
		if got := c.note(); got != want {
			t.Fatalf("notification %d at level notice = %q; want %q (nothing of the info-level reload before it)", i, got, want)
		}
	}
	if r := c.send(`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, true); r.Result == nil || len(r.Result.Tools) != len(all.Result.Tools)-1 {
		t.Errorf("tools/list after the reload = %+v; want all %d tools but vm_power", r.Result, len(all.Result.Tools))
	}

	setLevel("info")
	f.SetPolicy(t, "local", `{"version":"1","default":"allow","hide":["vm_power"],"tools":{"vm_status":{"action":"allow","reason":"b"}}}`) // tools unchanged
	f.SetPolicy(t, "local", `{"version":"1","default":"allow","tools":{"vm_agent_exec":{"action":"approve"}}}`)                            // vm_power back
	for i, want := range []string{"notifications/message info policy_reloaded", "notifications/message notice policy_reloaded", "notifications/tools/list_changed"} {
		if got := c.note(); got != want {
			t.Fatalf("notification %d at level info = %q; want %q (no list_changed after a reload that changed no tool)", i, got, want)
		}
	}

	const stdin, envValue = "stdin-s3cret-stdio", "env-s3cret-stdio"
	r := c.send(mcptest.ToolCall(4, "vm_agent_exec", `{"vm":"lab/vm1","command":["sh"],"stdin":"`+stdin+`","env":{"K":"`+envValue+`"}}`), true)
	if !mcptest.HasTag(r, catalog.TagApproval) {
		t.Fatalf("vm_agent_exec = %q; want %s", r.Text(), catalog.TagApproval)
	}
	if got, want := c.note(), "notifications/message notice approval_pending"; got != want {
		t.Fatalf("after the parked call: %q; want %q", got, want)
	}
	for {
		select {
		case line := <-c.raw:
			if strings.Contains(line, stdin) || strings.Contains(line, envValue) {
				t.Errorf("the server wrote a secret: %s", line)
			}
			continue
		default:
		}
		break
	}
}
