package bolt

import (
	"path/filepath"
	"testing"

	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestSessions(t *testing.T) {
	storetest.RunSessions(t, func(t *testing.T) storetest.SessionStore {
		s, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{NoSync: true})
		if err != nil {
			t.Fatalf("Open = %v", err)
		}
		return s
	})
}
