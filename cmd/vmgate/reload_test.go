package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/policy"
)

const (
	allowDoc = `{"version":"1","default":"allow"}`
	denyDoc  = `{"version":"1","default":"deny"}`
)

// swaps records the SetPolicy calls a reloader makes.
type swaps struct {
	mu  sync.Mutex
	got map[string]*policy.Engine
	n   int
}

func (s *swaps) set(grant string, eng *policy.Engine) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.got == nil {
		s.got = map[string]*policy.Engine{}
	}
	s.got[grant] = eng
	s.n++
	return nil
}

func (s *swaps) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func writePolicy(t *testing.T, path, doc string, mod time.Time) {
	t.Helper()
	// Written aside and renamed into place, so a poll never sees the file
	// between the write and the Chtimes (with the write's own mtime).
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	// A distinct mtime per write, so the change is seen even within one clock tick.
	if err := os.Chtimes(tmp, mod, mod); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestPolicyReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "alice.json")
	base := time.Now().Add(-time.Hour)
	writePolicy(t, path, allowDoc, base)
	grants := []config.Grant{{Name: "alice", Policy: path}, {Name: "local", Policy: config.BuiltinPolicy}}
	engines, err := loadPolicies(grants)
	if err != nil {
		t.Fatalf("loadPolicies() = %v", err)
	}
	var sw swaps
	r := newPolicyReloader(grants, engines, sw.set, slog.New(slog.DiscardHandler))

	if n, err := r.reload("test"); n != 0 || err != nil || sw.count() != 0 {
		t.Errorf("reload(unchanged) = %d, %v (set called %d times); want 0, nil, none", n, err, sw.count())
	}
	if r.changed() {
		t.Errorf("changed() with no write = true; want false")
	}

	writePolicy(t, path, denyDoc, base.Add(time.Second))
	if !r.changed() {
		t.Fatalf("changed() after a write = false; want true")
	}
	if n, err := r.reload("test"); n != 1 || err != nil {
		t.Fatalf("reload(changed) = %d, %v; want 1, nil", n, err)
	}
	if d := sw.got["alice"].Decide(policy.Call{Grant: "alice", Tool: "list_vms"}); d.Verdict != policy.Deny {
		t.Errorf("alice's policy after reload decides %v; want deny", d.Verdict)
	}

	// A document that does not parse keeps every old policy.
	for i, bad := range []string{`{"version":"2","default":"deny"}`, `{"version":"1"`, `{"version":"1","default":"deny","Tools":{}}`} {
		writePolicy(t, path, bad, base.Add(time.Duration(2+i)*time.Second))
		before := sw.count()
		if n, err := r.reload("test"); n != 0 || err == nil || sw.count() != before {
			t.Errorf("reload(%s) = %d, %v (set called %d more times); want 0, an error, none", bad, n, err, sw.count()-before)
		}
	}
	// A missing file is a failed reload too, not an empty policy.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if n, err := r.reload("test"); n != 0 || err == nil {
		t.Errorf("reload(missing file) = %d, %v; want 0, an error", n, err)
	}
}

// TestPolicyReloadRun: run's loop reloads on SIGHUP and on a file change it
// polls for, driven by ticks the test sends, so it knows when a poll is done.
func TestPolicyReloadRun(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.json")
	base := time.Now().Add(-time.Hour)
	writePolicy(t, path, allowDoc, base)
	grants := []config.Grant{{Name: "g", Policy: path}}
	engines, err := loadPolicies(grants)
	if err != nil {
		t.Fatal(err)
	}
	var sw swaps
	r := newPolicyReloader(grants, engines, sw.set, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	ticks := make(chan time.Time) // unbuffered: a send returns once loop took it
	go r.loop(ctx, hup, ticks)
	// polled returns once loop has finished a poll that began after the
	// call: loop takes the second tick only after handling the first.
	polled := func() {
		ticks <- time.Now()
		ticks <- time.Now()
	}

	waitFor := func(want int) {
		t.Helper()
		for range 500 {
			if sw.count() >= want {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("SetPolicy calls = %d; want %d", sw.count(), want)
	}
	polled()
	if n := sw.count(); n != 0 {
		t.Fatalf("SetPolicy calls after a poll of an unchanged file = %d; want 0", n)
	}
	writePolicy(t, path, denyDoc, base.Add(time.Second))
	polled()
	if n := sw.count(); n != 1 {
		t.Fatalf("SetPolicy calls after a poll of a changed file = %d; want 1", n)
	}

	// A different document of the same size and mtime: the poll cannot see
	// it, only SIGHUP reloads it.
	same := `{"default":"deny","version":"1"}`
	if len(same) != len(denyDoc) {
		t.Fatalf("test documents differ in size: %d, %d", len(same), len(denyDoc))
	}
	writePolicy(t, path, same, base.Add(time.Second))
	polled()
	if n := sw.count(); n != 1 {
		t.Fatalf("SetPolicy calls after an unseen change = %d; want still 1", n)
	}
	hup <- syscall.SIGHUP
	waitFor(2)
}

// TestPolicyReloadWarnsUnknownTool: a reloaded document that names a tool
// the server does not have is put in force, and the log says where the
// name is and which tool was likely meant.
func TestPolicyReloadWarnsUnknownTool(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "alice.json")
	base := time.Now().Add(-time.Hour)
	writePolicy(t, path, allowDoc, base)
	grants := []config.Grant{{Name: "alice", Policy: path}}
	engines, err := loadPolicies(grants)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var sw swaps
	r := newPolicyReloader(grants, engines, sw.set, slog.New(slog.NewTextHandler(&logs, nil)))
	writePolicy(t, path, `{"version":"1","default":"deny","tools":{"kill_proces":{}}}`, base.Add(time.Second))
	if n, err := r.reload("test"); n != 1 || err != nil {
		t.Fatalf("reload() = %d, %v; want 1, nil", n, err)
	}
	for _, want := range []string{"level=WARN", "grant=alice", `unknown tool \"kill_proces\"`, `did you mean \"kill_process\"`, path + ":1:42: tools.kill_proces"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log after reload = %s; want it to contain %s", logs.String(), want)
		}
	}
}

// TestServeWarnsWithoutBackends: a config without backends says so in the
// log at serve start (it would serve zero VMs without a word).
func TestServeWarnsWithoutBackends(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vmgate.yaml")
	for _, c := range []struct {
		yaml string
		warn bool
	}{
		{"state_dir: " + dir + "\ngrants:\n  - name: local\n    policy: \"builtin:default\"\n", true},
		{"state_dir: " + dir + "\ngrants:\n  - name: local\n    policy: \"builtin:default\"\nbackends:\n  - name: lab\n    driver: qemu\n    settings:\n      vms:\n        - {name: vm1, qmp: /run/q.sock, qga: /run/g.sock}\n", false},
	} {
		if err := os.WriteFile(path, []byte(c.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig(path)
		if err != nil {
			t.Fatalf("loadConfig(%q): %v", c.yaml, err)
		}
		var logs bytes.Buffer
		warnNoBackends(slog.New(slog.NewTextHandler(&logs, nil)), cfg, path)
		got := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "no backends") && strings.Contains(logs.String(), path)
		if got != c.warn {
			t.Errorf("warnNoBackends(%q) logged %q; want a warning naming the config: %v", c.yaml, logs.String(), c.warn)
		}
	}
}
