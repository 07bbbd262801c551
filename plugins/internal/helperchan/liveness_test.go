package helperchan

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/mux"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/helperchan/chantest"
)

// TestSilenceLimitPassedThrough: the Pool's connections give a helper
// that fell silent up after Options.SilenceLimit, and say so: the call in
// flight fails with ErrHelperLost naming the mux's silence and the
// configured limit.
func TestSilenceLimitPassedThrough(t *testing.T) {
	for _, tc := range []struct {
		opt  Options
		want time.Duration
	}{{Options{}, mux.DefaultSilenceLimit}, {Options{SilenceLimit: MinSilenceLimit}, MinSilenceLimit}} {
		if got := New(tc.opt).SilenceLimit(); got != tc.want {
			t.Errorf("New(%+v).SilenceLimit() = %v; want %v", tc.opt, got, tc.want)
		}
	}
	path, _ := chantest.MortalHelper(t)
	p := New(Options{SilenceLimit: MinSilenceLimit})
	defer p.Close()
	if rep, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"ps"}}); err != nil || string(rep.Stdout) != "ps|" {
		t.Fatalf("Call = %q, %v; want the echo", rep.Stdout, err)
	}
	_, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"die"}})
	if !errors.Is(err, hypervisor.ErrHelperLost) || !errors.Is(err, mux.ErrSilent) || !strings.Contains(err.Error(), "(limit "+MinSilenceLimit.String()+")") {
		t.Errorf("Call to a helper that fell silent = %v; want ErrHelperLost for the mux's silence, limit %v", err, MinSilenceLimit)
	}
}

// TestCheckSilenceLimit: the bounds a configured limit must keep.
func TestCheckSilenceLimit(t *testing.T) {
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{
		{0, true}, {MinSilenceLimit, true}, {30 * time.Second, true}, {MaxSilenceLimit, true},
		{-time.Second, false}, {time.Second, false}, {MinSilenceLimit - 1, false}, {MaxSilenceLimit + 1, false},
	} {
		if err := CheckSilenceLimit(tc.d); (err == nil) != tc.ok {
			t.Errorf("CheckSilenceLimit(%v) = %v; want ok %v", tc.d, err, tc.ok)
		}
	}
}

// TestDropNamesItsCause: a connection dropped because the backend said
// the helper is gone fails the call in flight at once with ErrHelperLost
// naming that cause (not the silence limit, an hour here); the next call
// dials again.
func TestDropNamesItsCause(t *testing.T) {
	path, dead := chantest.MortalHelper(t)
	p := New(Options{SilenceLimit: MaxSilenceLimit})
	defer p.Close()
	if _, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"ps"}}); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("the guest closed the port")
	done := make(chan error, 1)
	go func() {
		_, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"die"}})
		done <- err
	}()
	// Drop once the call is in flight: the helper has gone silent.
	for !dead.Load() {
		select {
		case err := <-done:
			t.Fatalf("the call ended before the drop: %v", err)
		default:
		}
	}
	p.Drop(path, cause)
	if err := <-done; !errors.Is(err, hypervisor.ErrHelperLost) || !errors.Is(err, cause) || errors.Is(err, mux.ErrSilent) {
		t.Errorf("Call in flight when dropped = %v; want ErrHelperLost naming %q", err, cause)
	}
	p.Drop(filepath.Join(t.TempDir(), "none.sock"), cause) // no connection there: nothing happens
	if rep, err := p.Call(ctxT(t), path, hypervisor.HelperCall{Args: []string{"again"}}); err == nil || !errors.Is(err, hypervisor.ErrHelperUnavailable) {
		t.Errorf("next Call = %q, %v; want a new dial, unanswered behind the dead helper (ErrHelperUnavailable)", rep.Stdout, err)
	}
}
