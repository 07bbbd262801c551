//go:build linux

package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

func TestDirList(t *testing.T) {
	ft := newFileTree(t)
	a := newFileAgent(t)
	sub := filepath.Join(ft.ok, "sub")
	os.MkdirAll(filepath.Join(sub, "deeper"), 0o750)
	os.WriteFile(filepath.Join(sub, "deeper", "f"), []byte("12345"), 0o600)
	os.WriteFile(filepath.Join(sub, "b"), nil, 0o644)
	os.WriteFile(filepath.Join(sub, "a"), nil, 0o644)
	ctx := context.Background()
	line := func(l wire.DirList) string {
		var s []string
		for _, e := range l.Entries {
			d := e.Path + ":" + e.Type
			if e.Target != "" {
				d += "->" + e.Target
			}
			s = append(s, d)
		}
		return strings.Join(s, " ")
	}
	tests := []struct {
		name       string
		path       string
		depth, max int
		want       string
		truncated  bool
	}{
		{"one level, sorted, links as data", ft.ok, 1, 100,
			"dirlink:symlink->.. fifo:fifo hard:file link:symlink->../secret plain:file sub:dir suid:file", false},
		{"two levels", sub, 2, 100, "a:file b:file deeper:dir deeper/f:file", false},
		{"one level", sub, 1, 100, "a:file b:file deeper:dir", false},
		{"capped", ft.ok, 3, 5, "dirlink:symlink->.. fifo:fifo hard:file link:symlink->../secret plain:file", true},
		{"the cap is the listing's, not a level's", ft.ok, 3, 8, "dirlink:symlink->.. fifo:fifo hard:file link:symlink->../secret plain:file sub:dir sub/a:file sub/b:file", true},
	}
	for _, tc := range tests {
		got, err := a.DirList(ctx, tc.path, tc.depth, tc.max)
		if err != nil || line(got) != tc.want || got.Truncated != tc.truncated || got.Path != tc.path || got.Depth != tc.depth {
			t.Errorf("%s: DirList(%s, %d, %d) = %q, truncated %v, %v; want %q, truncated %v", tc.name, tc.path, tc.depth, tc.max, line(got), got.Truncated, err, tc.want, tc.truncated)
		}
	}
	got, _ := a.DirList(ctx, sub, 2, 100)
	f := got.Entries[3]
	if f.Size != 5 || f.Mode != 0o600 || f.MtimeMS == 0 || f.UID != uint32(os.Geteuid()) || f.Nlink != 1 {
		t.Errorf("deeper/f = %+v; want size 5, mode 0600, an mtime, our uid, 1 link", f)
	}
	if d := got.Entries[2]; d.Mode != 0o750 {
		t.Errorf("deeper mode %#o; want 0750", d.Mode)
	}
	for _, tc := range []struct{ path, code, reason string }{
		{filepath.Join(ft.ok, "dirlink"), wire.CodeRefused, wire.ReasonSymlink},
		{filepath.Join(ft.ok, "dirlink", "ok"), wire.CodeRefused, wire.ReasonSymlink},
		{filepath.Join(ft.ok, "plain"), wire.CodeRefused, wire.ReasonNotRegular},
		{filepath.Join(ft.ok, "fifo"), wire.CodeRefused, wire.ReasonNotRegular},
		{filepath.Join(ft.ok, "missing"), wire.CodeNotFound, ""},
		{"ok", wire.CodeInvalid, ""},
	} {
		if _, err := a.DirList(ctx, tc.path, 1, 10); refusal(err, tc.code, tc.reason, "") != "" {
			t.Errorf("DirList(%s) = %v; want %s %s", tc.path, err, tc.code, tc.reason)
		}
	}
	for _, bad := range [][2]int{{0, 10}, {wire.MaxDirDepth + 1, 10}, {1, 0}, {1, wire.MaxDirEntries + 1}} {
		if _, err := a.DirList(ctx, ft.ok, bad[0], bad[1]); !isCode(err, wire.CodeInvalid) {
			t.Errorf("DirList(depth %d, max %d) = %v; want invalid", bad[0], bad[1], err)
		}
	}
	// A directory with more names than the cap is truncated, not read whole.
	many := filepath.Join(ft.root, "many")
	os.Mkdir(many, 0o755)
	for i := range 30 {
		os.WriteFile(filepath.Join(many, "f"+strconv.Itoa(100+i)), nil, 0o644)
	}
	if got, err := a.DirList(ctx, many, 1, 10); err != nil || len(got.Entries) != 10 || !got.Truncated || got.Entries[0].Path != "f100" {
		t.Errorf("DirList(30 files, max 10) = %d entries from %q, truncated %v, %v; want the first 10 sorted, truncated", len(got.Entries), got.Entries[0].Path, got.Truncated, err)
	}
}
