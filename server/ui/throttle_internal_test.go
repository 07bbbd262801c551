package ui

import (
	"fmt"
	"testing"
	"time"
)

// Wrong tokens from ever more addresses keep the throttle's memory
// bounded: at most maxThrottledAddrs addresses, a few failures each, and
// the last LoginFailuresTotal of all.
func TestLoginThrottleMemoryIsBounded(t *testing.T) {
	at := time.Unix(1_000_000, 0)
	l := newLoginThrottle(func() time.Time { return at })
	for i := range 3 * maxThrottledAddrs {
		for range LoginFailuresPerAddr + 3 {
			l.fail(fmt.Sprintf("10.%d.%d.%d:1", i>>16&0xff, i>>8&0xff, i&0xff))
		}
		at = at.Add(time.Millisecond)
	}
	if n := len(l.addrs); n > maxThrottledAddrs {
		t.Errorf("%d addresses kept; want at most %d", n, maxThrottledAddrs)
	}
	for k, ts := range l.addrs {
		if len(ts) > LoginFailuresPerAddr {
			t.Fatalf("%d failures kept for %s; want at most %d", len(ts), k, LoginFailuresPerAddr)
		}
	}
	if len(l.all) > LoginFailuresTotal {
		t.Errorf("%d failures kept in all; want at most %d", len(l.all), LoginFailuresTotal)
	}
	// The last address is still counted: it is blocked.
	last := fmt.Sprintf("10.%d.%d.%d:1", (3*maxThrottledAddrs-1)>>16&0xff, (3*maxThrottledAddrs-1)>>8&0xff, (3*maxThrottledAddrs-1)&0xff)
	if _, blocked := l.blocked(last); !blocked {
		t.Errorf("the last address, after %d wrong tokens, is not blocked", LoginFailuresPerAddr+3)
	}
}
