package redistest

import (
	"testing"
)

func TestStartStopRestart(t *testing.T) {
	addr, stop, restart := Start(t)
	if err := ping(addr, ""); err != nil {
		t.Fatalf("ping(%s) after Start = %v; want nil", addr, err)
	}
	stop()
	if err := ping(addr, ""); err == nil {
		t.Fatalf("ping(%s) after stop = nil; want an error", addr)
	}
	stop() // harmless
	restart()
	if err := ping(addr, ""); err != nil {
		t.Fatalf("ping(%s) after restart = %v; want nil", addr, err)
	}
}
