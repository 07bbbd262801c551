package memory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

// sessionsApprovals is an approval store (a memory Store) that also keeps
// sessions, standing in for bbolt.
type sessionsApprovals struct {
	*Store
	*Sessions
}

func (s sessionsApprovals) Close() error { s.Sessions.Close(); return s.Store.Close() }

func TestSplitSessions(t *testing.T) {
	storetest.RunSessions(t, func(t *testing.T) storetest.SessionStore {
		s, err := NewSplit(sessionsApprovals{New(), NewSessions()})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestSplitWithoutSessions: an approval store without sessions makes every
// session call fail closed.
func TestSplitWithoutSessions(t *testing.T) {
	s, err := NewSplit(New())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	sess := store.Session{ID: "s", Grant: "g", VM: "lab/vm1", Created: time.Unix(1, 0)}
	if err := s.CreateSession(ctx, sess); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("CreateSession = %v; want ErrUnavailable", err)
	}
	if _, err := s.ListSessions(ctx, "", ""); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ListSessions = %v; want ErrUnavailable", err)
	}
}
