//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReplaceOwnFile: the file gets the new content and exactly its mode
// (whatever the umask took), or, when the temporary name is a symlink
// planted there, the write fails, the symlink's target is untouched, the
// old file stays and no temporary file is left.
func TestReplaceOwnFile(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	for _, tc := range []struct {
		name    string
		plant   bool // a symlink at the temporary name
		sync    bool
		wantErr bool
	}{
		{name: "synced", sync: true},
		{name: "not synced"},
		{name: "symlink at the temporary name", plant: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p, tmp, target := filepath.Join(dir, "f"), filepath.Join(dir, ".f.tmp"), filepath.Join(dir, "target")
			if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(target, []byte("target"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.plant {
				if err := os.Symlink(target, tmp); err != nil {
					t.Fatal(err)
				}
			}
			err := replaceOwnFile(p, tmp, []byte("new"), 0o644, tc.sync)
			if (err != nil) != tc.wantErr {
				t.Fatalf("replaceOwnFile() = %v; want error %v", err, tc.wantErr)
			}
			want, wantMode := "new", os.FileMode(0o644)
			if tc.wantErr {
				want, wantMode = "old", 0o600
			}
			b, err := os.ReadFile(p)
			if err != nil || string(b) != want {
				t.Errorf("file after replaceOwnFile = %q, %v; want %q", b, err, want)
			}
			if fi, err := os.Stat(p); err != nil {
				t.Error(err)
			} else if fi.Mode().Perm() != wantMode {
				t.Errorf("file mode after replaceOwnFile = %v; want %v", fi.Mode().Perm(), wantMode)
			}
			if b, err := os.ReadFile(target); err != nil || string(b) != "target" {
				t.Errorf("symlink target = %q, %v; want it untouched", b, err)
			}
			if _, err := os.Lstat(tmp); !tc.plant && err == nil {
				t.Errorf("temporary file %s left behind", tmp)
			}
		})
	}
}

// TestOpenLog: the helper's log is kept when small, emptied past 1 MiB,
// and a symlink at its name is refused with its target untouched.
func TestOpenLog(t *testing.T) {
	small, big := []byte("earlier\n"), make([]byte, 1<<20+1)
	for _, tc := range []struct {
		name    string
		old     []byte
		link    bool
		want    int64 // size once opened
		wantErr bool
	}{
		{name: "new", want: 0},
		{name: "small", old: small, want: int64(len(small))},
		{name: "past 1 MiB", old: big, want: 0},
		{name: "symlink", old: big, link: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p, target := filepath.Join(dir, "serve.log"), filepath.Join(dir, "target")
			if tc.old != nil {
				at := p
				if tc.link {
					at = target
					if err := os.Symlink(target, p); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.WriteFile(at, tc.old, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			f, err := openLog(p)
			if (err != nil) != tc.wantErr {
				t.Fatalf("openLog() = %v; want error %v", err, tc.wantErr)
			}
			if tc.link {
				if fi, err := os.Stat(target); err != nil || fi.Size() != int64(len(tc.old)) {
					t.Errorf("symlink target after openLog = %v, %v; want its %d bytes", fi, err, len(tc.old))
				}
				return
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil || fi.Size() != tc.want {
				t.Fatalf("log size after openLog = %v, %v; want %d", fi, err, tc.want)
			}
			if _, err := f.Write([]byte("next\n")); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(p); err != nil || fi.Size() != tc.want+5 {
				t.Errorf("log size after a write = %v, %v; want %d (appended)", fi, err, tc.want+5)
			}
		})
	}
}

// TestPrivateNode: the port's device node becomes root's, mode 0600; a
// node of another device, a regular file, or a symlink to the device
// (whose target must not change through the name) are left as they are.
func TestPrivateNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mknod and chown")
	}
	a := hostAgent(t)
	dev := unix.Mkdev(1, 3)
	for _, tc := range []struct {
		name string
		make func(p, target string) error
		want bool // the node at p changed
	}{
		{"the device", func(p, _ string) error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(dev)) }, true},
		{"another device", func(p, _ string) error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))) }, false},
		{"a regular file", func(p, _ string) error { return os.WriteFile(p, nil, 0o666) }, false},
		{"a symlink to the device", func(p, target string) error {
			if err := unix.Mknod(target, unix.S_IFCHR|0o666, int(dev)); err != nil {
				return err
			}
			return os.Symlink(target, p)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p, target := filepath.Join(dir, "port"), filepath.Join(dir, "node")
			if err := tc.make(p, target); err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{p, target} {
				_ = unix.Fchownat(unix.AT_FDCWD, q, 4321, 4321, unix.AT_SYMLINK_NOFOLLOW)
				_ = unix.Fchmodat(unix.AT_FDCWD, q, 0o666, 0)
			}
			if got := a.privateNode(p, dev); got != tc.want {
				t.Errorf("privateNode(%s) = %v; want %v", tc.name, got, tc.want)
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				t.Fatal(err)
			}
			if tc.want && (st.Uid != 0 || st.Mode&0o777 != 0o600) {
				t.Errorf("node after privateNode: uid %d mode %o; want 0, 600", st.Uid, st.Mode&0o777)
			}
			if !tc.want && st.Mode&unix.S_IFMT != unix.S_IFLNK && (st.Uid != 4321 || st.Mode&0o777 != 0o666) {
				t.Errorf("%s after privateNode: uid %d mode %o; want it untouched", tc.name, st.Uid, st.Mode&0o777)
			}
			if err := unix.Stat(target, &st); err == nil && (st.Uid != 4321 || st.Mode&0o777 != 0o666) {
				t.Errorf("symlink target after privateNode: uid %d mode %o; want it untouched", st.Uid, st.Mode&0o777)
			}
		})
	}
}
