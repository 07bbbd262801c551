package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestReserveLocked: blocks are reserved a chunk ahead, once per chunk; a
// file system that cannot reserve is not asked again; after another error
// the log asks again a chunk later.
func TestReserveLocked(t *testing.T) {
	const n = 300
	for _, tt := range []struct {
		name  string
		err   error
		sizes []int64 // the log's size before each append of n bytes
		want  []int64 // the offsets reserveBlocks is called at
	}{
		{"reserves a chunk ahead", nil, []int64{0, n, 2 * n, reserveChunk, reserveChunk + n, reserveChunk + n + 1}, []int64{0, reserveChunk + n}},
		{"unsupported: asked once", errors.ErrUnsupported, []int64{0, n, reserveChunk + 2*n, 3 * reserveChunk}, []int64{0}},
		{"EOPNOTSUPP: asked once", syscall.EOPNOTSUPP, []int64{0, 5 * reserveChunk}, []int64{0}},
		{"disk full: asked again a chunk later", syscall.ENOSPC, []int64{0, n, reserveChunk + n + 1}, []int64{0, reserveChunk + n + 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []int64
			old := reserveBlocksFn
			t.Cleanup(func() { reserveBlocksFn = old })
			reserveBlocksFn = func(f *os.File, off, len int64) error {
				if len != n+reserveChunk {
					t.Errorf("reserveBlocks(%d, %d); want a length of %d", off, len, n+reserveChunk)
				}
				got = append(got, off)
				return tt.err
			}
			l := &Log{path: "audit.jsonl", logger: slog.New(slog.DiscardHandler)}
			for _, size := range tt.sizes {
				l.size = size
				l.reserveLocked(n)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("reserveBlocks called at %v; want %v", got, tt.want)
			}
		})
	}
}

// TestReservedBlocksAreInvisible: after appends the log holds blocks past
// its end, its size is that of its records, and it verifies and reopens as
// before.
func TestReservedBlocksAreInvisible(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("blocks are reserved on Linux only")
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{Fsync: FsyncInterval, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := l.Append(context.Background(), testRecord(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep := verifyFile(t, path); rep.Records != 5 {
		t.Fatalf("Verify = %+v; want 5 records", rep)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) != fi.Size() || data[len(data)-1] != '\n' {
		t.Fatalf("the log reads %d bytes ending %q; want its size %d, ending in a newline", len(data), data[len(data)-1:], fi.Size())
	}
	if held := fi.Sys().(*syscall.Stat_t).Blocks * 512; held < reserveChunk {
		t.Errorf("the log holds %d bytes of blocks for %d bytes of records; want at least the %d reserved", held, fi.Size(), reserveChunk)
	}
	l, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("Open(again) = %v", err)
	}
	if seq, err := l.Append(context.Background(), testRecord(1)); err != nil || seq != 6 {
		t.Fatalf("Append after reopen = %d, %v; want seq 6", seq, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
