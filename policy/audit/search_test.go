package audit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"
)

// searchLog writes a log of a few calls of two grants and returns its path
// and the base time.
func searchLog(t *testing.T) (string, time.Time) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path, Options{Fsync: FsyncInterval})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	recs := []Record{
		{Time: base, Kind: KindDecision, CallID: "c1", Grant: "alice", Tool: "vm_agent_exec", VM: "lab/vm1", Decision: "allow",
			Args: map[string]any{"vm": "lab/vm1", "command": []any{"uname", "-a"}, "stdin": "top secret <words>"}},
		{Time: base.Add(time.Second), Kind: KindOutcome, CallID: "c1", Grant: "alice", Tool: "vm_agent_exec", VM: "lab/vm1", Outcome: "ok"},
		{Time: base.Add(2 * time.Second), Kind: KindDecision, CallID: "c2", Grant: "bob", Tool: "kill_process", VM: "lab/vm2", Decision: "deny",
			Args: map[string]any{"vm": "lab/vm2", "pid": 1, "signal": "HUP"}},
		{Time: base.Add(3*time.Second + 500*time.Millisecond), Kind: KindDecision, CallID: "c3", Grant: "alice", Tool: "vm_file_read", VM: "lab/vm1",
			Decision: "allow", Args: map[string]any{"vm": "lab/vm1", "path": "/etc/a<b>&c", "session": "s-1"}},
		{Time: base.Add(4 * time.Second), Kind: KindOutcome, CallID: "c3", Grant: "alice", Tool: "vm_file_read", VM: "lab/vm1", Outcome: "error",
			Reason: "not found"},
		{Time: base.Add(5 * time.Second), Kind: KindDecision, CallID: "c4", Grant: "alice", Tool: "vm_agent_exec", VM: "lab/vm1", Decision: "allow",
			Args: map[string]any{"vm": "lab/vm1", "shell": "echo kill_process", "session": "s-2", "env": map[string]any{"A": "uname"}}},
		{Time: base.Add(6 * time.Second), Kind: KindDecision, CallID: "approval-AP1", Grant: "alice", Transport: "operator", Tool: "destroy_session",
			Decision: "approval_granted", ApprovalID: "AP1"},
	}
	for _, r := range recs {
		if _, err := l.Append(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path, base
}

// search returns "callid/kind" of every match of f in the log at path. It
// searches twice, through the file (mapped, on Linux) and through a reader
// of its bytes (read(2)'s way), and fails t when the two differ.
func search(t *testing.T, path string, f Filter) ([]string, ScanStats) {
	t.Helper()
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var results [2][]string
	var stats [2]ScanStats
	for i, r := range []io.Reader{file, bytes.NewReader(data)} {
		st, err := Search(r, f, func(m *Match) error {
			if !bytes.HasPrefix(m.Line, []byte(`{"seq":`)) || bytes.HasSuffix(m.Line, []byte("\n")) {
				t.Errorf("Match.Line = %q; want the line without its newline", m.Line)
			}
			results[i] = append(results[i], m.Record.CallID+"/"+string(m.Record.Kind))
			return nil
		})
		if err != nil {
			t.Fatalf("Search(%+v) = %v", f, err)
		}
		stats[i] = st
	}
	if !slices.Equal(results[0], results[1]) || stats[0].Matched != stats[1].Matched || stats[0].Bytes != stats[1].Bytes || stats[0].Partial != stats[1].Partial {
		t.Errorf("Search(%+v) of the file = %v, %+v; of a reader = %v, %+v; want the same", f, results[0], stats[0], results[1], stats[1])
	}
	return results[0], stats[0]
}

func TestSearchFilters(t *testing.T) {
	path, base := searchLog(t)
	tests := []struct {
		name string
		f    Filter
		want []string
	}{
		{"everything", Filter{}, []string{"c1/decision", "c1/outcome", "c2/decision", "c3/decision", "c3/outcome", "c4/decision", "approval-AP1/decision"}},
		{"call id", Filter{CallID: "c3"}, []string{"c3/decision", "c3/outcome"}},
		{"call id is exact", Filter{CallID: "c"}, nil},
		{"grant", Filter{Grant: "bob"}, []string{"c2/decision"}},
		{"tool", Filter{Tool: "kill_process"}, []string{"c2/decision"}}, // not c4, whose shell holds the name
		{"vm", Filter{VM: "lab/vm2"}, []string{"c2/decision"}},
		{"decision", Filter{Decision: "deny"}, []string{"c2/decision"}},
		{"outcome", Filter{Outcome: "error"}, []string{"c3/outcome"}},
		{"kind", Filter{Kind: KindOutcome, Grant: "alice"}, []string{"c1/outcome", "c3/outcome"}},
		{"approval id", Filter{ApprovalID: "AP1"}, []string{"approval-AP1/decision"}},
		{"session", Filter{Session: "s-2"}, []string{"c4/decision"}},
		{"text in argv", Filter{Text: "uname"}, []string{"c1/decision"}}, // not c4's env value
		{"text escaped in the line", Filter{Text: "a<b>&c"}, []string{"c3/decision"}},
		{"text in a secret is not searched", Filter{Text: "top secret"}, nil},
		{"text of a digest is not searched", Filter{Text: "sha256:"}, nil},
		{"since", Filter{Since: base.Add(4 * time.Second)}, []string{"c3/outcome", "c4/decision", "approval-AP1/decision"}},
		{"until is exclusive", Filter{Until: base.Add(2 * time.Second)}, []string{"c1/decision", "c1/outcome"}},
		{"fraction against whole seconds", Filter{Since: base.Add(3 * time.Second), Until: base.Add(3*time.Second + 600*time.Millisecond)}, []string{"c3/decision"}},
		{"fraction past the bound", Filter{Since: base.Add(3*time.Second + 501*time.Millisecond), Until: base.Add(4 * time.Second)}, nil},
		{"all together", Filter{Grant: "alice", Tool: "vm_agent_exec", Decision: "allow", Session: "s-2", Since: base}, []string{"c4/decision"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, st := search(t, path, tt.f)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Search(%+v) = %v; want %v", tt.f, got, tt.want)
			}
			if st.Matched != len(tt.want) || st.Torn != 0 || st.Partial != 0 {
				t.Errorf("Search(%+v) stats = %+v; want %d matched, nothing torn or partial", tt.f, st, len(tt.want))
			}
		})
	}
}

// TestSearchLiveTail: a last line without its newline (being written) is
// never a match, a complete line that is no record is counted as torn,
// and a line longer than any record is skipped.
func TestSearchLiveTail(t *testing.T) {
	path, _ := searchLog(t)
	lines := readLines(t, path)
	var b []byte
	b = append(b, lines[0]...)
	b = append(b, []byte(`{"seq":2,"prev_hash":"x","time":"2026-07-01T12:00:01Z","kind":"outcome","call_id":"c1","grant":"alice"`+"\n")...)
	b = append(b, bytes.Repeat([]byte("x"), 3*searchBuf)...)
	b = append(b, '\n')
	b = append(b, lines[2]...)
	partial := lines[3][:len(lines[3])/2]
	b = append(b, partial...)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, st := search(t, path, Filter{Grant: "alice"})
	if want := []string{"c1/decision"}; !slices.Equal(got, want) {
		t.Errorf("Search(grant alice) = %v; want %v (the torn c1 outcome and the half-written c3 left out)", got, want)
	}
	if st.Torn != 1 || st.Partial != int64(len(partial)) || st.Bytes != int64(len(b)-len(partial)) {
		t.Errorf("stats = %+v; want 1 torn (the broken record of alice), %d partial bytes, %d bytes read", st, len(partial), len(b)-len(partial))
	}
	got, st = search(t, path, Filter{})
	if want := []string{"c1/decision", "c2/decision"}; !slices.Equal(got, want) || st.Torn != 2 {
		t.Errorf("Search(everything) = %v, %+v; want %v and 2 torn lines (the broken record, the long line)", got, st, want)
	}
}

func TestCompareTimeKey(t *testing.T) {
	tests := []struct {
		a, b string
		want int // sign
	}{
		{"2026-07-01T12:00:00Z", "2026-07-01T12:00:00Z", 0},
		{"2026-07-01T12:00:00Z", "2026-07-01T12:00:00.000000001Z", -1},
		{"2026-07-01T12:00:00.5Z", "2026-07-01T12:00:00.123Z", 1},
		{"2026-07-01T12:00:00.5Z", "2026-07-01T12:00:00.50Z", 0},
		{"2026-07-01T12:00:01Z", "2026-07-01T12:00:00.999999999Z", 1},
		{"2025-12-31T23:59:59.9Z", "2026-01-01T00:00:00Z", -1},
	}
	for _, tt := range tests {
		got := compareTimeKey([]byte(tt.a), []byte(tt.b))
		if sign(got) != tt.want {
			t.Errorf("compareTimeKey(%s, %s) = %d; want sign %d", tt.a, tt.b, got, tt.want)
		}
		if back := compareTimeKey([]byte(tt.b), []byte(tt.a)); sign(back) != -tt.want {
			t.Errorf("compareTimeKey(%s, %s) = %d; want sign %d", tt.b, tt.a, back, -tt.want)
		}
	}
}

func sign(x int) int {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}

// TestSearchShrinks: a log the server truncates under a search (a write
// it took back) ends the search with ErrShrank, not a crash.
func TestSearchShrinks(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("only the Linux search maps the log")
	}
	lines := recordLines(t, 4000, "s")
	path := filepath.Join(t.TempDir(), "audit.log")
	appendFile(t, path, lines...)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	_, err = Search(f, Filter{Grant: "alice"}, func(*Match) error {
		if n++; n == 1 {
			return os.Truncate(path, 0)
		}
		return nil
	})
	if !errors.Is(err, ErrShrank) || n != 1 {
		t.Errorf("Search while the log is truncated = %v after %d matches; want ErrShrank after 1", err, n)
	}
}
