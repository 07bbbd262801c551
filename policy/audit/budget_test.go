package audit

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// The fsync budget of docs/design.md: one synchronous fsync per durable append,
// and none of its own for a lazy one (it rides with the next commit).

func outcomeFor(callID string) Record {
	return Record{Kind: KindOutcome, CallID: callID, Outcome: "ok", DurationMS: 0.5}
}

func decisionFor(callID string) Record {
	return Record{Kind: KindDecision, CallID: callID, Decision: "allow", Tool: "t",
		Counters: Counters{{Key: "k", Window: time.Second, Max: 10}}}
}

func TestSequentialCallCostsOneFsyncAndOneWrite(t *testing.T) {
	const calls = 50
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	// An hour-long interval: no timer flush interferes with the count.
	l, err := Open(path, Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range calls {
		id := fmt.Sprint("call-", i)
		if _, err := l.Append(ctx, decisionFor(id)); err != nil {
			t.Fatal(err)
		}
		if err := l.AppendLazy(ctx, outcomeFor(id)); err != nil {
			t.Fatal(err)
		}
	}
	st := l.Stats()
	if st.Syncs != calls || st.Writes != calls {
		t.Errorf("Stats() after %d calls = %+v; want %d syncs and %d writes (one each per call)", calls, st, calls, calls)
	}
	// Every outcome but the last rode with the next decision.
	if want := uint64(2*calls - 1); st.Records != want {
		t.Errorf("Stats().Records = %d; want %d (the last outcome waits)", st.Records, want)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Syncs != calls+1 || st.Records != 2*calls {
		t.Errorf("Stats() after Close = %+v; want %d syncs and %d records", st, calls+1, 2*calls)
	}
	var kinds []Kind
	if err := Read(path, func(r Record) error { kinds = append(kinds, r.Kind); return nil }); err != nil {
		t.Fatal(err)
	}
	for i, k := range kinds {
		want := KindDecision
		if i%2 == 1 {
			want = KindOutcome
		}
		if k != want {
			t.Fatalf("record %d is %s; want %s (decision, outcome, decision, … in call order)", i+1, k, want)
		}
	}
	verifyFile(t, path)
}

func TestLazyRecordIsFlushedWithinTheInterval(t *testing.T) {
	for _, mode := range []string{FsyncAlways, FsyncInterval} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			l, err := Open(path, Options{Fsync: mode, Interval: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := l.AppendLazy(context.Background(), outcomeFor("c1")); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for l.Stats().Syncs == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if st := l.Stats(); st.Syncs != 1 || st.Writes != 1 || st.Records != 1 {
				t.Fatalf("Stats() = %+v; want the lazy record written and fsynced once by the timer", st)
			}
			var n int
			if err := Read(path, func(Record) error { n++; return nil }); err != nil || n != 1 {
				t.Fatalf("Read = %d records, %v; want 1", n, err)
			}
		})
	}
}

func TestLazyFloodCostsNoFsyncPerRecord(t *testing.T) {
	const n = 3 * maxLazy
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := l.AppendLazy(context.Background(), outcomeFor(fmt.Sprint("c", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	if st.Syncs != 1 || st.Records != n || st.Writes < 1 || st.Writes > n/maxLazy+1 {
		t.Fatalf("Stats() after %d lazy appends and Close = %+v; want %d records in at most %d writes and 1 fsync (at Close)",
			n, st, n, n/maxLazy+1)
	}
	if rep := verifyFile(t, path); rep.Records != n {
		t.Fatalf("Verify = %d records; want %d", rep.Records, n)
	}
}

func TestConcurrentAppendsShareFsyncs(t *testing.T) {
	const writers, each = 32, 20
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			<-start
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := l.Append(context.Background(), decisionFor(id)); err != nil {
					errs <- err
					return
				}
				if err := l.AppendLazy(context.Background(), outcomeFor(id)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	close(start)
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	st := l.Stats()
	l.Close()
	// Never more than one fsync per durable append; with 32 writers
	// queueing behind each fsync, far fewer.
	if st.Syncs > writers*each || st.Syncs != st.Writes {
		t.Fatalf("Stats() = %+v after %d durable appends; want at most one fsync per append, one per write", st, writers*each)
	}
	t.Logf("%d durable appends from %d writers: %d fsyncs (%.1f appends per fsync)", writers*each, writers, st.Syncs, float64(writers*each)/float64(st.Syncs))
	if rep := verifyFile(t, path); rep.Records != 2*writers*each {
		t.Fatalf("Verify = %d records; want %d", rep.Records, 2*writers*each)
	}
}

// TestNoAppendLeftBehind: appends queued while another commit runs are
// committed by someone (the committer hands them to the writer goroutine),
// also when batches are capped, so no Append waits forever.
func TestNoAppendLeftBehind(t *testing.T) {
	for _, maxBatch := range []int{0, 1, 3} {
		t.Run(fmt.Sprint("maxBatch=", maxBatch), func(t *testing.T) {
			const writers, each = 16, 40
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			l, err := Open(path, Options{Fsync: FsyncInterval, Interval: time.Hour, maxBatch: maxBatch})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errs := make(chan error, writers)
			for w := range writers {
				go func() {
					for i := range each {
						if _, err := l.Append(ctx, decisionFor(fmt.Sprintf("w%d-%d", w, i))); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for range writers {
				if err := <-errs; err != nil {
					t.Fatalf("Append = %v; want every append committed", err)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if rep := verifyFile(t, path); rep.Records != writers*each {
				t.Fatalf("Verify = %d records; want %d", rep.Records, writers*each)
			}
		})
	}
}
