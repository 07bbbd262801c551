//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// fileTree is a directory with a secret outside the allowed dir and links to it:
//
//	secret             "top secret"
//	ok/plain           "plain", 0640
//	ok/link     -> ../secret
//	ok/dirlink  -> ..            (a symlink in a middle component)
//	ok/suid            04755
//	ok/hard            a hard link of secret
//	ok/fifo            a FIFO
type fileTree struct{ root, ok, secret string }

func newFileTree(t *testing.T) fileTree {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ft := fileTree{root: root, ok: filepath.Join(root, "ok"), secret: filepath.Join(root, "secret")}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(ft.ok, 0o755))
	must(os.WriteFile(ft.secret, []byte("top secret"), 0o600))
	must(os.WriteFile(filepath.Join(ft.ok, "plain"), []byte("plain"), 0o640))
	must(os.Chmod(filepath.Join(ft.ok, "plain"), 0o640))
	must(os.Symlink("../secret", filepath.Join(ft.ok, "link")))
	must(os.Symlink("..", filepath.Join(ft.ok, "dirlink")))
	must(os.WriteFile(filepath.Join(ft.ok, "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chmod(filepath.Join(ft.ok, "suid"), os.ModeSetuid|0o755))
	must(os.Link(ft.secret, filepath.Join(ft.ok, "hard")))
	must(syscall.Mkfifo(filepath.Join(ft.ok, "fifo"), 0o644))
	return ft
}

func (ft fileTree) secretIntact(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(ft.secret)
	st, serr := os.Stat(ft.secret)
	if err != nil || string(b) != "top secret" || serr != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("secret = %q, %v (mode %v); want %q, mode 0600, untouched", b, err, st.Mode(), "top secret")
	}
}

func newFileAgent(t *testing.T) *Agent {
	t.Helper()
	a, err := New(Config{Root: t.TempDir(), ProcDir: "/proc"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// bothWalks runs f with openat2 and with the per-component O_NOFOLLOW walk.
func bothWalks(t *testing.T, f func(t *testing.T)) {
	for _, use := range []bool{true, false} {
		name := map[bool]string{true: "openat2", false: "walk"}[use]
		t.Run(name, func(t *testing.T) {
			saved := useOpenat2
			useOpenat2 = use
			defer func() { useOpenat2 = saved }()
			f(t)
		})
	}
}

// refusal checks err is a wire error with code and reason, mentioning want.
func refusal(err error, code, reason, want string) string {
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code || we.Reason != reason || !strings.Contains(err.Error(), want) {
		return "want " + code + "/" + reason + " mentioning " + want
	}
	return ""
}

func TestFileReadRefusesSymlinks(t *testing.T) {
	bothWalks(t, func(t *testing.T) {
		ft := newFileTree(t)
		a := newFileAgent(t)
		ctx := context.Background()
		got, err := a.FileRead(ctx, filepath.Join(ft.ok, "plain"), 100)
		if err != nil || string(got.Data) != "plain" || got.Truncated || got.Mode != 0o640 || got.Path != filepath.Join(ft.ok, "plain") {
			t.Fatalf("FileRead(plain) = %+v, %v; want plain, 0640", got, err)
		}
		if got, err := a.FileRead(ctx, filepath.Join(ft.ok, "plain"), 3); err != nil || string(got.Data) != "pla" || !got.Truncated {
			t.Errorf("FileRead(plain, 3) = %q, %v, %v; want pla, truncated", got.Data, got.Truncated, err)
		}
		tests := []struct {
			name, path, code, reason, want string
		}{
			{"symlink last", filepath.Join(ft.ok, "link"), wire.CodeRefused, wire.ReasonSymlink, ft.ok + "/link is a symlink"},
			{"symlink middle", filepath.Join(ft.ok, "dirlink", "secret"), wire.CodeRefused, wire.ReasonSymlink, ft.ok + "/dirlink is a symlink"},
			{"proc self root", "/proc/self/root" + ft.secret, wire.CodeRefused, wire.ReasonSymlink, "/proc/self is a symlink"},
			{"dotdot after symlink", filepath.Join(ft.ok, "dirlink") + "/../secret", wire.CodeInvalid, "", "not clean"},
			{"relative", "ok/plain", wire.CodeInvalid, "", "not absolute"},
			{"NUL", ft.ok + "/plain\x00x", wire.CodeInvalid, "", "NUL"},
			{"fifo", filepath.Join(ft.ok, "fifo"), wire.CodeRefused, wire.ReasonNotRegular, "not a regular file"},
			{"directory", ft.ok, wire.CodeRefused, wire.ReasonNotRegular, "is a directory"},
			{"missing", filepath.Join(ft.ok, "nope"), wire.CodeNotFound, "", "no such file"},
		}
		for _, tc := range tests {
			got, err := a.FileRead(ctx, tc.path, 100)
			if msg := refusal(err, tc.code, tc.reason, tc.want); msg != "" {
				t.Errorf("%s: FileRead(%q) = %q, %v; %s", tc.name, tc.path, got.Data, err, msg)
			}
		}
	})
}

func TestFileWriteRefusals(t *testing.T) {
	bothWalks(t, func(t *testing.T) {
		ft := newFileTree(t)
		a := newFileAgent(t)
		ctx := context.Background()
		opts := func(mode int64, special bool) FileWriteOptions {
			return FileWriteOptions{Mode: mode, CreateMode: 0o644, SpecialBits: special, Size: 5}
		}
		tests := []struct {
			name, path string
			o          FileWriteOptions
			code       string
			reason     string
			want       string
		}{
			{"over a symlink to the secret", filepath.Join(ft.ok, "link"), opts(-1, false), wire.CodeRefused, wire.ReasonSymlink, "last component"},
			{"over a symlink even with special bits", filepath.Join(ft.ok, "link"), opts(0o644, true), wire.CodeRefused, wire.ReasonSymlink, "last component"},
			{"through a symlinked directory", filepath.Join(ft.ok, "dirlink", "secret"), opts(-1, false), wire.CodeRefused, wire.ReasonSymlink, ft.ok + "/dirlink is a symlink"},
			{"proc self root", "/proc/self/root" + ft.secret, opts(-1, false), wire.CodeRefused, wire.ReasonSymlink, "/proc/self is a symlink"},
			{"setuid mode", filepath.Join(ft.ok, "new1"), opts(0o4777, false), wire.CodeRefused, wire.ReasonSpecialBits, "04777"},
			{"setgid mode", filepath.Join(ft.ok, "new2"), opts(0o2755, false), wire.CodeRefused, wire.ReasonSpecialBits, "02755"},
			{"sticky mode", filepath.Join(ft.ok, "new3"), opts(0o1777, false), wire.CodeRefused, wire.ReasonSpecialBits, "01777"},
			{"existing setuid file", filepath.Join(ft.ok, "suid"), opts(-1, false), wire.CodeRefused, wire.ReasonSpecialBits, "setuid or setgid"},
			{"hard link of the secret", filepath.Join(ft.ok, "hard"), opts(-1, false), wire.CodeRefused, wire.ReasonHardlink, "2 hard links"},
			{"fifo", filepath.Join(ft.ok, "fifo"), opts(-1, false), wire.CodeRefused, wire.ReasonNotRegular, "not a regular file"},
			{"directory", ft.ok, opts(-1, false), wire.CodeRefused, wire.ReasonNotRegular, "directory"},
			{"dotdot", ft.ok + "/../secret", opts(-1, false), wire.CodeInvalid, "", "not clean"},
		}
		for _, tc := range tests {
			got, err := a.FileWrite(ctx, tc.path, tc.o, strings.NewReader("pwned"))
			if msg := refusal(err, tc.code, tc.reason, tc.want); msg != "" {
				t.Errorf("%s: FileWrite(%q) = %+v, %v; %s", tc.name, tc.path, got, err, msg)
			}
		}
		ft.secretIntact(t)
		for _, n := range []string{"new1", "new2", "new3"} {
			if _, err := os.Lstat(filepath.Join(ft.ok, n)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("refused write left %s behind (%v)", n, err)
			}
		}
		if st, err := os.Stat(filepath.Join(ft.ok, "suid")); err != nil || st.Mode()&os.ModeSetuid == 0 || st.Size() != 10 {
			t.Errorf("setuid file after a refused write: %v, %v; want unchanged", st, err)
		}
	})
}

func TestFileWriteModes(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	ft := newFileTree(t)
	a := newFileAgent(t)
	ctx := context.Background()
	write := func(name string, o FileWriteOptions, data string) (wire.FileWritten, os.FileInfo) {
		t.Helper()
		o.Size = int64(len(data))
		got, err := a.FileWrite(ctx, filepath.Join(ft.ok, name), o, strings.NewReader(data))
		if err != nil {
			t.Fatalf("FileWrite(%s, %+v) = %v", name, o, err)
		}
		st, err := os.Lstat(filepath.Join(ft.ok, name))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(ft.ok, name))
		if string(b) != data || got.Bytes != int64(len(data)) {
			t.Errorf("FileWrite(%s): file holds %q, reply %d bytes; want %q", name, b, got.Bytes, data)
		}
		return got, st
	}
	tests := []struct {
		name    string
		file    string
		o       FileWriteOptions
		want    os.FileMode
		created bool
	}{
		{"no mode: the default 0644, not 0666 under umask 0", "a", FileWriteOptions{Mode: -1, CreateMode: 0o644}, 0o644, true},
		{"policy default 0600", "b", FileWriteOptions{Mode: -1, CreateMode: 0o600}, 0o600, true},
		{"explicit 0666", "c", FileWriteOptions{Mode: 0o666, CreateMode: 0o644}, 0o666, true},
		{"existing keeps its mode", "plain", FileWriteOptions{Mode: -1, CreateMode: 0o644}, 0o640, false},
		{"existing given a mode", "plain", FileWriteOptions{Mode: 0o600, CreateMode: 0o644}, 0o600, false},
		{"setuid when allowed", "d", FileWriteOptions{Mode: 0o4755, CreateMode: 0o644, SpecialBits: true}, 0o4755 | os.ModeSetuid, true},
	}
	for _, tc := range tests {
		got, st := write(tc.file, tc.o, "data for "+tc.file)
		perm := st.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		if want := tc.want&os.ModePerm | tc.want&os.ModeSetuid; perm != want || got.Created != tc.created {
			t.Errorf("%s: mode %v, created %v; want %v, %v", tc.name, perm, got.Created, want, tc.created)
		}
	}
	// Short data: a new file is removed again, nothing half-written stays.
	_, err := a.FileWrite(ctx, filepath.Join(ft.ok, "short"), FileWriteOptions{Mode: -1, CreateMode: 0o644, Size: 10}, strings.NewReader("abc"))
	if msg := refusal(err, wire.CodeInvalid, "", "got 3 bytes"); msg != "" {
		t.Errorf("short write = %v; %s", err, msg)
	}
	if _, err := os.Lstat(filepath.Join(ft.ok, "short")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("short write left the file (%v)", err)
	}
}

func TestFileStatResolves(t *testing.T) {
	ft := newFileTree(t)
	a := newFileAgent(t)
	ctx := context.Background()
	tests := []struct {
		name, path    string
		follow, write bool
		want          string
		exists        bool
		code, reason  string
	}{
		{"follow to the secret", filepath.Join(ft.ok, "link"), true, false, ft.secret, true, "", ""},
		{"follow a directory link", filepath.Join(ft.ok, "dirlink", "secret"), true, false, ft.secret, true, "", ""},
		{"proc self root", "/proc/self/root" + ft.secret, true, false, ft.secret, true, "", ""},
		{"no follow", filepath.Join(ft.ok, "link"), false, false, "", false, wire.CodeRefused, wire.ReasonSymlink},
		{"write: new file through a directory link", filepath.Join(ft.ok, "dirlink", "new"), true, true, filepath.Join(ft.root, "new"), false, "", ""},
		{"write: last component never followed", filepath.Join(ft.ok, "link"), true, true, "", false, wire.CodeRefused, wire.ReasonSymlink},
		{"write: no follow", filepath.Join(ft.ok, "dirlink", "new"), false, true, "", false, wire.CodeRefused, wire.ReasonSymlink},
	}
	for _, tc := range tests {
		got, err := a.FileStat(ctx, tc.path, tc.follow, tc.write)
		if tc.code != "" {
			if msg := refusal(err, tc.code, tc.reason, "symlink"); msg != "" {
				t.Errorf("%s: FileStat = %+v, %v; %s", tc.name, got, err, msg)
			}
			continue
		}
		if err != nil || got.Path != tc.want || got.Exists != tc.exists {
			t.Errorf("%s: FileStat(%q) = %+v, %v; want path %q, exists %v", tc.name, tc.path, got, err, tc.want, tc.exists)
		}
	}
}

// TestFileCommandLine runs file write and read through Main, as the host does.
func TestFileCommandLine(t *testing.T) {
	ft := newFileTree(t)
	a := newFileAgent(t)
	p := filepath.Join(ft.ok, "cli")
	data := bytes.Repeat([]byte{0, 1, 2, 0xff}, 300<<10) // 1.2 MB, binary: more than one copy buffer
	var out bytes.Buffer
	code := a.Main(context.Background(), []string{"file", "write", "--path", p, "--size", "1228800"}, bytes.NewReader(data), &out)
	var w struct {
		OK     bool             `json:"ok"`
		Result wire.FileWritten `json:"result"`
	}
	if code != 0 || json.Unmarshal(out.Bytes(), &w) != nil || !w.OK || w.Result.Bytes != int64(len(data)) || w.Result.Mode != 0o644 {
		t.Fatalf("file write: exit %d, reply %s; want ok, %d bytes, mode 0644", code, out.Bytes(), len(data))
	}
	out.Reset()
	code = a.Main(context.Background(), []string{"file", "read", "--path", p, "--max-bytes", "1228800"}, strings.NewReader(""), &out)
	var r struct {
		OK     bool          `json:"ok"`
		Result wire.FileRead `json:"result"`
	}
	if code != 0 || json.Unmarshal(out.Bytes(), &r) != nil || !bytes.Equal(r.Result.Data, data) || r.Result.Truncated {
		t.Fatalf("file read: exit %d, %d bytes back, truncated %v; want the data whole", code, len(r.Result.Data), r.Result.Truncated)
	}
	// --raw: the reply's line, then the data as it is.
	out.Reset()
	code = a.Main(context.Background(), []string{"file", "read", "--path", p, "--max-bytes", "1000000", "--raw"}, strings.NewReader(""), &out)
	line, rest, _ := bytes.Cut(out.Bytes(), []byte("\n"))
	var rr struct {
		OK     bool          `json:"ok"`
		Result wire.FileRead `json:"result"`
	}
	if code != 0 || json.Unmarshal(line, &rr) != nil || !rr.OK || rr.Result.Bytes != 1000000 || !rr.Result.Truncated || len(rr.Result.Data) != 0 || !bytes.Equal(rest, data[:1000000]) {
		t.Fatalf("file read --raw: exit %d, reply %s, %d bytes after it; want 1000000 bytes of the data, truncated", code, line, len(rest))
	}
	for _, args := range [][]string{
		{"file", "write", "--path", p},                    // no --size
		{"file", "read", "--path", p, "--max-bytes", "0"}, // out of range
		{"file", "chmod", "--path", p},                    // unknown
		{"file", "stat", "--path", p, "--follow", "x"},    // unknown flag
	} {
		out.Reset()
		if code := a.Main(context.Background(), args, strings.NewReader(""), &out); code != 1 || !strings.Contains(out.String(), wire.CodeInvalid) {
			t.Errorf("Main(%q) = %d, %s; want exit 1, invalid_argument", args, code, out.Bytes())
		}
	}
}

// TestFileStagedWrite: data too large for stdin goes to a staging file of
// file stage; write --from copies it with the checks of any write and
// removes it, and takes nothing but a staging file.
func TestFileStagedWrite(t *testing.T) {
	ft := newFileTree(t)
	a := newFileAgent(t)
	ctx := context.Background()
	st, err := a.FileStage(ctx)
	if err != nil || filepath.Dir(st.Path) != a.xferDir() {
		t.Fatalf("FileStage = %+v, %v; want a file in %s", st, err, a.xferDir())
	}
	if fi, err := os.Stat(a.xferDir()); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("staging directory: %v, %v; want mode 0700", fi, err)
	}
	data := bytes.Repeat([]byte("staged "), 20000)
	if err := os.WriteFile(st.Path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	dest := filepath.Join(ft.ok, "staged")
	args := []string{"file", "write", "--path", dest, "--size", "140000", "--from", st.Path}
	if code := a.Main(ctx, args, strings.NewReader(""), &out); code != 0 {
		t.Fatalf("file write --from: exit %d, %s", code, out.Bytes())
	}
	if got, err := os.ReadFile(dest); err != nil || !bytes.Equal(got, data) {
		t.Errorf("destination holds %d bytes, %v; want the staged %d", len(got), err, len(data))
	}
	if _, err := os.Lstat(st.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("staging file after the write: %v; want it removed", err)
	}
	// Staged data over a symlink is refused like any write, and the staging file still goes.
	st2, _ := a.FileStage(ctx)
	os.WriteFile(st2.Path, []byte("pwned"), 0o600)
	out.Reset()
	if code := a.Main(ctx, []string{"file", "write", "--path", filepath.Join(ft.ok, "link"), "--size", "5", "--from", st2.Path}, strings.NewReader(""), &out); code != 1 || !strings.Contains(out.String(), wire.ReasonSymlink) {
		t.Errorf("staged write over a symlink: exit %d, %s; want a symlink refusal", code, out.Bytes())
	}
	ft.secretIntact(t)
	if _, err := os.Lstat(st2.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("staging file after a refused write: %v; want it removed", err)
	}
	for _, from := range []string{ft.secret, filepath.Join(a.xferDir(), "x-notastagingname"), a.xferDir() + "/../xfer/x-00000000000000000000000000000000"} {
		out.Reset()
		if code := a.Main(ctx, []string{"file", "write", "--path", filepath.Join(ft.ok, "y"), "--size", "10", "--from", from}, strings.NewReader(""), &out); code != 1 || !strings.Contains(out.String(), "not a staging file") {
			t.Errorf("write --from %s: exit %d, %s; want it refused as not a staging file", from, code, out.Bytes())
		}
	}
	ft.secretIntact(t)
}
