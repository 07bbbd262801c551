package redis

import (
	"testing"

	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestSessions(t *testing.T) {
	addr, _, _ := redistest.Start(t)
	storetest.RunSessions(t, func(t *testing.T) storetest.SessionStore { return openTest(t, addr) })
}
