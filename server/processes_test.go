package server

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// TestListProcessesHidesOtherGrantsSessions: list_processes without a
// session shows a grant every process outside sessions and those of its
// own sessions, but nothing of another grant's session (its command line
// carries that grant's secrets) nor of a session the server does not know.
func TestListProcessesHidesOtherGrantsSessions(t *testing.T) {
	f := newSessFixture(t, haveBins(), "")
	alice := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
	bob := f.createSession(t, "bob", `{"vm":"lab/vm1"}`)
	stranger := strings.Repeat("f", 32)
	proc := func(pid int32, session, cmdline string) wire.Process {
		return wire.Process{PID: pid, PPID: 1, User: "root", Name: "sh", Cmdline: cmdline, StartedAt: 1700000000000, State: "S", Session: session}
	}
	f.guest.mu.Lock()
	f.guest.procs = []wire.Process{
		proc(100, "", "/usr/bin/qemu-ga"),
		proc(101, "", "sleep 300"),
		proc(200, alice, `sh -c "make; echo alice-secret-token-ABC"`),
		proc(201, alice, "make"),
		proc(300, bob, `sh -c "sleep 1000; echo bob-secret-token-XYZ"`),
		proc(400, stranger, "echo stranger-secret"),
	}
	f.guest.mu.Unlock()
	for _, tt := range []struct {
		grant  string
		pids   []float64
		secret string // in the grant's own listing
		never  []string
	}{
		{"alice", []float64{100, 101, 200, 201}, "alice-secret-token-ABC", []string{"bob-secret-token-XYZ", bob, "stranger-secret", stranger}},
		{"bob", []float64{100, 101, 300}, "bob-secret-token-XYZ", []string{"alice-secret-token-ABC", alice, "stranger-secret", stranger}},
	} {
		r := f.as(t, tt.grant, "list_processes", `{"vm":"lab/vm1"}`)
		if r.Result == nil || r.Result.IsError {
			t.Fatalf("%s's list_processes = %q; want success", tt.grant, r.Text())
		}
		var pids []float64
		for _, p := range r.Result.StructuredContent["processes"].([]any) {
			pids = append(pids, p.(map[string]any)["pid"].(float64))
		}
		if !slices.Equal(pids, tt.pids) {
			t.Errorf("%s's list_processes pids = %v; want %v", tt.grant, pids, tt.pids)
		}
		whole := r.Text() + fmt.Sprint(r.Result.StructuredContent)
		if !strings.Contains(whole, tt.secret) {
			t.Errorf("%s's list_processes = %q; want its own session's command line", tt.grant, r.Text())
		}
		for _, s := range tt.never {
			if strings.Contains(whole, s) {
				t.Errorf("%s's list_processes shows %q; want nothing of another grant's session: %s", tt.grant, s, whole)
			}
		}
	}
}
