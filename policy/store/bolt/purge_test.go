package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/store"
)

// TestPurgeOnCreate: creating an approval or a session purges the records
// past their retention (approvals 24 h after they expire, session
// tombstones 24 h after deletion) and keeps the ones within it.
func TestPurgeOnCreate(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "state.db"))
	defer s.Close()

	approval := func(id string, created time.Time) store.Approval {
		return store.Approval{ID: id, Grant: "g", Tool: "vm_power", Digest: "d-" + id, Created: created, Expires: created.Add(time.Minute), TTL: time.Minute}
	}
	for _, a := range []store.Approval{approval("oldapproval", t0), approval("recentapproval", t0.Add(2*time.Hour))} {
		if err := s.CreateApproval(ctx, a); err != nil {
			t.Fatalf("CreateApproval(%s) = %v", a.ID, err)
		}
	}
	// 25 h after the first expired, 23 h after the second.
	if err := s.CreateApproval(ctx, approval("newapproval", t0.Add(25*time.Hour+2*time.Minute))); err != nil {
		t.Fatalf("CreateApproval(new) = %v", err)
	}
	if _, err := s.GetApproval(ctx, "oldapproval"); !errors.Is(err, store.ErrUnknownApproval) {
		t.Errorf("GetApproval(old) = %v; want ErrUnknownApproval (purged)", err)
	}
	for _, id := range []string{"recentapproval", "newapproval"} {
		if _, err := s.GetApproval(ctx, id); err != nil {
			t.Errorf("GetApproval(%s) = %v; want it kept", id, err)
		}
	}

	session := func(id string, created time.Time) store.Session {
		return store.Session{ID: id, Grant: "g", VM: "lab/vm1", Created: created}
	}
	const oldID, recentID, liveID, newID = "0000000000000001", "0000000000000002", "0000000000000003", "0000000000000004"
	for _, id := range []string{oldID, recentID, liveID} {
		if err := s.CreateSession(ctx, session(id, t0)); err != nil {
			t.Fatalf("CreateSession(%s) = %v", id, err)
		}
	}
	if _, err := s.DeleteSession(ctx, oldID, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteSession(ctx, recentID, t0.Add(3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	// 25 h after the first deletion, 23 h after the second.
	if err := s.CreateSession(ctx, session(newID, t0.Add(26*time.Hour))); err != nil {
		t.Fatalf("CreateSession(new) = %v", err)
	}
	if _, err := s.GetSession(ctx, oldID); !errors.Is(err, store.ErrUnknownSession) {
		t.Errorf("GetSession(old tombstone) = %v; want ErrUnknownSession (purged)", err)
	}
	for _, id := range []string{recentID, liveID, newID} {
		if _, err := s.GetSession(ctx, id); err != nil {
			t.Errorf("GetSession(%s) = %v; want it kept", id, err)
		}
	}
}
