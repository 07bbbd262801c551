package image_test

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/image"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/testload"
)

// requireTools skips when the Debian tools the build needs are absent,
// unless VMGATE_REQUIRE_VM is set.
func requireTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb", "busybox", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("VMGATE_REQUIRE_VM") != "" {
				t.Fatalf("%s not on PATH and VMGATE_REQUIRE_VM is set", tool)
			}
			t.Skipf("%s not on PATH", tool)
		}
	}
}

// sharedCache is the real package cache, so the kernel .deb is fetched
// once per machine, not once per test run.
func sharedCache(t *testing.T) string {
	d, err := lab.DefaultStateDir()
	if err != nil {
		return filepath.Join(t.TempDir(), "cache")
	}
	return filepath.Join(d, "cache")
}

type cpioEntry struct {
	mode       uint32
	data       []byte
	rmaj, rmin uint32
}

// readCpio parses a gzip'd newc archive.
func readCpio(t *testing.T, file string) map[string]cpioEntry {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]cpioEntry{}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		if off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("cpio: bad header at %d", off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("cpio: field %d at %d: %v", i, off, err)
			}
			return uint32(v)
		}
		mode, size, rmaj, rmin, namesize := field(1), int(field(6)), field(9), field(10), int(field(11))
		name := string(b[off+110 : off+110+namesize-1])
		off = align(off + 110 + namesize)
		data := b[off : off+size]
		off = align(off + size)
		if name == "TRAILER!!!" {
			return out
		}
		out["/"+name] = cpioEntry{mode, data, rmaj, rmin}
	}
}

func TestBuild(t *testing.T) {
	requireTools(t)
	ctx, cancel := testload.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	state, cache := filepath.Join(t.TempDir(), "state"), sharedCache(t) // Build makes state
	src := filepath.Join(t.TempDir(), "helper")
	if err := os.WriteFile(src, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := image.Options{StateDir: state, CacheDir: cache, Extra: []image.File{{Src: src, Dst: "/usr/local/bin/helper", Mode: 0o755}}}
	img, err := image.Build(ctx, opts)
	if err != nil {
		t.Fatalf("Build() = %v", err)
	}
	if img.Cached || img.Dir != filepath.Join(state, "images", img.Hash) {
		t.Errorf("Build() = %+v; want a fresh image in images/<hash>", img)
	}
	// Only vmgate's user may read the state directory: Build made it, and
	// what it wrote there, private.
	for _, p := range []string{state, filepath.Join(state, "images"), img.Dir, img.Kernel, img.Initrd, filepath.Join(img.Dir, image.ManifestName)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o600)
		if fi.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %04o; want %04o", p, fi.Mode().Perm(), want)
		}
	}
	m, err := image.ReadManifest(img.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Hash != img.Hash || m.KernelVersion == "" || m.KernelVersion != img.KernelVersion {
		t.Errorf("manifest hash %q version %q; want %q %q", m.Hash, m.KernelVersion, img.Hash, img.KernelVersion)
	}

	// The manifest lists exactly what the initramfs holds.
	files := readCpio(t, img.Initrd)
	if len(files) != len(m.Files) {
		t.Errorf("initrd has %d entries, manifest %d", len(files), len(m.Files))
	}
	byPath := map[string]image.ManifestEntry{}
	for _, e := range m.Files {
		byPath[e.Path] = e
		ce, ok := files[e.Path]
		if !ok {
			t.Errorf("manifest entry %s missing from the initrd", e.Path)
			continue
		}
		if e.Type == "file" {
			sum := sha256.Sum256(ce.data)
			if hex.EncodeToString(sum[:]) != e.SHA256 {
				t.Errorf("%s: initrd content sha256 differs from the manifest", e.Path)
			}
		}
	}
	want := map[string]string{
		"/init": "file", "/sbin/shutdown": "file", "/bin/busybox": "file", "/bin/sh": "symlink",
		"/usr/bin/qemu-ga": "file", "/lib/modules/virtio_console.ko": "file", "/lib/modules/virtio_ring.ko": "file",
		"/etc/passwd": "file", "/dev/console": "chardev", "/tmp": "dir", "/usr/local/bin/helper": "file",
		"/usr/bin/wget": "symlink", "/usr/bin/nohup": "file",
	}
	for p, typ := range want {
		if byPath[p].Type != typ {
			t.Errorf("manifest %s type = %q; want %q", p, byPath[p].Type, typ)
		}
	}
	if h := files["/usr/local/bin/helper"]; string(h.data) != "one" || h.mode&0o7777 != 0o755 {
		t.Errorf("helper in initrd = %q mode %o; want %q mode 755", h.data, h.mode&0o7777, "one")
	}
	if c := files["/dev/console"]; c.mode&0o170000 != 0o020000 || c.rmaj != 5 || c.rmin != 1 {
		t.Errorf("/dev/console = mode %o %d:%d; want char 5:1", c.mode, c.rmaj, c.rmin)
	}

	again, err := image.Build(ctx, opts)
	if err != nil || again.Hash != img.Hash || !again.Cached {
		t.Errorf("second Build() = %+v, %v; want cached %s", again, err, img.Hash)
	}

	// Every change of an input changes the hash.
	src2 := filepath.Join(t.TempDir(), "helper")
	if err := os.WriteFile(src2, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	changes := []struct {
		name  string
		extra []image.File
	}{
		{"content", []image.File{{Src: src2, Dst: "/usr/local/bin/helper", Mode: 0o755}}},
		{"mode", []image.File{{Src: src, Dst: "/usr/local/bin/helper", Mode: 0o700}}},
		{"guest path", []image.File{{Src: src, Dst: "/usr/local/bin/helper2", Mode: 0o755}}},
		{"no extra", nil},
	}
	seen := map[string]string{img.Hash: "original"}
	for _, c := range changes {
		o := opts
		o.Extra = c.extra
		got, err := image.Build(ctx, o)
		if err != nil {
			t.Fatalf("Build(%s) = %v", c.name, err)
		}
		if prev, dup := seen[got.Hash]; dup {
			t.Errorf("Build(%s).Hash = %s, same as %s", c.name, got.Hash, prev)
		}
		seen[got.Hash] = c.name
	}
}

func TestBuildRejectsBadOptions(t *testing.T) {
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tests := []struct {
		name  string
		extra []image.File
	}{
		{"relative source", []image.File{{Src: "f", Dst: "/x"}}},
		{"missing source", []image.File{{Src: src + ".none", Dst: "/x"}}},
		{"source is a directory", []image.File{{Src: dir, Dst: "/x"}}},
		{"relative guest path", []image.File{{Src: src, Dst: "x"}}},
		{"unclean guest path", []image.File{{Src: src, Dst: "/a/../init"}}},
		{"root", []image.File{{Src: src, Dst: "/"}}},
		{"replaces /init", []image.File{{Src: src, Dst: "/init"}}},
		{"under /proc", []image.File{{Src: src, Dst: "/proc/x"}}},
		{"replaces qemu-ga", []image.File{{Src: src, Dst: "/usr/bin/qemu-ga"}}},
		{"type bits in mode", []image.File{{Src: src, Dst: "/x", Mode: fs.ModeDir | 0o755}}},
		{"duplicate", []image.File{{Src: src, Dst: "/x"}, {Src: src, Dst: "/x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			_, err := image.Build(context.Background(), image.Options{StateDir: state, Extra: tt.extra})
			if !errors.Is(err, image.ErrInvalidOptions) {
				t.Fatalf("Build(%+v) = %v; want ErrInvalidOptions", tt.extra, err)
			}
			if ents, _ := os.ReadDir(state); len(ents) != 0 {
				t.Errorf("Build(%+v) created %v; want nothing", tt.extra, ents)
			}
		})
	}
	if _, err := image.Build(context.Background(), image.Options{}); !errors.Is(err, image.ErrInvalidOptions) {
		t.Errorf("Build(no state dir) = %v; want ErrInvalidOptions", err)
	}
}
