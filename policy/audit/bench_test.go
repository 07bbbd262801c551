package audit

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkAppend measures decision appends with fsync on, from 1, 16 and 64
// concurrent writers: group commit (one fsync per batch) against one fsync
// per record (the same writer with batches of one). It reports appends/s.
func BenchmarkAppend(b *testing.B) {
	for _, writers := range []int{1, 16, 64} {
		for _, mode := range []struct {
			name     string
			maxBatch int
		}{{"group", 0}, {"per-record-fsync", 1}} {
			b.Run(fmt.Sprintf("writers=%d/%s", writers, mode.name), func(b *testing.B) {
				benchAppend(b, writers, Options{maxBatch: mode.maxBatch})
			})
		}
	}
}

// BenchmarkAppendNoFsync is the cost of one append on the call path without
// the fsync (Fsync interval: Append returns after write(2)), one writer.
func BenchmarkAppendNoFsync(b *testing.B) {
	benchAppend(b, 1, Options{Fsync: FsyncInterval, Interval: time.Hour})
}

// BenchmarkEncode is the CPU part of an append done by the caller
// (validation, redaction, JSON), without the writer.
func BenchmarkEncode(b *testing.B) {
	proto := benchRecord(1)
	b.ReportAllocs()
	for b.Loop() {
		rec := proto
		if _, err := encodeBody(&rec); err != nil {
			b.Fatal(err)
		}
	}
}

func benchRecord(i int) Record {
	rec := testRecord(1)
	rec.CallID = fmt.Sprint("call-", i)
	rec.Args["stdin"] = "some input"
	rec.Args["env"] = map[string]any{"A": "1", "B": "2"}
	return rec
}

func benchAppend(b *testing.B, writers int, opts Options) {
	path := filepath.Join(b.TempDir(), "audit.jsonl")
	l, err := Open(path, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	b.ReportAllocs()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if _, err := l.Append(context.Background(), benchRecord(int(i))); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "appends/s")
}
