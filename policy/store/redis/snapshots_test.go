package redis

import (
	"testing"

	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestSnapshots(t *testing.T) {
	addr, _, _ := redistest.Start(t)
	storetest.RunSnapshots(t, func(t *testing.T) storetest.SnapshotStore { return openTest(t, addr) })
}
