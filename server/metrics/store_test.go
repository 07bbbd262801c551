package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// failingLeases is a lease store whose every call fails as a store that
// does not answer.
type failingLeases struct{}

var errDown = errors.New("store down")

func (failingLeases) AcquireLease(context.Context, store.Lease) error { return errDown }
func (failingLeases) GetLease(context.Context, string) (store.Lease, error) {
	return store.Lease{}, errDown
}
func (failingLeases) ListLeases(context.Context) ([]store.Lease, error) { return nil, errDown }
func (failingLeases) UpdateLease(context.Context, store.Lease) (store.Lease, error) {
	return store.Lease{}, errDown
}
func (failingLeases) ReleaseLease(context.Context, string) error { return errDown }

// TestStorePassesOptionalPartsThrough: the counting wrapper keeps exactly
// the optional parts (sessions, leases, snapshot owners) of the store it
// wraps, so that the server finds them on the wrapper, and counts their
// failures too.
func TestStorePassesOptionalPartsThrough(t *testing.T) {
	m := newMetrics(t, Options{})
	base := struct{ store.Store }{memory.New()} // the base methods only
	full := memory.New()
	tests := []struct {
		name                     string
		in                       store.Store
		sessions, leases, owners bool
	}{
		{"base only", base, false, false, false},
		{"memory", full, ok[store.Sessions](full), ok[store.Leases](full), ok[store.Snapshots](full)},
		{"leases only", struct {
			store.Store
			failingLeases
		}{base, failingLeases{}}, false, true, false},
		{"sessions and owners", struct {
			store.Store
			*memory.Sessions
			*memory.Snapshots
		}{base, memory.NewSessions(), memory.NewSnapshots()}, true, false, true},
	}
	for _, tt := range tests {
		w := m.Store(tt.in)
		got := [3]bool{ok[store.Sessions](w), ok[store.Leases](w), ok[store.Snapshots](w)}
		if want := [3]bool{tt.sessions, tt.leases, tt.owners}; got != want {
			t.Errorf("%s: the wrapper keeps sessions, leases, owners = %v; want %v", tt.name, got, want)
		}
	}
	w := m.Store(tests[2].in).(store.Leases)
	if _, err := w.ListLeases(context.Background()); !errors.Is(err, errDown) {
		t.Fatalf("ListLeases through the wrapper = %v; want the store's error", err)
	}
	if body := scrape(t, m); !strings.Contains(body, `vmgate_store_errors_total{op="list_leases"} 1`) {
		t.Errorf("metrics after a failed lease listing lack op list_leases at 1:\n%s", body)
	}
}

// ok reports whether v implements I.
func ok[I any](v any) bool {
	_, is := v.(I)
	return is
}
