package memory

import (
	"testing"

	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestSessions(t *testing.T) {
	storetest.RunSessions(t, func(t *testing.T) storetest.SessionStore { return NewSessions() })
}
