package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/server/jsonrpc"
	"github.com/vmgate/vmgate/server/mcptest"
)

// Number ids reach mcp-go, which reads them through float64: only
// integers it holds exactly may pass, the rest is refused before anything
// else (no audit record, no driver call), with id null.
func TestNumberIDsMustBeExactIntegers(t *testing.T) {
	tests := []struct {
		id      string
		refused bool
	}{
		{"1", false},
		{"0", false},
		{"-1", false},
		{"9007199254740991", false},
		{"-9007199254740991", false},
		{"9007199254740992", true},
		{"-9007199254740993", true},
		{"123456789012345678901234567890123456789", true},
		{"1.5", true},
		{"1.0", true},
		{"1e3", true},
		{"1E3", true},
		{"-0", true},
	}
	for _, tt := range tests {
		for _, method := range []string{"tools/call", "ping"} {
			f := newFixture(t, fixtureOpts{})
			msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":%q,"params":{"name":"list_vms","arguments":{}}}`, tt.id, method)
			if method == "ping" {
				msg = fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"ping"}`, tt.id)
			}
			r := f.send(t, msg)
			if tt.refused {
				if r.Error == nil || r.Error.Code != -32600 || string(r.ID) != "null" {
					t.Errorf("%s with id %s = id %s, error %+v; want -32600 with id null", method, tt.id, r.ID, r.Error)
				}
				if n := len(f.rec.Records()); n != 0 {
					t.Errorf("%s with id %s: %d audit records; want 0 (refused as an envelope error)", method, tt.id, n)
				}
				if n := f.calls.Load(); n != 0 {
					t.Errorf("%s with id %s: driver called %d times; want 0", method, tt.id, n)
				}
				continue
			}
			if r.Error != nil || !bytes.Equal(r.ID, []byte(tt.id)) {
				t.Errorf("%s with id %s = id %s, error %+v; want a reply with id %s byte for byte", method, tt.id, r.ID, r.Error, tt.id)
			}
		}
	}
}

func TestExactIntegerID(t *testing.T) {
	for _, tt := range []struct {
		n    json.Number
		want bool
	}{{"42", true}, {"-9007199254740991", true}, {"9007199254740992", false}, {"2.0", false}, {"-0", false}, {"1e0", false}} {
		if got := jsonrpc.ExactIntegerID(tt.n); got != tt.want {
			t.Errorf("jsonrpc.ExactIntegerID(%v) = %v; want %v", tt.n, got, tt.want)
		}
	}
}

// A hostile VM id is "[UNKNOWN VM]" for every tool, before any driver
// call, audited as unknown_vm; list_sessions with a VM that does not exist
// too (it would otherwise answer "0 session(s)" for any name).
func TestHostileVMIDs(t *testing.T) {
	ids := []string{
		"lab/*", "lab/vm?", "lab/[v]m1", "lab/{vm1,vm2}", "*/vm1", "lab/../vm1", "lab/vm1/..", "lab/..",
		"lab//vm1", "lab/vm1/x", "lab/-vm1", "lab/.vm1", "lab/ vm1", "lab/vm1 ", "lab/vm1\n", "lab/vm1\u0000",
		"lab/vm1\t", "lab/v\u0430m1", "lab/vm1;reboot", "lab/$(reboot)", "lab/vm1|x", "lab/~vm1", "lab/vm1%2f",
		"lab\\vm1", "LAB/vm1", "lab/", "/vm1", "vm1", "", "lab/" + strings.Repeat("a", 256),
	}
	tools := []struct{ name, args string }{
		{"vm_status", `{"vm":%s}`},
		{"list_sessions", `{"vm":%s}`},
		{"list_processes", `{"vm":%s}`},
		{"vm_file_read", `{"vm":%s,"path":"/etc/hostname"}`},
		{"vm_agent_exec", `{"vm":%s,"command":["true"]}`},
	}
	for _, id := range ids {
		q, _ := json.Marshal(id)
		for _, tool := range tools {
			f := newFixture(t, fixtureOpts{})
			r := f.call(t, tool.name, fmt.Sprintf(tool.args, q))
			if !mcptest.HasTag(r, TagUnknownVM) && !mcptest.HasTag(r, TagInvalid) {
				t.Errorf("%s(vm %q) = %q; want %s or %s", tool.name, id, r.Text(), TagUnknownVM, TagInvalid)
			}
			if n := f.calls.Load(); n != 0 {
				t.Errorf("%s(vm %q): driver called %d times; want 0", tool.name, id, n)
			}
			recs := f.rec.Records()
			if len(recs) != 1 || recs[0].Decision != decisionUnknownVM && recs[0].Decision != decisionInvalid {
				t.Errorf("%s(vm %q): audit %+v; want one unknown_vm or invalid decision", tool.name, id, recs)
			}
		}
	}
	f := newFixture(t, fixtureOpts{})
	if r := f.call(t, "list_sessions", `{"vm":"lab/nosuch"}`); !mcptest.HasTag(r, TagUnknownVM) {
		t.Errorf("list_sessions(vm lab/nosuch) = %q; want %s", r.Text(), TagUnknownVM)
	}
}
