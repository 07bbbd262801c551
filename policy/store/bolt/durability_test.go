package bolt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatalf("Open(%s) = %v; want nil", path, err)
	}
	return s
}

func TestReopenKeepsCounters(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	c := policy.Counter{Key: "k|grant=a", Name: "k", Window: time.Minute, Max: 3}
	s := open(t, path)
	for i := range 3 {
		if err := s.ReserveAll(ctx, fmt.Sprint("id", i), t0, []policy.Counter{c}); err != nil {
			t.Fatalf("ReserveAll #%d = %v", i, err)
		}
	}
	a := store.Approval{ID: "ap", Grant: "a", Tool: "t", Digest: "d", Created: t0, Expires: t0.Add(time.Hour), TTL: time.Minute}
	if err := s.CreateApproval(ctx, a); err != nil {
		t.Fatalf("CreateApproval = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	s = open(t, path)
	defer s.Close()
	var le *store.LimitedError
	if err := s.ReserveAll(ctx, "id3", t0.Add(time.Second), []policy.Counter{c}); !errors.As(err, &le) || le.RetryAfter != 59*time.Second {
		t.Errorf("ReserveAll after reopen = %v; want *LimitedError retry 59s", err)
	}
	if got, err := s.GetApproval(ctx, "ap"); err != nil || got.State != store.ApprovalPending {
		t.Errorf("GetApproval after reopen = %+v, %v; want pending", got, err)
	}
}

func TestSecondOpenFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	defer s.Close()
	_, err := Open(path, Options{LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("second Open of a locked file = %v; want ErrUnavailable", err)
	}
}

func TestClosedIsUnavailable(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.db"))
	if err := s.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	c := policy.Counter{Key: "k", Window: time.Minute, Max: 1}
	if err := s.ReserveAll(context.Background(), "id", t0, []policy.Counter{c}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ReserveAll on a closed store = %v; want ErrUnavailable", err)
	}
	if _, err := s.ListApprovals(context.Background(), t0); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ListApprovals on a closed store = %v; want ErrUnavailable", err)
	}
}

func TestRestore(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "state.db"))
	defer s.Close()
	c := policy.Counter{Key: "r", Window: time.Minute, Max: 2}
	// Three restored reservations exceed Max: the calls happened, they count.
	for i := range 3 {
		for range 2 { // idempotent by id
			if err := s.Restore(ctx, fmt.Sprint("past", i), t0.Add(time.Duration(i)*time.Second), []policy.Counter{c}); err != nil {
				t.Fatalf("Restore(past%d) = %v; want nil", i, err)
			}
		}
	}
	got, err := s.Reservations(ctx, c.Key)
	if err != nil || len(got) != 3 {
		t.Fatalf("Reservations = %v, %v; want 3", got, err)
	}
	for i, r := range got {
		if r.ID != fmt.Sprint("past", i) || !r.At.Equal(t0.Add(time.Duration(i)*time.Second)) {
			t.Errorf("Reservations[%d] = %+v; want past%d at +%ds", i, r, i, i)
		}
	}
	// 3 live, max 2: a unit frees up when the second oldest (1 s) leaves, at 61 s.
	var le *store.LimitedError
	if err := s.ReserveAll(ctx, "new", t0.Add(30*time.Second), []policy.Counter{c}); !errors.As(err, &le) || le.RetryAfter != 31*time.Second {
		t.Errorf("ReserveAll over restored = %v; want *LimitedError retry 31s", err)
	}
	if err := s.Restore(ctx, "", t0, []policy.Counter{c}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Restore(empty id) = %v; want ErrInvalid", err)
	}
}

const childEnv = "VMGATE_BOLT_CRASH_CHILD_DIR"

var crashCounters = []policy.Counter{
	{Key: "crash|grant=a", Name: "crash", Window: time.Hour, Max: 1 << 40},
	{Key: "crash|vm=lab/vm1", Name: "crash_vm", Window: time.Hour, Max: 1 << 40},
}

// crashChild is the body of TestKillDuringReservations' child process (run
// from TestMain when childEnv is set): it reserves, appends the decision
// record, then prints the id, until killed. It returns only on an error.
func crashChild(dir string) error {
	s, err := Open(filepath.Join(dir, "state.db"), Options{NoSync: true})
	if err != nil {
		return err
	}
	log, err := audit.Open(filepath.Join(dir, "audit.log"), audit.Options{})
	if err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		id := fmt.Sprintf("call-%d", i)
		now := time.Now()
		if err := s.ReserveAll(context.Background(), id, now, crashCounters); err != nil {
			return err
		}
		rec := audit.Record{Time: now, Kind: audit.KindDecision, CallID: id, Grant: "a", Tool: "kill_process",
			VM: "lab/vm1", Decision: "allow", Rule: "/tools/kill_process", Counters: crashCounters}
		if _, err := log.Append(context.Background(), rec); err != nil {
			return err
		}
		fmt.Fprintln(out, id)
		out.Flush()
	}
}

// TestKillDuringReservations: a child reserving in a loop is SIGKILLed;
// every reservation it reported survives, and the audit log verifies (a
// torn last line allowed) and rebuilds the same counters through Restore.
func TestKillDuringReservations(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	const want = 300
	var reported []string
	sc := bufio.NewScanner(stdout)
	for len(reported) < want && sc.Scan() {
		reported = append(reported, sc.Text())
	}
	if len(reported) < want {
		t.Fatalf("child reported %d reservations before exiting (%v); want %d", len(reported), sc.Err(), want)
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill child %d: %v", cmd.Process.Pid, err)
	}
	for sc.Scan() { // what it reported after our count and before dying
		reported = append(reported, sc.Text())
	}
	err = cmd.Wait()
	waited = true
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child Wait = %v; want killed by SIGKILL", err)
	}

	ctx := context.Background()
	s := open(t, filepath.Join(dir, "state.db"))
	defer s.Close()
	for _, c := range crashCounters {
		missing := missingIDs(t, s, c.Key, reported)
		if len(missing) > 0 {
			t.Errorf("counter %q lost %d of %d reported reservations, first %q", c.Key, len(missing), len(reported), missing[0])
		}
	}

	// The audit log verifies (a torn last line at most) ...
	key, err := audit.LoadKey(audit.DefaultKeyFile(filepath.Join(dir, "audit.log")))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := audit.Verify(f, key)
	if err != nil || !rep.OK() {
		t.Fatalf("audit.Verify = %+v, %v; want OK", rep, err)
	}
	for _, tl := range rep.Torn {
		if !tl.Last {
			t.Errorf("audit.Verify: torn line %d is not the last", tl.Line)
		}
	}
	if rep.Records < len(reported) {
		t.Errorf("audit log holds %d records; the child reported %d appended", rep.Records, len(reported))
	}
	// ... and rebuilds every reported reservation into an empty store (what
	// the server does after a power loss took the tail of the NoSync file).
	fresh := open(t, filepath.Join(t.TempDir(), "rebuilt.db"))
	defer fresh.Close()
	restored := 0
	err = audit.Read(filepath.Join(dir, "audit.log"), func(r audit.Record) error {
		if r.Kind != audit.KindDecision {
			return nil
		}
		restored++
		return fresh.Restore(ctx, r.CallID, r.Time, r.Counters)
	})
	if err != nil {
		t.Fatalf("audit.Read + Restore = %v", err)
	}
	for _, c := range crashCounters {
		if missing := missingIDs(t, fresh, c.Key, reported); len(missing) > 0 {
			t.Errorf("rebuilt counter %q lacks %d reported reservations, first %q", c.Key, len(missing), missing[0])
		}
	}
	t.Logf("child reported %d reservations; the log held %d decision records, torn %v", len(reported), restored, rep.Torn)
}

func missingIDs(t *testing.T, s *Store, key string, ids []string) []string {
	t.Helper()
	rs, err := s.Reservations(context.Background(), key)
	if err != nil {
		t.Fatalf("Reservations(%q) = %v", key, err)
	}
	have := make(map[string]bool, len(rs))
	for _, r := range rs {
		have[r.ID] = true
	}
	var missing []string
	for _, id := range ids {
		if !have[id] {
			missing = append(missing, id)
		}
	}
	if len(have) < len(ids) {
		t.Errorf("Reservations(%q) = %d; want at least %d", key, len(have), len(ids))
	}
	return missing
}
