package memory

import (
	"testing"

	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestLeases(t *testing.T) {
	storetest.RunLeases(t, func(t *testing.T) storetest.LeaseStore { return New() })
}

// TestSplitLeases: a Split keeps leases in its approval store.
func TestSplitLeases(t *testing.T) {
	storetest.RunLeases(t, func(t *testing.T) storetest.LeaseStore {
		s, err := NewSplit(New())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
