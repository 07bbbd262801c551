package image

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeImage writes an image directory with a manifest built at built.
func fakeImage(t *testing.T, state, hash string, built time.Time, files ...string) string {
	t.Helper()
	dir := filepath.Join(state, "images", hash)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(Manifest{Hash: hash, KernelVersion: "6.1", Built: built})
	if err := os.WriteFile(filepath.Join(dir, ManifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestOpenAndNewest(t *testing.T) {
	state := t.TempDir()
	h := func(c string) string { return strings.Repeat(c, 64) }
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	older := fakeImage(t, state, h("a"), t0, KernelName, InitrdName)
	newer := fakeImage(t, state, h("b"), t0.Add(time.Hour), KernelName, InitrdName)
	fakeImage(t, state, h("c"), t0.Add(2*time.Hour), KernelName) // no initrd: incomplete
	wrong := fakeImage(t, state, h("d"), t0.Add(3*time.Hour), KernelName, InitrdName)
	os.Rename(wrong, filepath.Join(state, "images", h("e"))) // manifest names another hash

	img, err := Newest(state)
	if err != nil || img.Dir != newer || img.Hash != h("b") || img.Initrd != filepath.Join(newer, InitrdName) {
		t.Errorf("Newest = %+v, %v; want the newest complete image %s", img, err, newer)
	}
	if img, err := Open(older); err != nil || img.Kernel != filepath.Join(older, KernelName) {
		t.Errorf("Open(%s) = %+v, %v; want it", older, img, err)
	}
	for _, dir := range []string{filepath.Join(state, "images", h("c")), filepath.Join(state, "images", h("e")), "relative/dir", filepath.Join(state, "none")} {
		if _, err := Open(dir); !errors.Is(err, ErrNoImage) {
			t.Errorf("Open(%s) = %v; want ErrNoImage", dir, err)
		}
	}
	if _, err := Newest(t.TempDir()); !errors.Is(err, ErrNoImage) {
		t.Errorf("Newest(empty state) = %v; want ErrNoImage", err)
	}
}
