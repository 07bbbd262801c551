package audit

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestReservedBlocksAreInvisible: after appends the log holds blocks past
// its end, its size is that of its records, and it verifies and reopens as
// before.
func TestReservedBlocksAreInvisible(t *testing.T) {
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
