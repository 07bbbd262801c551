package audit

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// benchSearchStart is the time of the first record of the benchmark's log;
// the records are 6 s apart (100,000 of them: about a week).
var benchSearchStart = time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)

// writeSearchLog writes n records of ten grants, tools and twenty VMs,
// with a few rare ones the benchmark looks for (every 25,000th record (from the 7th) is
// the grant "needle-grant", and so on).
func writeSearchLog(tb testing.TB, n int) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "audit.log")
	l, err := Open(path, Options{Fsync: FsyncInterval, Interval: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	tools := []string{"vm_agent_exec", "list_vms", "vm_status", "kill_process", "vm_file_read", "list_processes", "create_session", "destroy_session", "vm_agent_exec_status", "vm_metrics"}
	for i := range n {
		r := Record{Time: benchSearchStart.Add(time.Duration(i) * 6 * time.Second), Kind: KindDecision, CallID: fmt.Sprintf("CALL%016d", i),
			Grant: fmt.Sprintf("agent-%02d", i%10), Transport: "http", Tool: tools[i%len(tools)], VM: fmt.Sprintf("lab/vm%02d", i%20), Decision: "allow",
			Args: map[string]any{"vm": fmt.Sprintf("lab/vm%02d", i%20), "command": []any{"sh", "-c", fmt.Sprintf("make test-%d", i%97)}, "session": fmt.Sprintf("%032x", i%500)}}
		if i%2 == 1 {
			r.Kind, r.Decision, r.Outcome, r.DurationMS, r.Args = KindOutcome, "", "ok", 12.5, nil
		}
		if i%25000 == 6 {
			r.Grant, r.Tool, r.VM = "needle-grant", "snapshot_revert", "lab/needle"
			if r.Kind == KindDecision {
				r.Decision = "approval_denied"
				r.Args["session"], r.Args["command"] = "needle-session", []any{"needle-text"}
			}
		}
		if i%25000 == 9 {
			r.Outcome = "timed_out"
		}
		if _, err := l.AppendWritten(context.Background(), r); err != nil {
			tb.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		tb.Fatal(err)
	}
	return path
}

// BenchmarkSearch finds the rare records of a 100,000-record log by each
// filter, and counts the lines holding the same value with bytes.Index
// over the whole file read (what `grep -c` does): the two are comparable.
func BenchmarkSearch(b *testing.B) {
	path := writeSearchLog(b, 100_000)
	at := benchSearchStart.Add(50_000 * 6 * time.Second)
	for _, tt := range []struct {
		name   string
		f      Filter
		needle string
	}{
		{"call_id", Filter{CallID: "CALL0000000000050006"}, `"call_id":"CALL0000000000050006"`},
		{"grant", Filter{Grant: "needle-grant"}, `"grant":"needle-grant"`},
		{"tool", Filter{Tool: "snapshot_revert"}, `"tool":"snapshot_revert"`},
		{"vm", Filter{VM: "lab/needle"}, `"vm":"lab/needle"`},
		{"decision", Filter{Decision: "approval_denied"}, `"decision":"approval_denied"`},
		{"outcome", Filter{Outcome: "timed_out"}, `"outcome":"timed_out"`},
		{"session", Filter{Session: "needle-session"}, `"session":"needle-session"`},
		{"text", Filter{Text: "needle-text"}, `needle-text`},
		{"time", Filter{Since: at, Until: at.Add(10 * time.Second)}, `"time":"` + at.Format("2006-01-02T15:04:05")[:len("2006-01-02T15:04:0")]},
	} {
		b.Run("filter="+tt.name, func(b *testing.B) {
			for b.Loop() {
				f, err := os.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				st, err := Search(f, tt.f, func(*Match) error { return nil })
				f.Close()
				if err != nil || st.Matched == 0 {
					b.Fatalf("Search(%s) = %+v, %v; want a match", tt.name, st, err)
				}
			}
		})
		b.Run("grep-c="+tt.name, func(b *testing.B) {
			needle := []byte(tt.needle)
			for b.Loop() {
				data, err := os.ReadFile(path)
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for i := 0; ; n++ {
					j := bytes.Index(data[i:], needle)
					if j < 0 {
						break
					}
					i += j + len(needle)
				}
				if n == 0 {
					b.Fatalf("%s: no line holds %s", tt.name, needle)
				}
			}
		})
	}
}
