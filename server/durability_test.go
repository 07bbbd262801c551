package server

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// TestDecisionDurabilityByToolClass holds DESIGN.md's performance budget
// with the real audit log (fsync always): a call that reserves a counter or
// can change a guest waits for one fsync; a read-only call that reserves
// nothing waits for none, and its decision record is in the file when the
// call is answered.
func TestDecisionDurabilityByToolClass(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	// An hour-long interval keeps timer flushes out of the count.
	log, err := audit.Open(path, audit.Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	eng, err := policy.Parse("classes.json", []byte(`{"version":"1","default":"deny","tools":{
		"list_vms":{}, "vm_file_read":{}, "vm_file_write":{}, "vm_agent_exec":{},
		"vm_status":{"limits":[{"counter":"status","window":"minute","max":1000,"scope":"grant"}]},
		"vm_power":{"mode":"shadow","action":"deny"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	// The file tools run through vmgate-guest: its commands are the fake guest's.
	d, g := countingFake(&calls), newFakeGuest()
	g.file = guestFiles
	gd := g.driver()
	d.ExecStartFunc, d.ExecStatusFunc, d.FileWriteFunc = gd.ExecStartFunc, gd.ExecStatusFunc, gd.FileWriteFunc
	s, err := New(Config{
		Grants:   []Grant{{Name: "local", Policy: eng}},
		Backends: []Backend{{Name: "lab", Driver: d}},
		Store:    memory.New(), Audit: log,
		Logger:        slog.New(slog.DiscardHandler),
		GuestBinaries: haveBins(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := &conn{grant: s.grants["local"], transport: "stdio"}
	tests := []struct {
		tool, args string
		syncs      uint64
	}{
		{"list_vms", `{}`, 0}, // read-only, no counter
		{"vm_file_read", `{"vm":"lab/vm1","path":"/etc/hostname"}`, 0},         // read-only, no counter
		{"vm_status", `{"vm":"lab/vm1"}`, 1},                                   // read-only with a counter
		{"vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"x"}`, 1}, // destructive
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["true"]}`, 1},            // destructive
		{"vm_power", `{"vm":"lab/vm1","action":"reset"}`, 1},                   // destructive, shadow
	}
	for i, tt := range tests {
		before := log.Stats()
		out := s.handle(context.Background(), c, []byte(toolCall(i+1, tt.tool, tt.args)))
		if !bytes.Contains(out, []byte(`"result"`)) || bytes.Contains(out, []byte(`"isError":true`)) {
			t.Fatalf("%s = %s; want a successful result", tt.tool, out)
		}
		st := log.Stats()
		if got := st.Syncs - before.Syncs; got != tt.syncs {
			t.Errorf("%s cost %d fsyncs; want %d", tt.tool, got, tt.syncs)
		}
		if st.Writes != before.Writes+1 {
			t.Errorf("%s cost %d writes; want 1 (its decision record, before dispatch)", tt.tool, st.Writes-before.Writes)
		}
		var decisions int
		if err := audit.Read(path, func(r audit.Record) error {
			if r.Kind == audit.KindDecision && r.Tool == tt.tool {
				decisions++
			}
			return nil
		}); err != nil || decisions != 1 {
			t.Errorf("decision records of %s in the file = %d, %v; want 1", tt.tool, decisions, err)
		}
	}
}
