package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/mcptest"
)

// approvalsParked counts the approvals the store holds.
func approvalsParked(t *testing.T, f *fixture) int {
	t.Helper()
	list, err := f.store.ListApprovals(context.Background(), time.Unix(0, f.now.Load()))
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// TestHopelessCallsAreNotParked: a call that needs an operator's approval
// but cannot succeed (destroy_session of a session already destroyed or
// unknown, snapshot_delete or snapshot_revert of a snapshot that is not
// there) is refused at once with why, and no operator is asked.
func TestHopelessCallsAreNotParked(t *testing.T) {
	t.Run("sessions", func(t *testing.T) {
		f := newSessFixture(t, haveBins(), `{"version":"1","default":"allow","tools":{"destroy_session":{"action":"approve"}}}`)
		id := f.createSession(t, "alice", `{"vm":"lab/vm1"}`)
		args := `{"vm":"lab/vm1","session":"` + id + `"}`
		first := f.as(t, "alice", "destroy_session", args)
		ap, _ := first.Result.StructuredContent["approval_id"].(string)
		if !mcptest.HasTag(first, TagApproval) || ap == "" {
			t.Fatalf("destroy_session of a live session = %q; want %s", first.Text(), TagApproval)
		}
		if _, err := f.s.Approvals().Grant(context.Background(), ap, "op", "ok"); err != nil {
			t.Fatal(err)
		}
		if r := f.as(t, "alice", "destroy_session", args); r.Result == nil || r.Result.IsError {
			t.Fatalf("destroy_session after the grant = %q; want success", r.Text())
		}
		for _, c := range []struct{ name, args, want string }{
			{"destroyed", args, "already destroyed"},
			{"unknown", `{"vm":"lab/vm1","session":"0123456789abcdef0123456789abcdef"}`, "unknown session"},
		} {
			r := f.as(t, "alice", "destroy_session", c.args)
			if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), c.want) {
				t.Errorf("destroy_session of a %s session = %q; want %s saying %q", c.name, r.Text(), TagInvalid, c.want)
			}
		}
		if n := approvalsParked(t, f.fixture); n != 1 {
			t.Errorf("approvals = %d; want only the first one (nothing parked for a hopeless call)", n)
		}
	})
	t.Run("snapshots", func(t *testing.T) {
		f, sf := newSnapFixture(t, bothModes, `{"version":"1","default":"allow","tools":{"snapshot_revert":{"action":"approve"},"snapshot_delete":{"action":"approve"}}}`)
		sf.put("vm1", hypervisor.Snapshot{Name: "there"})
		for _, tool := range []string{"snapshot_delete", "snapshot_revert"} {
			r := f.call(t, tool, `{"vm":"lab/vm1","name":"missing"}`)
			if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), `no snapshot "missing"`) {
				t.Errorf("%s of a missing snapshot = %q; want %s saying it is not there", tool, r.Text(), TagInvalid)
			}
		}
		if n := approvalsParked(t, f); n != 0 {
			t.Errorf("approvals = %d; want none for snapshots that are not there", n)
		}
		if r := f.call(t, "snapshot_delete", `{"vm":"lab/vm1","name":"there"}`); !mcptest.HasTag(r, TagApproval) {
			t.Errorf("snapshot_delete of a snapshot that is there = %q; want %s", r.Text(), TagApproval)
		}
	})
}
