//go:build linux

package guestctl

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// TestLoopProgressByPieces: a write and a ranged read larger than a piece
// report their bytes as each piece moves: from 0 up to the whole, one step
// per piece of wire.PieceCap, the total the data's size.
func TestLoopProgressByPieces(t *testing.T) {
	_, h, dir := loopSetup(t)
	ctx := context.Background()
	const size = 2*wire.SmallPieceBytes + 12345 // three pieces
	data := pattern(size)
	p := filepath.Join(dir, "f")
	want := [][2]int64{{0, size}, {wire.SmallPieceBytes, size}, {2 * wire.SmallPieceBytes, size}, {size, size}}
	var got [][2]int64
	record := func(done, total int64) { got = append(got, [2]int64{done, total}) }
	if _, err := h.FileWrite(ctx, "vm", p, data, WriteOptions{CreateMode: 0o644, Progress: record}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("FileWrite(%d bytes) progress = %v; want %v", size, got, want)
	}
	got = nil
	r, err := h.FileReadRange(ctx, "vm", p, ReadOptions{Length: size, Progress: record})
	if err != nil || int64(len(r.Data)) != size {
		t.Fatalf("FileReadRange = %d bytes, %v; want %d", len(r.Data), err, size)
	}
	if !slices.Equal(got, want) {
		t.Errorf("FileReadRange(%d bytes) progress = %v; want %v", size, got, want)
	}
	if b, _ := os.ReadFile(p); len(b) != size {
		t.Errorf("file holds %d bytes; want %d", len(b), size)
	}
}
