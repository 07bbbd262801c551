//go:build linux

package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// TestSessionTrashRestore: a trashed session's files come back into a new
// session, once; a name that exists refuses the restore before anything
// moves; expired trash is purged.
func TestSessionTrashRestore(t *testing.T) {
	a := hostAgent(t)
	ctx := context.Background()
	old, fresh, third := "feedfacefeedface0101", "feedfacefeedface0102", "feedfacefeedface0103"
	s, err := a.SessionCreate(ctx, wire.SessionCreate{ID: old})
	if err != nil {
		t.Fatalf("SessionCreate = %v", err)
	}
	if err := os.MkdirAll(filepath.Join(s.Workdir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"notes.txt": "kept\n", "src/main.go": "package main\n"} {
		if err := os.WriteFile(filepath.Join(s.Workdir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(s.Workdir, "out")); err != nil {
		t.Fatal(err)
	}
	d, err := a.SessionTrash(ctx, old, time.Hour)
	if err != nil || !d.Existed || d.TrashUntilMS <= time.Now().UnixMilli() {
		t.Fatalf("SessionTrash = %+v, %v; want existed with a trash expiry", d, err)
	}
	if _, err := os.Lstat(s.Workdir); !os.IsNotExist(err) {
		t.Errorf("workdir after trash: %v; want gone", err)
	}
	n, err := a.SessionCreate(ctx, wire.SessionCreate{ID: fresh})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = a.SessionDestroy(ctx, fresh) })
	if err := os.WriteFile(filepath.Join(n.Workdir, "notes.txt"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SessionRestore(ctx, fresh, old); !isCode(err, wire.CodeExists) {
		t.Errorf("SessionRestore over an existing name = %v; want exists", err)
	}
	if b, _ := os.ReadFile(filepath.Join(n.Workdir, "notes.txt")); string(b) != "new" {
		t.Errorf("notes.txt after a refused restore = %q; want the new session's", b)
	}
	if _, err := os.Lstat(filepath.Join(n.Workdir, "src")); !os.IsNotExist(err) {
		t.Errorf("a refused restore moved src: %v", err)
	}
	os.Remove(filepath.Join(n.Workdir, "notes.txt"))
	r, err := a.SessionRestore(ctx, fresh, old)
	slices.Sort(r.Entries)
	if err != nil || !slices.Equal(r.Entries, []string{"notes.txt", "out", "src"}) {
		t.Fatalf("SessionRestore = %+v, %v; want notes.txt, out, src", r, err)
	}
	if b, err := os.ReadFile(filepath.Join(n.Workdir, "src/main.go")); err != nil || string(b) != "package main\n" {
		t.Errorf("restored src/main.go = %q, %v", b, err)
	}
	if target, err := os.Readlink(filepath.Join(n.Workdir, "out")); err != nil || target != outside {
		t.Errorf("restored symlink = %q, %v; want it kept as a link to %s", target, err, outside)
	}
	if _, err := a.SessionRestore(ctx, fresh, old); !isCode(err, wire.CodeNotFound) {
		t.Errorf("second SessionRestore = %v; want not_found", err)
	}
	for _, tc := range []struct{ id, from string }{{fresh, fresh}, {fresh, "../x"}, {"nosuchsessionaaaa", old}} {
		if _, err := a.SessionRestore(ctx, tc.id, tc.from); err == nil {
			t.Errorf("SessionRestore(%q, %q) = nil; want an error", tc.id, tc.from)
		}
	}
	if _, err := a.SessionCreate(ctx, wire.SessionCreate{ID: third}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SessionTrash(ctx, third, time.Second); err != nil {
		t.Fatal(err)
	}
	if got := a.purgeTrash(time.Now().Add(2 * time.Second)); !slices.Equal(got, []string{third}) {
		t.Errorf("purgeTrash after the expiry = %v; want %s", got, third)
	}
	if _, err := a.SessionTrash(ctx, fresh, 25*time.Hour); !isCode(err, wire.CodeInvalid) {
		t.Errorf("SessionTrash for 25h = %v; want invalid", err)
	}
}
