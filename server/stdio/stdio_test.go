package stdio

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

func TestServeStdio(t *testing.T) {
	f := servertest.New(t, servertest.Options{Policy: `{"version":"1","default":"allow","hide":["vm_power"]}`})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), f.S, "local", inR, outW); outW.Close() }()
	replies := bufio.NewScanner(outR)
	replies.Buffer(nil, 1<<20)
	exchange := func(msg string) mcptest.Reply {
		t.Helper()
		if _, err := io.WriteString(inW, msg+"\n"); err != nil {
			t.Fatalf("write: %v", err)
		}
		if !replies.Scan() {
			t.Fatalf("no reply to %.80s: %v", msg, replies.Err())
		}
		var r mcptest.Reply
		if err := json.Unmarshal(replies.Bytes(), &r); err != nil {
			t.Fatalf("reply %q: %v", replies.Bytes(), err)
		}
		return r
	}
	if r := exchange(mcptest.InitMsg); r.Result == nil {
		t.Fatalf("initialize = %+v", r.Error)
	}
	io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
	r := exchange(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if r.Result == nil || len(r.Result.Tools) != 27 {
		t.Errorf("tools/list has %d tools; want 27 (vm_power hidden)", len(r.Result.Tools))
	}
	if r := exchange(mcptest.ToolCall(3, "vm_status", `{"vm":"lab/vm1"}`)); r.Result == nil || r.Result.IsError || r.Result.StructuredContent["state"] != "running" {
		t.Errorf("vm_status = %q; want running", r.Text())
	}
	if r := exchange(mcptest.ToolCall(4, "vm_status", `{"vm":"lab/vm1","vm":"lab/vm2"}`)); !mcptest.HasTag(r, catalog.TagInvalid) {
		t.Errorf("duplicate key over stdio = %q; want %s", r.Text(), catalog.TagInvalid)
	}
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ServeStdio = %v; want nil at EOF", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeStdio did not return at EOF")
	}
}
