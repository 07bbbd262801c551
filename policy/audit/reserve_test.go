package audit

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"testing"
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
