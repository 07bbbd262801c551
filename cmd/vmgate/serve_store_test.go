package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// The counters of `store: bolt` live in memory and are rebuilt at start from
// the audit log: reservations inside their window come back, refunded ones
// and ones that left their window do not, and approvals persist in bbolt.
func TestOpenStoreRebuildsCountersFromTheAuditLog(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "audit.log")
	l, err := audit.Open(logPath, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	const key = "all_calls|grant=local"
	decision := func(id string, at time.Time, window time.Duration) {
		rec := audit.Record{Time: at, Kind: audit.KindDecision, CallID: id, Decision: "allow",
			Counters: audit.Counters{{Key: key, Window: window, Max: 3}}}
		if _, err := l.Append(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	outcome := func(id string, refunded bool) {
		if err := l.AppendLazy(context.Background(), audit.Record{Kind: audit.KindOutcome, CallID: id, Outcome: "ok", Refunded: refunded}); err != nil {
			t.Fatal(err)
		}
	}
	decision("live1", now.Add(-10*time.Second), time.Minute)
	outcome("live1", false)
	decision("refunded", now.Add(-5*time.Second), time.Minute)
	outcome("refunded", true)
	decision("old", now.Add(-2*time.Minute), time.Minute) // left its window
	decision("live2", now.Add(-time.Second), time.Minute) // no outcome: a crash lost it
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	cfg := &config.Config{}
	cfg.Store.Type = config.StoreBolt
	cfg.Store.Path = filepath.Join(dir, "store.db")
	st, err := openStore(context.Background(), cfg, logPath)
	if err != nil {
		t.Fatalf("openStore = %v", err)
	}
	if _, ok := st.(*memory.Split); !ok {
		t.Fatalf("openStore(bolt) = %T; want *memory.Split (counters in memory, approvals in bbolt)", st)
	}
	c := []policy.Counter{{Key: key, Window: time.Minute, Max: 3}}
	granted := 0
	for i := range 3 {
		err := st.ReserveAll(context.Background(), fmt.Sprint("new", i), now, c)
		var le *store.LimitedError
		if errors.As(err, &le) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		granted++
	}
	// live1 and live2 are restored: one of the three units is left.
	if granted != 1 {
		t.Fatalf("ReserveAll after the rebuild granted %d of max 3; want 1 (live1 and live2 restored)", granted)
	}
	a := store.Approval{ID: "ap1", Grant: "local", Tool: "vm_power", Digest: "d", State: store.ApprovalPending,
		Created: now, Expires: now.Add(time.Hour), TTL: time.Hour}
	if err := st.CreateApproval(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st, err = openStore(context.Background(), cfg, logPath)
	if err != nil {
		t.Fatalf("openStore again = %v", err)
	}
	defer st.Close()
	if got, err := st.GetApproval(context.Background(), "ap1"); err != nil || got.State != store.ApprovalPending {
		t.Fatalf("GetApproval(ap1) after reopening = %+v, %v; want the pending approval (approvals persist)", got, err)
	}
}

// TestSetGCPercent: serve raises the collector's target unless GOGC says
// otherwise.
func TestSetGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	tests := []struct {
		gogc string
		want int
	}{
		{"", serveGCPercent},
		{"50", 100}, // the runtime applied GOGC=50 itself; here it stays as found (100)
		{"off", 100},
	}
	for _, tt := range tests {
		debug.SetGCPercent(100)
		setGCPercent(tt.gogc)
		if got := debug.SetGCPercent(100); got != tt.want {
			t.Errorf("setGCPercent(%q) left GC percent %d; want %d", tt.gogc, got, tt.want)
		}
	}
}

// openStore with a Sentinel store reads its password file first: one that
// others may read stops the start with the reason, before any connection.
func TestOpenStoreSentinelPasswordFile(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "redis.pass")
	if err := os.WriteFile(pw, []byte("pw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(pw, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{}
	cfg.Store.Type = config.StoreRedis
	cfg.Store.Sentinel = &config.Sentinel{Master: "m", Addrs: []string{"127.0.0.1:1"}, PasswordFile: pw}
	st, err := openStore(context.Background(), cfg, filepath.Join(dir, "audit.log"))
	if err == nil {
		st.Close()
		t.Fatal("openStore with a world-readable password file = nil; want an error")
	}
	if msg := err.Error(); !strings.Contains(msg, "store.sentinel.password_file") || !strings.Contains(msg, "chmod 600") {
		t.Errorf("openStore error %q does not name the file's problem", msg)
	}
	if err := os.Chmod(pw, 0o600); err != nil {
		t.Fatal(err)
	}
	st, err = openStore(context.Background(), cfg, filepath.Join(dir, "audit.log"))
	if err != nil {
		t.Fatalf("openStore with a 0600 password file = %v; want a store (it connects lazily)", err)
	}
	st.Close()
}
