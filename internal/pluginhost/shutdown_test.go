package pluginhost

import (
	"strings"
	"testing"
	"time"
)

// TestCloseIsGraceful: closing the host (what serve does on SIGTERM) asks
// the plugin to stop and waits for it: the plugin exits by itself, and the
// log has no warning of a forced kill or a failed close.
func TestCloseIsGraceful(t *testing.T) {
	for i := range 3 {
		h, logs := newTestHost(t, Options{})
		s := launchSleepy(t, h, "vm1")
		pid := s.PID()
		if _, err := s.ListVMs(t.Context()); err != nil {
			t.Fatalf("ListVMs() = %v", err)
		}
		// The plugin's own WARN at its start reaches the log through its
		// stderr, asynchronously: it must be in before what Close logs is.
		waitLog(t, logs, "sleepy configured")
		before := len(logs.String())
		if err := h.Close(); err != nil {
			t.Fatalf("Close() = %v", err)
		}
		if !strings.Contains(logs.String()[before:], "plugin exited") {
			t.Errorf("round %d: Close did not see the plugin exit by itself:\n%s", i, logs.String()[before:])
		}
		if !waitGone(pid, 5*time.Second) {
			t.Fatalf("plugin pid %d alive after Close", pid)
		}
		l := logs.String()[before:] // what Close logged
		for _, bad := range []string{"failed to exit gracefully", "error closing client", "level=WARN", "level=ERROR"} {
			if strings.Contains(l, bad) {
				t.Errorf("round %d: Close logged %q:\n%s", i, bad, l)
			}
		}
	}
}
