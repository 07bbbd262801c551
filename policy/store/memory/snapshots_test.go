package memory

import (
	"testing"

	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestSnapshots(t *testing.T) {
	storetest.RunSnapshots(t, func(t *testing.T) storetest.SnapshotStore { return NewSnapshots() })
}
