package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

const testPassword = "s3cret-pass"

func openSentinelTest(t testing.TB, d *redistest.Deployment, prefix string) *Store {
	t.Helper()
	return openSentinelAck(t, d, prefix, 200*time.Millisecond)
}

// openSentinelAck is openSentinelTest with ack as Options.AckTimeout.
func openSentinelAck(t testing.TB, d *redistest.Deployment, prefix string, ack time.Duration) *Store {
	t.Helper()
	if prefix == "" {
		prefix = fmt.Sprintf("t%d:", prefixes.Add(1))
	}
	s, err := OpenSentinel(Sentinel{Master: redistest.MasterName, Addrs: d.SentinelAddrs(), Password: testPassword},
		Options{Prefix: prefix, Timeout: max(2*time.Second, 2*ack), AckTimeout: ack})
	if err != nil {
		t.Fatalf("OpenSentinel = %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSentinelStore runs the shared suites through Sentinel: every write
// waits for the replica and still behaves like the other stores.
func TestSentinelStore(t *testing.T) {
	d := redistest.StartSentinel(t, redistest.SentinelOptions{Password: testPassword})
	open := func(t *testing.T) *Store { return openSentinelTest(t, d, "") }
	t.Run("Store", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
	})
	t.Run("Leases", func(t *testing.T) {
		storetest.RunLeases(t, func(t *testing.T) storetest.LeaseStore { return open(t) })
	})
	t.Run("Sessions", func(t *testing.T) {
		storetest.RunSessions(t, func(t *testing.T) storetest.SessionStore { return open(t) })
	})
}

func TestOpenSentinelBadInput(t *testing.T) {
	good := Sentinel{Master: "m", Addrs: []string{"127.0.0.1:1"}}
	tests := []struct {
		name string
		sn   Sentinel
		opts Options
	}{
		{"no master", Sentinel{Addrs: good.Addrs}, Options{}},
		{"no sentinels", Sentinel{Master: "m"}, Options{}},
		{"negative ack timeout", good, Options{AckTimeout: -time.Millisecond}},
		{"ack timeout in µs", good, Options{AckTimeout: 1500 * time.Microsecond}},
		{"ack timeout past the timeout", good, Options{Timeout: 100 * time.Millisecond, AckTimeout: 100 * time.Millisecond}},
	}
	for _, tt := range tests {
		if s, err := OpenSentinel(tt.sn, tt.opts); !errors.Is(err, store.ErrInvalid) {
			if s != nil {
				s.Close()
			}
			t.Errorf("OpenSentinel(%s) = %v; want ErrInvalid", tt.name, err)
		}
	}
}

// TestSentinelReplicaSilent: while the replica does not acknowledge (it is
// stopped), every write that lets a call run fails with ErrUnavailable
// within about the ack timeout, saying why: fail closed. The refused
// reservation is taken back. Once the replica is back, writes go through
// again.
func TestSentinelReplicaSilent(t *testing.T) {
	d := redistest.StartSentinel(t, redistest.SentinelOptions{Password: testPassword})
	s := openSentinelTest(t, d, "")
	ctx := context.Background()
	c := []policy.Counter{{Key: "silent", Name: "silent", Window: time.Hour, Max: 2}}
	if err := s.ReserveAll(ctx, "before", storetest.T0(), c); err != nil {
		t.Fatalf("ReserveAll with the replica up = %v; want nil", err)
	}
	if err := s.CreateApproval(ctx, testApproval("ap1")); err != nil {
		t.Fatal(err)
	}
	d.Servers[1].Pause()
	t.Cleanup(d.Servers[1].Resume)
	calls := map[string]func() error{
		"ReserveAll": func() error { return s.ReserveAll(ctx, "during", storetest.T0(), c) },
		"CreateApproval": func() error {
			return s.CreateApproval(ctx, testApproval("ap2"))
		},
		"DecideApproval": func() error {
			_, err := s.DecideApproval(ctx, "ap1", true, "op", "", storetest.T0())
			return err
		},
		"AcquireLease": func() error {
			return s.AcquireLease(ctx, storetest.NewLease("l1", "lab/vm1", 0))
		},
	}
	for name, call := range calls {
		start := time.Now()
		err := call()
		el := time.Since(start)
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, errNotReplicated) {
			t.Errorf("%s with the replica stopped = %v; want ErrUnavailable for want of an acknowledgement", name, err)
		}
		if el < s.ackTimeout || el > s.timeout {
			t.Errorf("%s with the replica stopped took %v; want the ack timeout %v (at most the timeout %v)", name, el, s.ackTimeout, s.timeout)
		}
	}
	d.Servers[1].Resume()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err = s.ReserveAll(ctx, "after", storetest.T0(), c); !errors.Is(err, store.ErrUnavailable) {
			break
		}
	}
	if err != nil {
		t.Fatalf("ReserveAll after the replica came back = %v; want nil (the refused reservation was taken back)", err)
	}
	// "before" and "after" fill the max of 2.
	var le *store.LimitedError
	if err := s.ReserveAll(ctx, "third", storetest.T0(), c); !errors.As(err, &le) {
		t.Errorf("a third ReserveAll of a max-2 counter = %v; want the limit", err)
	}
}

func testApproval(id string) store.Approval {
	return store.Approval{ID: id, Grant: "alice", Tool: "vm_power", Digest: "d", State: store.ApprovalPending,
		Created: storetest.T0(), Expires: storetest.T0().Add(time.Hour), TTL: time.Hour}
}

// TestFailoverKeepsWhatItAcknowledged: the replica falls behind (it is
// stopped and the primary drops its link), writes are made, and the
// primary is killed with SIGKILL; Sentinel promotes the replica, which
// never saw them. A store that does not wait for the replica (Open on the
// primary's URL, the control) acknowledged them and loses them: its
// approval runs twice and its max-1 counter allows two. The Sentinel store
// refused them instead (no replica acknowledged): across the failover its
// approval is used once and its counter allows one. A lease it wrote
// before is on the new primary, where another replica takes it over.
func TestFailoverKeepsWhatItAcknowledged(t *testing.T) {
	// Sentinel promotes only a replica whose link to the primary has been
	// down for less than ten times down-after-milliseconds (plus the time
	// the primary has been down): the replica is cut below before three
	// acknowledgements wait out their 5 s each, so a 1 s down-after left
	// it ineligible on a loaded machine, and no failover came.
	d := redistest.StartSentinel(t, redistest.SentinelOptions{Password: testPassword, DownAfter: 4 * time.Second})
	ctx := context.Background()
	old := d.Servers[0]
	// An acknowledgement may take seconds on a loaded machine (the old
	// primary back as a replica, catching up): a write applied but not
	// acknowledged in time is refused, and an approval it consumed is
	// spent (fail closed), which would leave the scenario nothing to count.
	acked := openSentinelAck(t, d, "", 5*time.Second)
	control, err := Open("redis://:"+testPassword+"@"+old.Addr(), Options{Prefix: fmt.Sprintf("ctl%d:", prefixes.Add(1)), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer control.Close()
	lease := storetest.NewLease("l1", "lab/vm1", 0)
	// The control's writes first: the Sentinel store's acknowledged ones
	// after them cover them (WAIT counts every earlier write).
	for _, s := range []*Store{control, acked} {
		if err := s.CreateApproval(ctx, testApproval("ap")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.DecideApproval(ctx, "ap", true, "op", "", storetest.T0()); err != nil {
			t.Fatal(err)
		}
	}
	if err := acked.AcquireLease(ctx, lease); err != nil {
		t.Fatal(err)
	}
	cutReplica(t, d)
	var ctl, ack useCount
	if err := ctl.use(control, "c1"); err != nil {
		t.Fatalf("control before the failover: %v", err)
	}
	if err := ack.use(acked, "a1"); !errors.Is(err, errNotReplicated) {
		t.Fatalf("Sentinel store with the replica behind = %v; want it refused for want of an acknowledgement", err)
	}
	if err := acked.ReserveAll(ctx, "a1", storetest.T0(), onceCounter); !errors.Is(err, errNotReplicated) {
		t.Fatalf("Sentinel store ReserveAll with the replica behind = %v; want it refused", err)
	}
	primary := failOver(t, d)
	control2, err := Open("redis://:"+testPassword+"@"+primary.Addr(), Options{Prefix: control.prefix, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer control2.Close()
	if err := ctl.use(control2, "c2"); err != nil {
		t.Fatal(err)
	}
	if ctl.uses != 2 || ctl.grants != 2 {
		t.Fatalf("the control lost nothing (approval used %d times, %d grants of a max-1 counter): the scenario proves nothing", ctl.uses, ctl.grants)
	}
	// The new primary's replica in sync first: a write acknowledged.
	probe := 0
	if err := until(60*time.Second, func() error {
		probe++
		return acked.ReserveAll(ctx, fmt.Sprintf("probe%d", probe), storetest.T0(), probeCounter)
	}); err != nil {
		t.Fatalf("a write acknowledged after the failover: %v", err)
	}
	if err := until(30*time.Second, func() error { return ack.use(acked, "a2") }); err != nil {
		t.Fatalf("Sentinel store after the failover: %v", err)
	}
	if ack.uses != 1 || ack.grants != 1 {
		t.Errorf("through the failover the Sentinel store used its approval %d times and granted %d of a max-1 counter; want 1 and 1", ack.uses, ack.grants)
	}
	// Another replica's reaper takes the lease over on the new primary.
	other := openSentinelTest(t, d, acked.prefix)
	l, err := other.GetLease(ctx, lease.ID)
	if err != nil {
		t.Fatalf("the lease acquired before the failover: %v", err)
	}
	l.State, l.Holder, l.Until = store.LeaseDeleting, "reaper-b", l.Until.Add(time.Minute)
	if _, err := other.UpdateLease(ctx, l); err != nil {
		t.Errorf("another replica taking the lease over after the failover: %v", err)
	}
}

var onceCounter = []policy.Counter{{Key: "once", Name: "once", Window: time.Hour, Max: 1}}

// probeCounter is reserved to see that writes are acknowledged again.
var probeCounter = []policy.Counter{{Key: "probe", Name: "probe", Window: time.Hour, Max: 1 << 20}}

// useCount counts the calls a store let run on approval "ap" and the
// reservations it granted of onceCounter.
type useCount struct{ uses, grants int }

// use consumes the approval and reserves id, as a call would.
func (u *useCount) use(s *Store, id string) error {
	ctx := context.Background()
	_, ok, err := s.ConsumeApproval(ctx, "alice", "vm_power", "d", storetest.T0())
	if err != nil {
		return err
	}
	if ok {
		u.uses++
	}
	var le *store.LimitedError
	switch err := s.ReserveAll(ctx, id, storetest.T0(), onceCounter); {
	case err == nil:
		u.grants++
	case !errors.As(err, &le):
		return err
	}
	return nil
}

// cutReplica makes the replica fall behind: stopped (until failOver), and
// its link dropped by the primary, so that what the primary writes next
// never reaches it.
func cutReplica(t *testing.T, d *redistest.Deployment) {
	d.Servers[1].Pause()
	t.Cleanup(d.Servers[1].Resume)
	pc := d.Client(d.Servers[0])
	defer pc.Close()
	if err := pc.Do(context.Background(), "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
}

// failOver kills the primary (SIGKILL), lets the replica go on, waits for
// Sentinel to promote it and brings the old primary back as its replica.
func failOver(t *testing.T, d *redistest.Deployment) *redistest.Server {
	old := d.Servers[0]
	old.Stop()
	d.Servers[1].Resume()
	primary, err := d.WaitFailover(old, testload.Scale(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.RestartAsReplica(old, primary, testload.Scale(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	return primary
}

// until calls f every 20 ms until it returns an error that is not
// ErrUnavailable (or nil), or timeout passes.
func until(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if !errors.Is(err, store.ErrUnavailable) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkAck measures what waiting for the replica costs a reservation:
// the same primary (with its replica) through Sentinel, each reservation
// followed by WAIT 1 in its round trip ("wait"), and straight on its URL
// without ("nowait"), alternating for six rounds. Compare each wait row
// with the nowait row before it (p50-ns/op: the median reservation).
func BenchmarkAck(b *testing.B) {
	d := redistest.StartSentinel(b, redistest.SentinelOptions{})
	nowait, err := Open("redis://"+d.Servers[0].Addr(), Options{Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer nowait.Close()
	wait, err := OpenSentinel(Sentinel{Master: redistest.MasterName, Addrs: d.SentinelAddrs()}, Options{Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer wait.Close()
	c := []policy.Counter{{Key: "bench|grant=alice", Name: "bench", Window: time.Millisecond, Max: 1 << 30}}
	var n int64
	for round := range 6 {
		for _, st := range []struct {
			name string
			s    *Store
		}{{"nowait", nowait}, {"wait", wait}} {
			b.Run(fmt.Sprintf("round=%d/%s", round, st.name), func(b *testing.B) {
				ctx := context.Background()
				var took []time.Duration
				for b.Loop() {
					n++
					start := time.Now()
					if err := st.s.ReserveAll(ctx, strconv.FormatInt(n, 10), storetest.T0().Add(time.Duration(n)*time.Microsecond), c); err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
				}
				// The median resists the stalls of a busy machine that
				// dominate the mean.
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns/op")
			})
		}
	}
}
