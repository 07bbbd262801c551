package bolt

import (
	"path/filepath"
	"testing"

	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestSnapshots(t *testing.T) {
	storetest.RunSnapshots(t, func(t *testing.T) storetest.SnapshotStore {
		s, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{NoSync: true})
		if err != nil {
			t.Fatalf("Open = %v", err)
		}
		return s
	})
}
