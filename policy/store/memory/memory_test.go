package memory_test

import (
	"testing"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return memory.New() })
}
