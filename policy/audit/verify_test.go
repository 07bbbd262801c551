package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeLog appends n records (decision and outcome alternately) to a new log
// in a temporary directory and returns the file's path and key.
func writeLog(t *testing.T, n int) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open(%q) = %v", path, err)
	}
	ctx := context.Background()
	for i := 1; i <= n; i++ {
		seq, err := l.Append(ctx, testRecord(i))
		if err != nil {
			t.Fatalf("Append(#%d) = %v", i, err)
		}
		if seq != uint64(i) {
			t.Fatalf("Append(#%d) seq = %d; want %d", i, seq, i)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	key, err := LoadKey(DefaultKeyFile(path))
	if err != nil {
		t.Fatalf("LoadKey = %v", err)
	}
	return path, key
}

func testRecord(i int) Record {
	r := Record{
		Time:      time.Date(2026, 7, 1, 12, 0, 0, i, time.UTC),
		CallID:    fmt.Sprintf("call-%d", (i+1)/2),
		Grant:     "alice",
		Transport: "stdio",
		Tool:      "vm_agent_exec",
		VM:        "lab/vm1",
		Args:      map[string]any{"vm": "lab/vm1", "command": []any{"echo", fmt.Sprint(i)}},
	}
	if i%2 == 1 {
		r.Kind, r.Decision, r.Rule = KindDecision, "allow", "/tools/vm_agent_exec"
		r.Counters = Counters{{Key: "exec_per_vm|grant=alice|vm=lab/vm1", Window: time.Minute, Max: 30}}
	} else {
		r.Kind, r.Outcome, r.DurationMS = KindOutcome, "ok", 1.5
	}
	return r
}

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	return lines
}

func TestVerifyRoundTrip(t *testing.T) {
	path, key := writeLog(t, 10)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := Verify(f, key)
	if err != nil {
		t.Fatalf("Verify = %v; want nil", err)
	}
	if !rep.OK() || rep.Records != 10 || rep.LastSeq != 10 || len(rep.Torn) != 0 {
		t.Fatalf("Verify = %+v; want 10 good records, no torn lines", rep)
	}
	var got []Record
	if err := Read(path, func(r Record) error { got = append(got, r); return nil }); err != nil {
		t.Fatalf("Read = %v", err)
	}
	if len(got) != 10 {
		t.Fatalf("Read gave %d records; want 10", len(got))
	}
	for i, r := range got {
		want := testRecord(i + 1)
		if r.Seq != uint64(i+1) || r.Kind != want.Kind || r.CallID != want.CallID || !r.Time.Equal(want.Time) || r.Hash == "" {
			t.Errorf("record %d = %+v; want seq %d kind %s call %s time %v", i, r, i+1, want.Kind, want.CallID, want.Time)
		}
		if i > 0 && r.PrevHash != got[i-1].Hash {
			t.Errorf("record %d prev_hash = %q; want %q", i, r.PrevHash, got[i-1].Hash)
		}
	}
	if got[0].PrevHash != "" {
		t.Errorf("first prev_hash = %q; want empty", got[0].PrevHash)
	}
	if len(got[0].Counters) != 1 || got[0].Counters[0].Window != time.Minute {
		t.Errorf("decision counters = %+v; want the reservation", got[0].Counters)
	}
	// The time is RFC 3339 with nanoseconds in UTC.
	if line := readLines(t, path)[0]; !bytes.Contains(line, []byte(`"time":"2026-07-01T12:00:00.000000001Z"`)) {
		t.Errorf("line 1 = %s; want an RFC3339Nano UTC time", line)
	}
}

func TestVerifyTamper(t *testing.T) {
	const n = 8
	type edit func(lines [][]byte) [][]byte
	tests := []struct {
		name     string
		edit     edit
		wantKind ProblemKind
		wantLine int
		wantSeq  uint64
		wantWant uint64
	}{
		{"change a byte in a field", func(l [][]byte) [][]byte {
			l[4] = bytes.Replace(l[4], []byte(`"grant":"alice"`), []byte(`"grant":"alicf"`), 1)
			return l
		}, ProblemAltered, 5, 5, 5},
		{"change a byte of the hash", func(l [][]byte) [][]byte {
			i := len(l[2]) - 4
			l[2] = bytes.Clone(l[2])
			if l[2][i] == '0' {
				l[2][i] = '1'
			} else {
				l[2][i] = '0'
			}
			return l
		}, ProblemAltered, 3, 3, 3},
		{"change the seq", func(l [][]byte) [][]byte {
			l[3] = bytes.Replace(l[3], []byte(`{"seq":4,`), []byte(`{"seq":40,`), 1)
			return l
		}, ProblemAltered, 4, 40, 4},
		{"delete a record", func(l [][]byte) [][]byte {
			return append(l[:3], l[4:]...)
		}, ProblemRemoved, 4, 5, 4},
		{"delete the first record", func(l [][]byte) [][]byte {
			return l[1:]
		}, ProblemRemoved, 1, 2, 1},
		{"swap two records", func(l [][]byte) [][]byte {
			l[5], l[6] = l[6], l[5]
			return l
		}, ProblemReordered, 6, 7, 6},
		{"insert a forged record", func(l [][]byte) [][]byte {
			forged := []byte(`{"seq":3,"prev_hash":"` + hashOf(t, l[1]) + `","time":"2026-07-01T12:00:00Z","kind":"decision","call_id":"x","decision":"allow","hash":"` + strings.Repeat("ab", 32) + "\"}\n")
			return append(l[:2], append([][]byte{forged}, l[2:]...)...)
		}, ProblemInserted, 3, 3, 3},
		{"duplicate a record", func(l [][]byte) [][]byte {
			return append(l[:4], append([][]byte{l[3]}, l[4:]...)...)
		}, ProblemReordered, 5, 4, 5},
		{"garbage line in the middle", func(l [][]byte) [][]byte {
			l[2] = []byte("{\"seq\":3,\"bogus\n")
			return l
		}, ProblemMalformed, 3, 0, 3},
	}
	path, key := writeLog(t, n)
	orig := readLines(t, path)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lines := make([][]byte, len(orig))
			copy(lines, orig)
			data := bytes.Join(tt.edit(lines), nil)
			rep, err := Verify(bytes.NewReader(data), key)
			var ce *ChainError
			if !errors.As(err, &ce) || !errors.Is(err, ErrTampered) {
				t.Fatalf("Verify = %v; want a *ChainError wrapping ErrTampered", err)
			}
			p := rep.Bad
			if p == nil || p.Kind != tt.wantKind || p.Line != tt.wantLine || p.Seq != tt.wantSeq || p.Want != tt.wantWant {
				t.Fatalf("Verify bad = %+v; want %s at line %d seq %d (want seq %d)", p, tt.wantKind, tt.wantLine, tt.wantSeq, tt.wantWant)
			}
			if rep.Records != tt.wantLine-1 {
				t.Errorf("Verify records = %d; want %d good before the bad one", rep.Records, tt.wantLine-1)
			}
		})
	}
}

func hashOf(t *testing.T, line []byte) string {
	t.Helper()
	s := strings.TrimSpace(string(line))
	i := strings.LastIndex(s, `"hash":"`)
	if i < 0 {
		t.Fatalf("no hash in %s", s)
	}
	return s[i+len(`"hash":"`) : len(s)-2]
}

func TestVerifyTruncatedTail(t *testing.T) {
	path, key := writeLog(t, 6)
	data, _ := os.ReadFile(path)
	lines := readLines(t, path)
	for _, cut := range []int{1, 10, len(lines[5]) - 2} {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			// Keep 5 lines and the first cut bytes of the 6th.
			keep := len(data) - len(lines[5]) + cut
			rep, err := Verify(bytes.NewReader(data[:keep]), key)
			if err != nil {
				t.Fatalf("Verify(cut at %d) = %v; want a report of a torn tail, no error", keep, err)
			}
			if !rep.TornTail() || rep.Records != 5 || len(rep.Torn) != 1 || rep.Torn[0].Line != 6 || rep.Torn[0].Seq != 6 {
				t.Fatalf("Verify(cut at %d) = %+v; want 5 records and a torn last line 6 (seq 6)", keep, rep)
			}
		})
	}
	// Only the newline lost: the record is complete and counts.
	rep, err := Verify(bytes.NewReader(data[:len(data)-1]), key)
	if err != nil || rep.Records != 6 || len(rep.Torn) != 0 {
		t.Fatalf("Verify(without the last newline) = %+v, %v; want 6 good records", rep, err)
	}
	// Removing whole lines only at the end is not detectable by a chain.
	rep, err = Verify(bytes.NewReader(data[:len(data)-len(lines[5])]), key)
	if err != nil || rep.Records != 5 || len(rep.Torn) != 0 {
		t.Fatalf("Verify(5 whole lines) = %+v, %v; want 5 good records", rep, err)
	}
}

func TestVerifyWrongKey(t *testing.T) {
	path, key := writeLog(t, 4)
	other := bytes.Clone(key)
	other[0] ^= 0xff
	data, _ := os.ReadFile(path)
	rep, err := Verify(bytes.NewReader(data), other)
	if !errors.Is(err, ErrTampered) || rep.Bad == nil || rep.Bad.Line != 1 || rep.Bad.Kind != ProblemAltered {
		t.Fatalf("Verify(wrong key) = %+v, %v; want altered at line 1", rep.Bad, err)
	}
	if _, err := Verify(bytes.NewReader(data), key[:16]); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("Verify(16-byte key) = %v; want ErrKeyFile", err)
	}
}

func TestVerifyHostileLines(t *testing.T) {
	path, key := writeLog(t, 2)
	good, _ := os.ReadFile(path)
	tests := []struct {
		name string
		tail string
	}{
		{"a JSON array", "[1,2,3]\n"},
		{"uppercase hash", `{"seq":3,"prev_hash":"","hash":"` + strings.Repeat("AB", 32) + "\"}\n"},
		{"seq zero", `{"seq":0,"prev_hash":"","kind":"decision","hash":"` + strings.Repeat("ab", 32) + "\"}\n"},
		{"two hash fields", `{"seq":3,"hash":"x","prev_hash":"","hash":"` + strings.Repeat("ab", 32) + "\"}\n"},
		{"empty line", "\n"},
		{"NUL bytes", "\x00\x00\x00\x00\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// As a middle line (a good record follows that does not continue
			// from before it: seq 3 is taken by the hostile line position).
			data := append(bytes.Clone(good), tt.tail...)
			data = append(data, readLines(t, path)[0]...)
			rep, err := Verify(bytes.NewReader(data), key)
			if !errors.Is(err, ErrTampered) || rep.Bad == nil || rep.Bad.Line != 3 {
				t.Fatalf("Verify(%q in the middle) = %+v, %v; want a bad line 3", tt.tail, rep.Bad, err)
			}
		})
	}
}

// FuzzVerify: hostile bytes never panic Verify, and whatever it accepts as
// records verifies again from the same bytes (the answer is deterministic).
func FuzzVerify(f *testing.F) {
	key := bytes.Repeat([]byte{7}, KeySize)
	f.Add([]byte(`{"seq":1,"prev_hash":"","hash":"` + strings.Repeat("ab", 32) + "\"}\n"))
	f.Add([]byte("\x00\n{\n}\n"))
	f.Add([]byte(`{"seq":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rep, err := Verify(bytes.NewReader(data), key)
		again, err2 := Verify(bytes.NewReader(data), key)
		if (err == nil) != (err2 == nil) || rep.Records != again.Records || rep.Lines != again.Lines {
			t.Fatalf("Verify not deterministic: %+v, %v then %+v, %v", rep, err, again, err2)
		}
		if rep.Records > rep.Lines || (err == nil) != rep.OK() {
			t.Fatalf("Verify = %+v, %v; inconsistent report", rep, err)
		}
	})
}
