package qga

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
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
		pos, reads := 0, 0
		f := &fakeCaller{reply: func(cmd string, args json.RawMessage) (any, error) {
			var a struct {
				Count int `json:"count"`
			}
			if err := json.Unmarshal(args, &a); err != nil {
				return nil, err
			}
			switch cmd {
			case "guest-file-open":
				return 5, nil
			case "guest-file-close":
				return map[string]any{}, nil
			case "guest-file-read": // as qemu-ga: fread, then feof
				reads++
				n := min(a.Count, len(file)-pos)
				out := file[pos : pos+n]
				pos += n
				return map[string]any{"count": n, "buf-b64": base64.StdEncoding.EncodeToString(out), "eof": n < a.Count}, nil
			}
			return nil, errors.New("unexpected " + cmd)
		}}
		a := Agent{Caller: f, ChunkBytes: chunk}
		got, truncated, err := a.FileRead(context.Background(), "/x", int64(tc.maxBytes))
		want := file[:min(tc.size, tc.maxBytes)]
		if err != nil || !bytes.Equal(got, want) || truncated != tc.truncated || reads != tc.reads {
			t.Errorf("FileRead(%d-byte file, max %d) = %d bytes, truncated %v, %v in %d reads; want %d bytes, truncated %v, in %d reads",
				tc.size, tc.maxBytes, len(got), truncated, err, reads, len(want), tc.truncated, tc.reads)
		}
	}
}
