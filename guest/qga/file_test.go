package qga

import (
	"bytes"
	"context"
	"testing"
)

// TestFileReadRoundTrips: a read of a file of exactly maxBytes takes one
// guest-file-read per chunk, its last asking one byte more so that the
// agent reports EOF there (no round trip for the byte alone); a longer file
// is truncated at maxBytes and says so.
func TestFileReadRoundTrips(t *testing.T) {
	const chunk = 64
	for _, tc := range []struct {
		size, maxBytes int
		reads          int
		truncated      bool
	}{
		{640, 640, 10, false},
		{641, 640, 10, true},
		{100, 640, 2, false},
		{0, 640, 1, false},
	} {
		file := bytes.Repeat([]byte{'q'}, tc.size)
		ff := &fakeFile{data: file}
		f := ff.caller()
		a := Agent{Caller: f, ChunkBytes: chunk}
		got, truncated, err := a.FileRead(context.Background(), "/x", int64(tc.maxBytes))
		want := file[:min(tc.size, tc.maxBytes)]
		if err != nil || !bytes.Equal(got, want) || truncated != tc.truncated || ff.reads != tc.reads {
			t.Errorf("FileRead(%d-byte file, max %d) = %d bytes, truncated %v, %v in %d reads; want %d bytes, truncated %v, in %d reads",
				tc.size, tc.maxBytes, len(got), truncated, err, ff.reads, len(want), tc.truncated, tc.reads)
		}
	}
}
