package server

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/mcptest"
)

// TestOneFsyncPerCall holds the budget of docs/design.md with the real audit log: a
// sequential rate-limited read-only call (benchCall) costs one write(2)
// (its decision record; the previous call's outcome rides along) and
// shares the one fsync of the advance that holds its reservation
// (advance.go): 20 calls, one advance of 32 units, one fsync. A refused
// call costs none (its record waits for the next commit).
func TestOneFsyncPerCall(t *testing.T) {
	for _, kind := range []benchStore{storeSplit, storeBolt} {
		t.Run(string(kind), func(t *testing.T) {
			// An hour-long interval keeps timer flushes out of the count.
			g := gatedServer(t, kind, audit.FsyncAlways, time.Hour)
			c := &Conn{Grant: g.s.grants["local"], Transport: "stdio"}
			ctx := context.Background()
			const calls = 20
			before := g.log.Stats()
			for range calls {
				out := g.s.Handle(ctx, c, []byte(benchCall))
				if !bytes.Contains(out, []byte(`"result"`)) || bytes.Contains(out, []byte(`"isError":true`)) {
					t.Fatalf("handle(%s) = %s; want a successful result", benchCall, out)
				}
			}
			st := g.log.Stats()
			if got := st.Syncs - before.Syncs; got != 1 {
				t.Errorf("%d sequential calls cost %d fsyncs; want 1 (their advance's)", calls, got)
			}
			if got := st.Writes - before.Writes; got != calls+1 {
				t.Errorf("%d sequential calls cost %d writes; want %d (one each and the advance)", calls, got, calls+1)
			}

			refused := []string{
				mcptest.ToolCall(7, "no_such_tool", `{}`),
				mcptest.ToolCall(8, "vm_status", `{}`),
				mcptest.ToolCall(9, "vm_status", `{"vm":"other/vm9"}`),
				mcptest.ToolCall(10, "vm_status", `{"vm":"lab/vm1","VM":"lab/vm2"}`),
				`{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"vm_status","arguments":{"vm":"lab/vm1"}`,
			}
			before = g.log.Stats()
			for _, msg := range refused {
				out := g.s.Handle(ctx, c, []byte(msg))
				if !bytes.Contains(out, []byte(`"isError":true`)) && !bytes.Contains(out, []byte(`"error"`)) {
					t.Fatalf("handle(%s) = %s; want a refusal", msg, out)
				}
			}
			if st := g.log.Stats(); st.Syncs != before.Syncs || st.Writes != before.Writes {
				t.Errorf("%d refused calls cost %d fsyncs and %d writes; want none", len(refused), st.Syncs-before.Syncs, st.Writes-before.Writes)
			}
			// The refusals are recorded: they ride with the next write.
			g.s.Handle(ctx, c, []byte(benchCall))
			if st := g.log.Stats(); st.Writes != before.Writes+1 || st.Records < before.Records+uint64(len(refused))+1 {
				t.Errorf("after one more call: %+v (before %+v); want 1 write carrying the %d refusal records", st, before, len(refused))
			}
		})
	}
}
