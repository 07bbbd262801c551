package audit

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"
)

// recordLines writes n records with a real Log and returns its lines, each
// with its newline; tag goes into every call id, so two runs differ.
func recordLines(t *testing.T, n int, tag string) [][]byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "src.log")
	l, err := Open(path, Options{Fsync: FsyncInterval})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		r := testRecord(i)
		r.CallID = fmt.Sprintf("%s-%d", tag, i)
		if i%3 == 0 {
			r.Grant = "bob"
		}
		if _, err := l.Append(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	return lines[:len(lines)-1]
}

// tailRun is a Tail running in a goroutine, its events as words.
type tailRun struct {
	events chan string
	done   chan error
	cancel context.CancelFunc
}

func startTail(t *testing.T, path string, o TailOptions) *tailRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &tailRun{events: make(chan string, 1<<16), done: make(chan error, 1), cancel: cancel}
	go func() {
		r.done <- Tail(ctx, path, o, func(ev *Event) error {
			r.events <- eventWords(ev)
			return nil
		})
		close(r.events)
	}()
	t.Cleanup(func() {
		cancel()
		for range r.events {
		}
	})
	return r
}

func eventWords(ev *Event) string {
	switch ev.Kind {
	case EventRecord:
		return fmt.Sprintf("record %d %s", ev.Record.Seq, ev.Record.CallID)
	case EventTorn:
		return "torn"
	case EventWithdrawn:
		return fmt.Sprintf("withdrawn %v shown %d", ev.Seqs, ev.Shown)
	case EventGap:
		return "gap " + ev.Detail
	case EventReplaced:
		return "replaced"
	}
	return "unknown event"
}

// next waits for the next event; a Tail that stops or goes quiet fails t
// (the deadline only keeps a broken Tail from hanging the test).
func (r *tailRun) next(t *testing.T) string {
	t.Helper()
	select {
	case ev, ok := <-r.events:
		if !ok {
			t.Fatalf("Tail returned %v before the next event", <-r.done)
		}
		return ev
	case <-time.After(time.Minute):
		t.Fatal("no event from Tail within a minute")
	}
	return ""
}

func (r *tailRun) expect(t *testing.T, want ...string) {
	t.Helper()
	for _, w := range want {
		if got := r.next(t); got != w {
			t.Fatalf("Tail event = %q; want %q", got, w)
		}
	}
}

func appendFile(t *testing.T, path string, b ...[]byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(bytes.Join(b, nil)); err != nil {
		t.Fatal(err)
	}
}

// TestTailConcurrentWriter: a writer appends N records in pieces of random
// size (a line's bytes arrive in several writes, a write ends anywhere);
// Tail -f reports every record exactly once, in order, and nothing else.
func TestTailConcurrentWriter(t *testing.T) {
	const n = 3000
	lines := recordLines(t, n, "w")
	all := bytes.Join(lines, nil)
	path := filepath.Join(t.TempDir(), "audit.log")
	appendFile(t, path)
	r := startTail(t, path, TailOptions{FromStart: true, Follow: true, Poll: time.Millisecond})

	wrote := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			wrote <- err
			return
		}
		defer f.Close()
		rng := rand.New(rand.NewPCG(1, 2))
		for rest := all; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(700))
			if _, err := f.Write(rest[:k]); err != nil {
				wrote <- err
				return
			}
			rest = rest[k:]
			if rng.IntN(4) == 0 {
				runtime.Gosched()
			}
		}
		wrote <- nil
	}()
	for i := 1; i <= n; i++ {
		if got, want := r.next(t), fmt.Sprintf("record %d w-%d", i, i); got != want {
			t.Fatalf("event %d = %q; want %q", i, got, want)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	// One more record: the reader is still following, and nothing came
	// between (no torn line, no repeat).
	extra := recordLines(t, n+1, "w")[n]
	appendFile(t, path, extra)
	r.expect(t, fmt.Sprintf("record %d w-%d", n+1, n+1))
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatalf("Tail = %v; want nil after cancel", err)
	}
	for ev := range r.events {
		t.Errorf("event after the last record: %s", ev)
	}
}

// TestTailWithdrawn: the server takes back a write that failed part way
// (truncates to the end of its last complete record, then appends records
// that reuse the seqs): Tail reports the records it had shown that are
// gone, then the new ones, and none twice.
func TestTailWithdrawn(t *testing.T) {
	first := recordLines(t, 5, "a")
	second := recordLines(t, 6, "b")
	path := filepath.Join(t.TempDir(), "audit.log")
	appendFile(t, path, first...)
	r := startTail(t, path, TailOptions{Last: 5, Follow: true, Poll: time.Millisecond})
	r.expect(t, "record 1 a-1", "record 2 a-2", "record 3 a-3", "record 4 a-4", "record 5 a-5")

	keep := int64(len(bytes.Join(first[:3], nil)))
	if err := os.Truncate(path, keep); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, second[3:]...)
	r.expect(t, "withdrawn [4 5] shown 2", "record 4 b-4", "record 5 b-5", "record 6 b-6")
}

// TestTailTornGapReplaced: a half-written line is waited for; completed
// as garbage (a crash's torn line) it is reported as torn and the chain
// goes on; a seq that skips is a gap; a file renamed over the log is
// followed from its start.
func TestTailTornGapReplaced(t *testing.T) {
	lines := recordLines(t, 6, "c")
	path := filepath.Join(t.TempDir(), "audit.log")
	appendFile(t, path, lines[0], lines[5][:40])
	r := startTail(t, path, TailOptions{Last: 10, Follow: true, Poll: time.Millisecond})
	r.expect(t, "record 1 c-1")
	appendFile(t, path, []byte("\n"), lines[1])
	r.expect(t, "torn", "record 2 c-2")
	appendFile(t, path, lines[4])
	r.expect(t, "gap seq 5 follows seq 2: 2 record(s) missing (check the log with vmgate audit verify)", "record 5 c-5")

	other := filepath.Join(filepath.Dir(path), "new.log")
	appendFile(t, other, recordLines(t, 2, "d")...)
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	r.expect(t, "replaced", "record 1 d-1", "record 2 d-2")
}

// TestTailLast: without -f, Tail reports the last records (those the
// filter matches) and stops; a half-written last line is not one.
func TestTailLast(t *testing.T) {
	lines := recordLines(t, 7, "e")
	path := filepath.Join(t.TempDir(), "audit.log")
	appendFile(t, path, lines[:6]...)
	appendFile(t, path, lines[6][:50])
	tests := []struct {
		o    TailOptions
		want []string
	}{
		{TailOptions{Last: 3}, []string{"record 4 e-4", "record 5 e-5", "record 6 e-6"}},
		{TailOptions{Last: 100}, []string{"record 1 e-1", "record 2 e-2", "record 3 e-3", "record 4 e-4", "record 5 e-5", "record 6 e-6"}},
		{TailOptions{Last: 2, Filter: Filter{Grant: "bob"}}, []string{"record 3 e-3", "record 6 e-6"}},
		{TailOptions{Last: 3, Filter: Filter{Grant: "alice"}}, []string{"record 2 e-2", "record 4 e-4", "record 5 e-5"}},
		{TailOptions{}, nil},
	}
	for _, tt := range tests {
		var got []string
		err := Tail(context.Background(), path, tt.o, func(ev *Event) error {
			got = append(got, eventWords(ev))
			return nil
		})
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("Tail(%+v) = %v, %v; want %v", tt.o, got, err, tt.want)
		}
	}
}

// TestTailFollowsLog: Tail -f on a real Log that 8 goroutines append to
// (durable, written-only and lazy appends, so batches of every size):
// every record once, seqs in order.
func TestTailFollowsLog(t *testing.T) {
	const writers, each = 8, 400
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path, Options{Fsync: FsyncInterval})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := startTail(t, path, TailOptions{FromStart: true, Follow: true, Poll: time.Millisecond})
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			ctx := context.Background()
			for i := range each {
				rec := testRecord(1)
				rec.CallID = fmt.Sprintf("%d-%d", w, i)
				var err error
				switch i % 3 {
				case 0:
					_, err = l.Append(ctx, rec)
				case 1:
					_, err = l.AppendWritten(ctx, rec)
				default:
					err = l.AppendLazy(ctx, rec)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	seen := map[string]bool{}
	for seq := 1; seq <= writers*each; seq++ {
		ev := r.next(t)
		var got uint64
		var id string
		if _, err := fmt.Sscanf(ev, "record %d %s", &got, &id); err != nil || got != uint64(seq) || seen[id] {
			t.Fatalf("event %d = %q; want record %d of a call not seen before", seq, ev, seq)
		}
		seen[id] = true
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
