//go:build linux

package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// walkUID is the owner the walk tests give away (a session uid of the
// default range; no process runs with it).
const walkUID = DefaultUIDBase + 4242

// deepTree makes top/a/a/.../a (depth levels) with a file "f" in the
// deepest one, by descriptor (the path is longer than PATH_MAX at some
// depths), and returns the deepest directory's descriptor's stat.
func deepTree(t *testing.T, top string, depth int) unix.Stat_t {
	t.Helper()
	fd, err := unix.Open(top, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("a", 200) // 1,400 of them make a path far past PATH_MAX
	for i := 0; i < depth; i++ {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatalf("mkdir at depth %d: %v", i, err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	defer unix.Close(fd)
	ffd, err := unix.Openat(fd, "f", unix.O_CREAT|unix.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(ffd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "f", &st, 0); err != nil {
		t.Fatal(err)
	}
	return st
}

// deepOwner is the owner of top/a/.../a/f, reached by descriptor.
func deepOwner(t *testing.T, top string, depth int) uint32 {
	t.Helper()
	fd, err := unix.Open(top, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("a", 200)
	for i := 0; i < depth; i++ {
		next, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "f", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}

// lowFileLimit sets the soft RLIMIT_NOFILE to n for the test.
func lowFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = n
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NOFILE, &old) })
}

func openDir(t *testing.T, p string) int {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func lstatUID(t *testing.T, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}

// TestChownTreeDeep: 1,400 levels, with 200 descriptors allowed in all,
// are chowned to the bottom; the walk never holds more than its bound.
func TestChownTreeDeep(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	const depth = 1400
	for _, maxOpen := range []int{0, 1} {
		top := t.TempDir()
		deepTree(t, top, depth)
		lowFileLimit(t, 200)
		w := dirWalk{maxOpen: maxOpen, enter: func(_ int, _ string, fd int, _ *unix.Stat_t) error {
			return unix.Fchownat(fd, "", walkUID, walkUID, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
		}}
		var most int
		w.hook = func(string, int) {
			ents, _ := os.ReadDir("/proc/self/fd")
			most = max(most, len(ents))
		}
		if err := w.walk(openDir(t, top)); err != nil {
			t.Fatalf("walk(maxOpen %d) = %v", maxOpen, err)
		}
		if got := deepOwner(t, top, depth); got != walkUID {
			t.Errorf("maxOpen %d: the deepest file is owned by %d; want %d", maxOpen, got, walkUID)
		}
		if bound := max(w.maxOpenDirs(), 1) + 16; most > bound {
			t.Errorf("maxOpen %d: %d descriptors open at once; want at most %d", maxOpen, most, bound)
		}
		if err := removeTree(openDir(t, filepath.Dir(top)), filepath.Base(top)); err != nil || exists(top) {
			t.Errorf("removeTree of the deep tree = %v (exists %v); want it gone", err, exists(top))
		}
	}
}

// TestChownTreeLinksAndNodes: symlinks are chowned themselves, their
// targets never; device nodes and files with other hard links keep their
// owner unless the old session owned them.
func TestChownTreeLinksAndNodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	top, outside := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600))
	must(os.MkdirAll(filepath.Join(top, "d"), 0o755))
	must(os.WriteFile(filepath.Join(top, "d", "plain"), []byte("p"), 0o644))
	must(os.Symlink(outside, filepath.Join(top, "dlink")))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(top, "d", "flink")))
	must(os.Link(filepath.Join(outside, "secret"), filepath.Join(top, "d", "hard")))
	must(os.WriteFile(filepath.Join(outside, "own"), []byte("o"), 0o600))
	must(os.Chown(filepath.Join(outside, "own"), walkUID-1, walkUID-1))
	must(os.Link(filepath.Join(outside, "own"), filepath.Join(top, "ownhard")))
	must(unix.Mknod(filepath.Join(top, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	kept, err := chownTree(openDir(t, top), walkUID, walkUID, walkUID-1)
	if err != nil || kept != 2 {
		t.Fatalf("chownTree = %d kept, %v; want 2 (the device node and the foreign hard link)", kept, err)
	}
	for _, tt := range []struct {
		path string
		want uint32
	}{
		{filepath.Join(top, "d"), walkUID}, {filepath.Join(top, "d", "plain"), walkUID},
		{filepath.Join(top, "dlink"), walkUID}, {filepath.Join(top, "d", "flink"), walkUID},
		{filepath.Join(top, "ownhard"), walkUID},
		{filepath.Join(top, "null"), 0}, {filepath.Join(top, "d", "hard"), 0},
		{outside, 0}, {filepath.Join(outside, "secret"), 0},
	} {
		if got := lstatUID(t, tt.path); got != tt.want {
			t.Errorf("owner of %s = %d; want %d", tt.path, got, tt.want)
		}
	}
}

// TestDirWalkSwappedMidWalk: a directory replaced by a symlink between the
// listing and the visit is not followed; a directory moved while the walk
// is below it (its descriptor closed) stops the walk instead of leading it
// elsewhere.
func TestDirWalkSwappedMidWalk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	chown := func(_ int, _ string, fd int, _ *unix.Stat_t) error {
		return unix.Fchownat(fd, "", walkUID, walkUID, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
	}
	t.Run("symlink swapped in", func(t *testing.T) {
		top, outside := t.TempDir(), t.TempDir()
		if err := os.MkdirAll(filepath.Join(top, "a"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(top, "d"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(outside, "passwd"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		w := dirWalk{enter: chown, hook: func(_ string, depth int) {
			if depth == 1 { // top listed: a and d are names now, not yet visited
				_ = os.Rename(filepath.Join(top, "d"), filepath.Join(top, "d.old"))
				_ = os.Symlink(outside, filepath.Join(top, "d"))
			}
		}}
		if err := w.walk(openDir(t, top)); err != nil {
			t.Fatalf("walk = %v", err)
		}
		if got := lstatUID(t, filepath.Join(top, "d")); got != walkUID {
			t.Errorf("the swapped-in symlink is owned by %d; want it chowned itself", got)
		}
		for _, p := range []string{outside, filepath.Join(outside, "passwd")} {
			if got := lstatUID(t, p); got != 0 {
				t.Errorf("%s is owned by %d: the walk followed the symlink", p, got)
			}
		}
	})
	t.Run("directory moved", func(t *testing.T) {
		top := t.TempDir()
		if err := os.MkdirAll(filepath.Join(top, "x", "y", "z", "w"), 0o755); err != nil {
			t.Fatal(err)
		}
		moved := false
		w := dirWalk{maxOpen: 1, enter: chown, hook: func(_ string, depth int) {
			if depth == 4 && !moved { // in z: x's descriptor is closed
				moved = true
				_ = os.Rename(filepath.Join(top, "x", "y"), filepath.Join(top, "y"))
			}
		}}
		if err := w.walk(openDir(t, top)); !errors.Is(err, errDirMoved) {
			t.Errorf("walk with y moved out of x = %v; want %v", err, errDirMoved)
		}
	})
}

// TestDestroyDoesNotFollowSymlinks: removeTree unlinks symlinks (to
// directories and files outside) and leaves their targets alone.
func TestDestroyDoesNotFollowSymlinks(t *testing.T) {
	parent, outside := t.TempDir(), t.TempDir()
	top := filepath.Join(parent, "tree")
	if err := os.MkdirAll(filepath.Join(top, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ target, link string }{{outside, "sub/dir"}, {filepath.Join(outside, "keep"), "file"}} {
		if err := os.Symlink(l.target, filepath.Join(top, l.link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := removePath(top); err != nil || exists(top) {
		t.Fatalf("removePath = %v (exists %v); want the tree gone", err, exists(top))
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "k" {
		t.Errorf("the symlinks' target = %q, %v; want it untouched", b, err)
	}
	if err := removePath(top); err != nil {
		t.Errorf("removePath of a missing tree = %v; want nil", err)
	}
}
