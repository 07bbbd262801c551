package audit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrWhen: a time bound is neither a duration before now, an RFC 3339 time
// nor a date.
var ErrWhen = errors.New("want a duration before now (7d, 36h, 1d12h, 90m), an RFC 3339 time (2026-07-01T12:00:00Z) or a date (2026-07-01)")

// ParseWhen reads a bound of a search (Filter.Since, Filter.Until) as
// `vmgate audit search --since` and the operator page take it: empty
// (unbounded: the zero time), an RFC 3339 time, a date (midnight UTC), or
// a duration before now with days allowed ("7d", "1d12h", "90m").
func ParseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	d, err := parseDays(s)
	if err != nil || d < 0 {
		return time.Time{}, ErrWhen
	}
	return now.Add(-d), nil
}

// parseDays is time.ParseDuration with a leading number of days ("7d",
// "1d12h").
func parseDays(s string) (time.Duration, error) {
	days, rest, ok := strings.Cut(s, "d")
	if !ok {
		return time.ParseDuration(s)
	}
	n, err := strconv.Atoi(days)
	if err != nil || n < 0 || n > 3650 {
		return 0, fmt.Errorf("bad number of days %q", days)
	}
	d := time.Duration(n) * 24 * time.Hour
	if rest == "" {
		return d, nil
	}
	r, err := time.ParseDuration(rest)
	return d + r, err
}

// SetBounds sets f's Kind, Since and Until from their text as a user gives
// them (kind: "" or a Kind; since, until: ParseWhen's forms), checking that
// until comes after since. Errors name each by prefix+name ("--since" for
// a command's flag, "since" for a form's field).
func (f *Filter) SetBounds(prefix, kind, since, until string, now time.Time) error {
	switch k := Kind(kind); k {
	case "", KindDecision, KindOutcome, KindAdvance, KindAdvanceEnd:
		f.Kind = k
	default:
		return fmt.Errorf("%skind %q: want decision, outcome, advance or advance_end", prefix, kind)
	}
	var err error
	if f.Since, err = ParseWhen(since, now); err != nil {
		return fmt.Errorf("%ssince %q: %w", prefix, since, err)
	}
	if f.Until, err = ParseWhen(until, now); err != nil {
		return fmt.Errorf("%suntil %q: %w", prefix, until, err)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return fmt.Errorf("%suntil %s is not after %ssince %s", prefix, until, prefix, since)
	}
	return nil
}
