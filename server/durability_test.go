package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/audit/audittest"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server/mcptest"
)

// TestDecisionDurabilityByToolClass holds the performance budget of docs/design.md
// with the real audit log (fsync always): a call that can change a guest
// waits for one fsync; a read-only call that reserves nothing waits for
// none; a read-only call that reserves a counter waits for the fsync of an
// advance (advance.go) when it opens one and for none while the advance
// lasts. Every decision record is in the file when the call is answered.
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
	d, g := hypervisortest.Counting(&calls), newFakeGuest()
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
	c := &Conn{Grant: s.grants["local"], Transport: "stdio"}
	tests := []struct {
		tool, args    string
		syncs, writes uint64
	}{
		{"list_vms", `{}`, 0, 1}, // read-only, no counter
		{"vm_file_read", `{"vm":"lab/vm1","path":"/etc/hostname"}`, 0, 1},         // read-only, no counter
		{"vm_status", `{"vm":"lab/vm1"}`, 1, 2},                                   // read-only with a counter: the advance, then its decision
		{"vm_status", `{"vm":"lab/vm2"}`, 0, 1},                                   // the same counter: the advance holds its reservation
		{"vm_file_write", `{"vm":"lab/vm1","path":"/tmp/x","content":"x"}`, 1, 1}, // destructive
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["true"]}`, 1, 1},            // destructive
		{"vm_power", `{"vm":"lab/vm1","action":"reset"}`, 1, 1},                   // destructive, shadow
	}
	for i, tt := range tests {
		before := log.Stats()
		out := s.Handle(context.Background(), c, []byte(mcptest.ToolCall(i+1, tt.tool, tt.args)))
		if !bytes.Contains(out, []byte(`"result"`)) || bytes.Contains(out, []byte(`"isError":true`)) {
			t.Fatalf("%s = %s; want a successful result", tt.tool, out)
		}
		st := log.Stats()
		if got := st.Syncs - before.Syncs; got != tt.syncs {
			t.Errorf("%s cost %d fsyncs; want %d", tt.tool, got, tt.syncs)
		}
		if got := st.Writes - before.Writes; got != tt.writes {
			t.Errorf("%s cost %d writes; want %d (its decision record before dispatch, after the advance it opens)", tt.tool, got, tt.writes)
		}
		var decisions int
		if err := audit.Read(path, func(r audit.Record) error {
			if r.Kind == audit.KindDecision && r.Tool == tt.tool && r.VM == argString(tt.args, "vm") {
				decisions++
			}
			return nil
		}); err != nil || decisions != 1 {
			t.Errorf("decision records of %s %s in the file = %d, %v; want 1", tt.tool, tt.args, decisions, err)
		}
	}
}

// argString returns the string member name of the JSON object args ("" when
// absent).
func argString(args, name string) string {
	var m map[string]any
	if json.Unmarshal([]byte(args), &m) != nil {
		return ""
	}
	v, _ := m[name].(string)
	return v
}

// TestAuditRefusal: a call the audit log could not record is refused with
// the log's reason and what to do, never with the log's path.
func TestAuditRefusal(t *testing.T) {
	path := "/var/lib/vmgate/audit.log"
	enospc := &fs.PathError{Op: "write", Path: path, Err: syscall.ENOSPC}
	tests := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("audit: append: %w", enospc), "no space left on device); ask the operator to fix the disk"},
		{fmt.Errorf("audit: append: %w", fmt.Errorf("fsync: %w: %w", &fs.PathError{Op: "sync", Path: path, Err: syscall.EIO}, audit.ErrBroken)), "(input/output error) and the log takes nothing until vmgate restarts"},
		{fmt.Errorf("audit: append: %w", audit.ErrBroken), "takes nothing until vmgate restarts; ask the operator to restart it"},
		{fmt.Errorf("audit: append: %w", audit.ErrClosed), "the server is shutting down"},
		{fmt.Errorf("audit: append: %w", context.Canceled), "cancelled before its record was written"},
		{errors.New("something else"), "ask the operator to check vmgate's audit log"},
	}
	for _, tt := range tests {
		got := auditRefusal(tt.err)
		if !strings.HasPrefix(got, "the audit log is unavailable, so the call is refused") || !strings.Contains(got, tt.want) || strings.Contains(got, path) {
			t.Errorf("auditRefusal(%v) = %q; want it to say %q, without the path", tt.err, got, tt.want)
		}
	}
}

// TestAuditFailureReachesTheAgent: a decision record the log refuses
// (a disk that is full) reaches the agent as the disk's reason.
func TestAuditFailureReachesTheAgent(t *testing.T) {
	rec := &audittest.Recorder{AppendErr: func(audit.Record) error {
		return fmt.Errorf("audit: append: %w", &fs.PathError{Op: "write", Path: "/state/audit.log", Err: syscall.ENOSPC})
	}}
	f := newFixture(t, fixtureOpts{rec: rec})
	r := f.call(t, "vm_agent_exec", `{"vm":"lab/vm1","command":["true"]}`)
	if !mcptest.HasTag(r, TagDenied) || !strings.Contains(r.Text(), "no space left on device") || strings.Contains(r.Text(), "/state/") {
		t.Errorf("vm_agent_exec with a full disk = %s; want [POLICY DENIED] naming the full disk, not the path", r.Text())
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("driver calls = %d; want none (nothing runs unrecorded)", n)
	}
}
