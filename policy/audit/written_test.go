package audit

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func readOnlyDecision(callID string) Record {
	return Record{Kind: KindDecision, CallID: callID, Decision: "allow", Tool: "list_vms"}
}

// TestAppendWrittenWritesWithoutAnFsync: with Fsync always, AppendWritten
// returns once its record is in the file, costing one write(2) and no
// fsync; the next durable Append's fsync covers it.
func TestAppendWrittenWritesWithoutAnFsync(t *testing.T) {
	const calls = 20
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	// An hour-long interval: no timer flush interferes with the count.
	l, err := Open(path, Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for i := range calls {
		id := fmt.Sprint("ro-", i)
		seq, err := l.AppendWritten(ctx, readOnlyDecision(id))
		if err != nil || seq != uint64(2*i+1) {
			t.Fatalf("AppendWritten(%s) = %d, %v; want seq %d", id, seq, err, 2*i+1)
		}
		// In the file before the call would be dispatched.
		var last Record
		if err := Read(path, func(r Record) error { last = r; return nil }); err != nil || last.CallID != id {
			t.Fatalf("last record in the file after AppendWritten(%s) = %q, %v; want it written", id, last.CallID, err)
		}
		if err := l.AppendLazy(ctx, outcomeFor(id)); err != nil {
			t.Fatal(err)
		}
	}
	st := l.Stats()
	if st.Syncs != 0 || st.Writes != calls {
		t.Errorf("Stats() after %d AppendWritten = %+v; want %d writes and no fsync", calls, st, calls)
	}
	if _, err := l.Append(ctx, decisionFor("rw")); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Syncs != 1 || st.Records != 2*calls+1 {
		t.Errorf("Stats() after one durable Append = %+v; want 1 fsync covering all %d records", st, 2*calls+1)
	}
	l.Close()
	verifyFile(t, path)
}

// TestAppendWrittenIsFsyncedWithinTheInterval: with no durable append to
// ride with, the writer fsyncs written records Options.Interval later.
func TestAppendWrittenIsFsyncedWithinTheInterval(t *testing.T) {
	for _, mode := range []string{FsyncAlways, FsyncInterval} {
		t.Run(mode, func(t *testing.T) {
			l, err := Open(filepath.Join(t.TempDir(), "audit.jsonl"), Options{Fsync: mode, Interval: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if _, err := l.AppendWritten(context.Background(), readOnlyDecision("c1")); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for l.Stats().Syncs == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if st := l.Stats(); st.Syncs != 1 || st.Writes != 1 || st.Records != 1 {
				t.Fatalf("Stats() = %+v; want the record written once and fsynced once by the timer", st)
			}
		})
	}
}

// TestMixedAppendsKeepTheChain: durable and written-only decisions from
// many goroutines all land, in one verifiable chain, and the durable ones
// never cost more than one fsync each.
func TestMixedAppendsKeepTheChain(t *testing.T) {
	const writers, each = 16, 25
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				var err error
				if (w+i)%2 == 0 {
					_, err = l.AppendWritten(ctx, readOnlyDecision(id))
				} else {
					_, err = l.Append(ctx, decisionFor(id))
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep := verifyFile(t, path); rep.Records != writers*each {
		t.Fatalf("Verify = %d records; want %d", rep.Records, writers*each)
	}
}
