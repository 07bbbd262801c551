package mux

import (
	"fmt"
	"strings"
	"time"
)

// Liveness defaults (Options).
const (
	// DefaultPingEvery is how often a Client pings.
	DefaultPingEvery = time.Second
	// DefaultSilenceLimit is how long the guest may send nothing while it
	// owes the host an answer before the connection is given up. An
	// emulated (TCG) guest on a host under a load of 30 to 40 went more
	// than 4 s without a frame while alive; a helper that died behind a
	// port whose host end stays open is found after this long.
	DefaultSilenceLimit = 30 * time.Second
)

// Options tune a Client's liveness check. Zero fields take the defaults.
type Options struct {
	// PingEvery is how often the client pings (DefaultPingEvery).
	PingEvery time.Duration
	// SilenceLimit is how long the guest may stay silent while it owes an
	// answer (a call in flight, a ping unanswered) before the connection
	// fails with ErrSilent (DefaultSilenceLimit). Silence is counted in
	// ticks of PingEvery that the client itself saw, so a host process
	// that was not scheduled for a while does not count its own stall
	// against the guest.
	SilenceLimit time.Duration

	// clk drives time in tests; nil means the real clock.
	clk *clock
}

func (o Options) withDefaults() Options {
	if o.PingEvery <= 0 {
		o.PingEvery = DefaultPingEvery
	}
	if o.SilenceLimit <= 0 {
		o.SilenceLimit = DefaultSilenceLimit
	}
	if o.clk == nil {
		o.clk = realClock()
	}
	return o
}

// clock is the time a Client sees: now for the calls' start, ticker for
// the keepalive. Tests replace both.
type clock struct {
	now    func() time.Time
	ticker func(d time.Duration) (<-chan time.Time, func())
}

func realClock() *clock {
	return &clock{now: time.Now, ticker: func(d time.Duration) (<-chan time.Time, func()) {
		t := time.NewTicker(d)
		return t.C, t.Stop
	}}
}

// owed is what the guest owes the host at one tick: the calls in flight
// and the oldest of them.
type owed struct {
	calls      int
	oldestSent time.Time
	oldestWhat string
}

// silence follows, tick by tick, how long the guest has sent nothing while
// it owed something. Only the keepalive goroutine uses it.
type silence struct {
	heard   uint64    // the frame count at the last tick
	heardAt time.Time // the tick that saw the last new frame
	pingAt  time.Time // the first ping sent since then; zero when none
	pings   int       // pings sent since then
	ticks   int       // ticks since then at which the guest owed something
}

// tick takes one tick at now, with heard frames counted so far and what
// the calls owe. It returns ErrSilent, saying how long and what was
// owed, once the guest has owed something and sent nothing for limit,
// over at least limit/every ticks the client saw.
func (s *silence) tick(now time.Time, heard uint64, o owed, every, limit time.Duration) error {
	if heard != s.heard || s.heardAt.IsZero() {
		*s = silence{heard: heard, heardAt: now}
	}
	from := s.pingAt
	if o.calls > 0 {
		sent := o.oldestSent
		if sent.Before(s.heardAt) {
			sent = s.heardAt // the guest was heard after this call was sent
		}
		if from.IsZero() || sent.Before(from) {
			from = sent
		}
	}
	if from.IsZero() {
		s.ticks = 0
		return nil
	}
	s.ticks++
	quiet := now.Sub(from)
	if time.Duration(s.ticks)*every < limit || quiet < limit {
		return nil
	}
	return fmt.Errorf("%w: nothing for %v (limit %v) while it owed %s; giving the connection up (the next call dials again)",
		ErrSilent, quiet.Round(time.Millisecond), limit, s.describe(now, o))
}

// pinged records a ping sent at now.
func (s *silence) pinged(now time.Time) {
	if s.pingAt.IsZero() {
		s.pingAt = now
	}
	s.pings++
}

// describe says what the guest owed: the calls (the oldest named, with
// its age) and the unanswered pings.
func (s *silence) describe(now time.Time, o owed) string {
	var parts []string
	if o.calls > 0 {
		parts = append(parts, fmt.Sprintf("%d call(s) (the oldest, %q, sent %v ago)",
			o.calls, o.oldestWhat, now.Sub(o.oldestSent).Round(time.Millisecond)))
	}
	if s.pings > 0 {
		parts = append(parts, fmt.Sprintf("%d ping(s) (the first sent %v ago)", s.pings, now.Sub(s.pingAt).Round(time.Millisecond)))
	}
	return strings.Join(parts, " and ")
}

// callName names a call for an error: its leading command words (at most
// two lowercase words, such as "session create"), never its other
// arguments, which may carry a caller's data.
func callName(args []string) string {
	var words []string
	for _, a := range args {
		if len(words) == 2 || !commandWord(a) {
			break
		}
		words = append(words, a)
	}
	if len(words) == 0 {
		return "(unnamed)"
	}
	return strings.Join(words, " ")
}

func commandWord(a string) bool {
	if a == "" || len(a) > 16 || a[0] == '-' {
		return false
	}
	for _, c := range a {
		if (c < 'a' || c > 'z') && c != '-' {
			return false
		}
	}
	return true
}
