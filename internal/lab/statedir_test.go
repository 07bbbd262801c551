package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/guest/image"
)

// nobody is the uid of the user "nobody" on Debian, whom the tests make
// the owner of what vmgate must not trust.
const nobody = 65534

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chown to nobody needs root (the tests run as root in CI)")
	}
}

// modeOf is p's permission bits (without following a symlink at p).
func modeOf(t *testing.T, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

func mustChmod(t *testing.T, p string, m fs.FileMode) {
	t.Helper()
	if err := os.Chmod(p, m); err != nil {
		t.Fatal(err)
	}
}

// TestCheckStateDir: vmgate serve's check accepts only a directory of its
// own user with no bit for group or others, and says what to run.
func TestCheckStateDir(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name  string
		mode  fs.FileMode
		owner int      // -1: this user
		file  bool     // a regular file instead of a directory
		says  []string // "" want nil; DIR is replaced by the directory
	}{
		{name: "private", mode: 0o700, owner: -1},
		{name: "lab up of old", mode: 0o755, owner: -1, says: []string{"mode 0755", "other users can read it", `run "chmod 0700 DIR"`}},
		{name: "group readable", mode: 0o750, owner: -1, says: []string{"mode 0750", "can read", `"chmod 0700 DIR"`}},
		{name: "group traversable", mode: 0o710, owner: -1, says: []string{"mode 0710", `"chmod 0700 DIR"`}},
		{name: "world traversable", mode: 0o701, owner: -1, says: []string{"mode 0701", `"chmod 0700 DIR"`}},
		{name: "group writable", mode: 0o770, owner: -1, says: []string{"mode 0770", "can write it", "check what is in it", `"chmod 0700 DIR"`}},
		{name: "world writable", mode: 0o777, owner: -1, says: []string{"mode 0777", "can write it"}},
		{name: "world writable sticky", mode: fs.ModeSticky | 0o777, owner: -1, says: []string{"mode 1777", "can write it"}},
		{name: "owned by nobody", mode: 0o700, owner: nobody, says: []string{"belongs to uid 65534", "not to vmgate's user (uid 0)", `"chown -R 0 DIR && chmod 0700 DIR"`}},
		{name: "a file", mode: 0o600, owner: -1, file: true, says: []string{"DIR is not a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			var err error
			if tt.file {
				err = os.WriteFile(dir, nil, tt.mode)
			} else {
				err = os.Mkdir(dir, 0o700)
			}
			if err != nil {
				t.Fatal(err)
			}
			mustChmod(t, dir, tt.mode)
			if tt.owner >= 0 {
				if err := os.Chown(dir, tt.owner, tt.owner); err != nil {
					t.Fatal(err)
				}
			}
			err = CheckStateDir(dir)
			if len(tt.says) == 0 {
				if err != nil {
					t.Fatalf("CheckStateDir(%s, mode %04o) = %v; want nil", tt.name, tt.mode, err)
				}
				return
			}
			if !errors.Is(err, ErrStateDirOpen) {
				t.Fatalf("CheckStateDir(%s, mode %04o) = %v; want ErrStateDirOpen", tt.name, tt.mode, err)
			}
			for _, s := range tt.says {
				if s = strings.ReplaceAll(s, "DIR", dir); !strings.Contains(err.Error(), s) {
					t.Errorf("CheckStateDir(%s) = %q; want it to say %q", tt.name, err, s)
				}
			}
			if got := modeOf(t, dir); got != tt.mode {
				t.Errorf("after CheckStateDir the mode is %v; want it unchanged", got)
			}
		})
	}
	t.Run("symlink to a private directory", func(t *testing.T) {
		real := filepath.Join(t.TempDir(), "real")
		if err := os.Mkdir(real, 0o700); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(t.TempDir(), "state")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		if err := CheckStateDir(link); err != nil {
			t.Errorf("CheckStateDir(symlink to a 0700 directory) = %v; want nil", err)
		}
	})
}

// tree is a state directory as an older vmgate lab up left it: 0755, its
// disks 0644, plus a socket and a symlink out of it.
type tree struct {
	dir, outside string
}

func oldTree(t *testing.T) tree {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	outside := filepath.Join(t.TempDir(), "outside")
	for _, d := range []string{"lab/vm1", "images/abc", "cache"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"lab/vm1/disk.qcow2", "lab/vm1/serial.log", "lab/vm1/vm.json", "images/abc/initrd.img", "images/blank-64M.qcow2", "audit.log"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(outside, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "lab/vm1/link")); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "lab/vm1/qga.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	mustChmod(t, filepath.Join(dir, "lab/vm1/qga.sock"), 0o755)
	for _, d := range []string{"", "lab", "lab/vm1", "images", "images/abc", "cache"} {
		mustChmod(t, filepath.Join(dir, d), 0o755)
	}
	return tree{dir: dir, outside: outside}
}

// assertPrivate walks dir and reports everything in it (dir included)
// that has a permission bit for group or others; a symlink is not looked at.
func assertPrivate(t *testing.T, dir string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		n++
		m := modeOf(t, p)
		switch {
		case d.IsDir() && m != 0o700:
			t.Errorf("directory %s has mode %04o; want 0700", p, m)
		case !d.IsDir() && m&0o077 != 0:
			t.Errorf("%s has mode %04o; want no bits for group or others", p, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("walked %d entries of %s; want the tree", n, dir)
	}
}

// TestPrepareStateDir: vmgate lab up makes the state directory private,
// and tightens one an older version left open, following no symlink;
// a directory others could write or that another user owns is refused and
// left as it was.
func TestPrepareStateDir(t *testing.T) {
	requireRoot(t)
	t.Run("new, with a missing parent", func(t *testing.T) {
		parent := filepath.Join(t.TempDir(), "home", ".local")
		dir := filepath.Join(parent, "state", "vmgate")
		if err := PrepareStateDir(dir); err != nil {
			t.Fatalf("PrepareStateDir(new) = %v", err)
		}
		assertPrivate(t, filepath.Join(parent, "state"))
	})
	t.Run("left open by an older lab up", func(t *testing.T) {
		tr := oldTree(t)
		if err := PrepareStateDir(tr.dir); err != nil {
			t.Fatalf("PrepareStateDir(0755 tree) = %v", err)
		}
		assertPrivate(t, tr.dir)
		if m := modeOf(t, tr.outside); m != 0o644 {
			t.Errorf("the symlink's target outside has mode %04o; want 0644, untouched", m)
		}
		if err := CheckStateDir(tr.dir); err != nil {
			t.Errorf("CheckStateDir after PrepareStateDir = %v; want nil", err)
		}
	})
	refused := []struct {
		name  string
		sub   string // the directory to spoil, relative to the state directory
		mode  fs.FileMode
		owner int
		says  string
	}{
		{"state dir group writable", "", 0o775, -1, "has mode 0775: other users can write it"},
		{"state dir world writable", "", 0o757, -1, "has mode 0757: other users can write it"},
		{"state dir owned by nobody", "", 0o755, nobody, "belongs to uid 65534"},
		{"images world writable", "images", 0o777, -1, "images has mode 0777: other users can write it"},
		{"a VM directory owned by nobody", "lab/vm1", 0o700, nobody, "vm1 belongs to uid 65534"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			tr := oldTree(t)
			spoilt := filepath.Join(tr.dir, tt.sub)
			mustChmod(t, spoilt, tt.mode)
			if tt.owner >= 0 {
				if err := os.Chown(spoilt, tt.owner, tt.owner); err != nil {
					t.Fatal(err)
				}
			}
			err := PrepareStateDir(tr.dir)
			if !errors.Is(err, ErrStateDirOpen) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("PrepareStateDir(%s) = %v; want ErrStateDirOpen saying %q", tt.name, err, tt.says)
			}
			if m := modeOf(t, spoilt); m != tt.mode {
				t.Errorf("%s has mode %04o after the refusal; want %04o, untouched", spoilt, m, tt.mode)
			}
			if m := modeOf(t, filepath.Join(tr.dir, "lab/vm1/disk.qcow2")); tt.sub == "" && m != 0o644 {
				t.Errorf("a refused state directory's disk has mode %04o; want 0644, untouched", m)
			}
		})
	}
}

// TestLabUpSetUpIsPrivate runs what vmgate lab up does before QEMU starts,
// on a fresh state directory: PrepareStateDir, then a VM's directory with
// its disk overlay (on a blank base image qemu-img makes), logs and
// vm.json; everything it made is private.
func TestLabUpSetUpIsPrivate(t *testing.T) {
	if _, err := exec.LookPath(QEMUImgBinary); err != nil {
		t.Fatalf("%s not on PATH (Debian package qemu-utils): %v", QEMUImgBinary, err)
	}
	state := filepath.Join(t.TempDir(), "state")
	if err := PrepareStateDir(state); err != nil {
		t.Fatal(err)
	}
	img := &image.Image{Hash: "test", Kernel: "/nonexistent/vmlinuz", Initrd: "/nonexistent/initrd.img"}
	spec := Spec{Name: "vm1", StateDir: state}
	v, logf, err := setUp(context.Background(), spec, "/usr/bin/qemu-system-x86_64", img)
	if err != nil {
		t.Fatalf("setUp() = %v", err)
	}
	fmt.Fprintln(logf, "qemu says")
	logf.Close()
	if err := writeState(v); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{DiskName, SerialLogName, QEMULogName, StateFileName} {
		if _, err := os.Stat(filepath.Join(v.Dir, f)); err != nil {
			t.Errorf("setUp left no %s: %v", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "images", "blank-64M.qcow2")); err != nil {
		t.Errorf("no base image: %v", err)
	}
	assertPrivate(t, state)
	// A second set-up over the first one's files (the next lab up of a
	// stopped VM) leaves them private too.
	for _, f := range []string{SerialLogName, QEMULogName} {
		mustChmod(t, filepath.Join(v.Dir, f), 0o644)
	}
	if _, logf, err = setUp(context.Background(), spec, "/usr/bin/qemu-system-x86_64", img); err != nil {
		t.Fatalf("second setUp() = %v", err)
	}
	logf.Close()
	assertPrivate(t, state)
	var st syscall.Stat_t
	if err := syscall.Stat(state, &st); err != nil || st.Uid != uint32(os.Geteuid()) {
		t.Errorf("state directory owner %d, %v; want this user", st.Uid, err)
	}
}
