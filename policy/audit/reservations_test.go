package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestReservations(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	cs := Counters{{Key: "all_calls|grant=a", Window: time.Minute, Max: 600}}
	dec := func(id string, ago time.Duration, adv string) Record {
		return Record{Kind: KindDecision, Time: now.Add(-ago), CallID: id, Decision: "allow", Counters: cs, Advance: adv}
	}
	refunded := func(id string) Record { return Record{Kind: KindOutcome, CallID: id, Outcome: "error", Refunded: true} }
	adv := func(id string, ago time.Duration, units int64) Record {
		return Record{Kind: KindAdvance, Time: now.Add(-ago), CallID: id, Counters: cs, Units: units, ValidMS: 1000}
	}
	end := func(id string, units int64) Record { return Record{Kind: KindAdvanceEnd, CallID: id, Units: units} }
	tests := []struct {
		name string
		log  []Record
		want []string // "ID@seconds ago"
	}{
		{"decisions", []Record{dec("c1", 10*time.Second, ""), dec("c2", 5*time.Second, "")}, []string{"c1@10", "c2@5"}},
		{"refunded and old ones are not restored", []Record{
			dec("c1", 10*time.Second, ""), refunded("c1"), dec("old", 2*time.Minute, ""), dec("c2", time.Second, ""),
		}, []string{"c2@1"}},
		{"an ended advance restores only its decisions", []Record{
			adv("A", 20*time.Second, 4), dec("c1", 20*time.Second, "A"), dec("c2", 19*time.Second, "A"), end("A", 2),
		}, []string{"c1@20", "c2@19"}},
		{"an open advance restores its unused units at its end", []Record{
			adv("A", 20*time.Second, 4), dec("c1", 20*time.Second, "A"),
		}, []string{"c1@20", "A/1@19", "A/2@19", "A/3@19"}},
		{"a power loss took every decision of an advance", []Record{
			adv("A", 20*time.Second, 3),
		}, []string{"A/0@19", "A/1@19", "A/2@19"}},
		{"a refunded call still used its unit", []Record{
			adv("A", 20*time.Second, 2), dec("c1", 20*time.Second, "A"), refunded("c1"),
		}, []string{"A/1@19"}},
		{"an advance whose window passed restores nothing", []Record{
			adv("A", 2*time.Minute, 3), dec("c1", 2*time.Minute, "A"),
		}, nil},
		{"an end record without its advance is ignored", []Record{end("B", 3), dec("c1", time.Second, "")}, []string{"c1@1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := logOf(t, tt.log)
			rs, err := Reservations(path, now)
			if err != nil {
				t.Fatalf("Reservations = %v", err)
			}
			var got []string
			for _, r := range rs {
				if len(r.Counters) != 1 || r.Counters[0].Key != cs[0].Key {
					t.Errorf("reservation %s counters %v; want %v", r.ID, r.Counters, cs)
				}
				got = append(got, r.ID+"@"+now.Sub(r.At).Truncate(time.Second).String())
			}
			want := make([]string, len(tt.want))
			for i, w := range tt.want {
				want[i] = w + "s"
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("Reservations(%s) = %v; want %v", tt.name, got, want)
			}
		})
	}
}

func TestReservationsNoLog(t *testing.T) {
	rs, err := Reservations(filepath.Join(t.TempDir(), "none.log"), time.Now())
	if !errors.Is(err, os.ErrNotExist) || len(rs) != 0 {
		t.Errorf("Reservations(absent log) = %v, %v; want none and os.ErrNotExist", rs, err)
	}
}

// logOf appends recs to a new log and returns its path.
func logOf(t *testing.T, recs []Record) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path, Options{Fsync: FsyncInterval})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if _, err := l.Append(context.Background(), r); err != nil {
			t.Fatalf("Append(%+v) = %v", r, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
