package bolt

import (
	"path/filepath"
	"testing"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestStore(t *testing.T) {
	for _, noSync := range []bool{true, false} {
		name := "sync"
		if noSync {
			name = "nosync"
		}
		t.Run(name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) store.Store {
				s, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{NoSync: noSync})
				if err != nil {
					t.Fatalf("Open = %v", err)
				}
				return s
			})
		})
	}
}
