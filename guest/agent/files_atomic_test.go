//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// leftovers lists the temporary files in dir.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// bothTemps runs f with unnamed (O_TMPFILE) and named temporary files.
func bothTemps(t *testing.T, f func(t *testing.T, named bool)) {
	for _, named := range []bool{false, true} {
		t.Run(map[bool]string{false: "tmpfile", true: "named"}[named], func(t *testing.T) { f(t, named) })
	}
}

// TestFileWriteAtomicFailures: every failure a whole-file write can meet
// leaves the old file exactly as it was (content, mode, owner) and no
// temporary file behind.
func TestFileWriteAtomicFailures(t *testing.T) {
	errFault := errors.New("injected fault")
	bothTemps(t, func(t *testing.T, named bool) {
		ft := newFileTree(t)
		a := newFileAgent(t)
		p := filepath.Join(ft.ok, "plain")
		if err := os.Chown(p, 1234, 5678); err != nil {
			t.Fatal(err)
		}
		oldSum := sha([]byte("plain"))
		tests := []struct {
			name   string
			faults fileFaults
			o      FileWriteOptions
			data   io.Reader
			code   string // "" any error
			want   string
		}{
			{"short data", fileFaults{}, FileWriteOptions{Mode: -1, Size: 10}, strings.NewReader("new"), wire.CodeInvalid, "got 3 bytes"},
			{"long data", fileFaults{}, FileWriteOptions{Mode: -1, Size: 2}, strings.NewReader("new"), wire.CodeInvalid, "more data"},
			{"fsync fails", fileFaults{fsync: func(w string) error {
				if w == "file" {
					return errFault
				}
				return nil
			}}, FileWriteOptions{Mode: -1, Size: 3}, strings.NewReader("new"), "", "injected fault"},
			{"rename fails", fileFaults{rename: func() error { return errFault }}, FileWriteOptions{Mode: -1, Size: 3}, strings.NewReader("new"), "", "injected fault"},
			{"expect_sha256 differs", fileFaults{}, FileWriteOptions{Mode: -1, Size: 3, ExpectSHA256: sha([]byte("other"))}, strings.NewReader("new"), wire.CodeRefused, "changed"},
			{"data fails half-way", fileFaults{}, FileWriteOptions{Mode: -1, Size: 6}, io.MultiReader(strings.NewReader("new"), errReader{}), "", "read failed"},
		}
		for _, tc := range tests {
			tc.faults.noTmpfile = named
			a.faults = tc.faults
			_, err := a.FileWrite(context.Background(), p, tc.o, tc.data)
			var we *wire.Error
			if err == nil || !strings.Contains(err.Error(), tc.want) || tc.code != "" && (!errors.As(err, &we) || we.Code != tc.code) {
				t.Errorf("%s: FileWrite = %v; want an error (%s) saying %q", tc.name, err, tc.code, tc.want)
			}
			b, _ := os.ReadFile(p)
			st, _ := os.Stat(p)
			sys := st.Sys().(*syscall.Stat_t)
			if string(b) != "plain" || st.Mode().Perm() != 0o640 || sys.Uid != 1234 || sys.Gid != 5678 || sha(b) != oldSum {
				t.Errorf("%s: old file after the failure = %q, %v, %d:%d; want plain, 0640, 1234:5678", tc.name, b, st.Mode(), sys.Uid, sys.Gid)
			}
			if l := leftovers(t, ft.ok); len(l) != 0 {
				t.Errorf("%s: temporary files left: %v", tc.name, l)
			}
		}
		// A new file that fails leaves nothing under its name either.
		a.faults = fileFaults{noTmpfile: named, rename: func() error { return errFault }}
		if _, err := a.FileWrite(context.Background(), filepath.Join(ft.ok, "new"), FileWriteOptions{Mode: -1, CreateMode: 0o644, Size: 3}, strings.NewReader("new")); err == nil {
			t.Errorf("FileWrite(new) with a failing link = nil; want the fault")
		}
		if _, err := os.Lstat(filepath.Join(ft.ok, "new")); !os.IsNotExist(err) || len(leftovers(t, ft.ok)) != 0 {
			t.Errorf("failed new file: %v, leftovers %v; want nothing", err, leftovers(t, ft.ok))
		}
	})
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("read failed") }

// TestFileWriteAtomicKeeps: a replaced file keeps its owner, group and
// mode (unless a mode is given), the new content arrives whole, and the
// reply says the write was atomic.
func TestFileWriteAtomicKeeps(t *testing.T) {
	bothTemps(t, func(t *testing.T, named bool) {
		ft := newFileTree(t)
		a := newFileAgent(t)
		a.faults.noTmpfile = named
		p := filepath.Join(ft.ok, "plain")
		if err := os.Chown(p, 1234, 5678); err != nil {
			t.Fatal(err)
		}
		before, _ := os.Stat(p)
		data := patterned(700_000)
		got, err := a.FileWrite(context.Background(), p, FileWriteOptions{Mode: -1, Size: int64(len(data)), Hash: true}, bytes.NewReader(data))
		if err != nil || !got.Atomic || got.Created || got.SHA256 != sha(data) || got.Mode != 0o640 {
			t.Fatalf("FileWrite = %+v, %v; want atomic, replaced, mode 0640, the data's hash", got, err)
		}
		after, _ := os.Stat(p)
		sys := after.Sys().(*syscall.Stat_t)
		if b, _ := os.ReadFile(p); !bytes.Equal(b, data) || sys.Uid != 1234 || sys.Gid != 5678 || after.Mode().Perm() != 0o640 {
			t.Errorf("file after = %d bytes, %d:%d, %v; want the data, 1234:5678, 0640", len(b), sys.Uid, sys.Gid, after.Mode())
		}
		if os.SameFile(before, after) {
			t.Errorf("the file is the same inode; want it replaced by a new one")
		}
		m := int64(0o600)
		if got, err := a.FileWrite(context.Background(), p, FileWriteOptions{Mode: m, Size: 1}, strings.NewReader("x")); err != nil || got.Mode != 0o600 {
			t.Errorf("FileWrite with mode 0600 = %+v, %v", got, err)
		}
		if l := leftovers(t, ft.ok); len(l) != 0 {
			t.Errorf("temporary files left: %v", l)
		}
	})
}

// TestFileWriteRaces: a file that appears while a new one is written is
// not replaced; with expect_sha256, a file changed between the check and
// the rename is not replaced; a second vmgate write waits for the first.
func TestFileWriteRaces(t *testing.T) {
	bothTemps(t, func(t *testing.T, named bool) {
		ft := newFileTree(t)
		a := newFileAgent(t)
		ctx := context.Background()
		// Appears meanwhile.
		p := filepath.Join(ft.ok, "late")
		a.faults = fileFaults{noTmpfile: named, rename: func() error { return os.WriteFile(p, []byte("theirs"), 0o600) }}
		_, err := a.FileWrite(ctx, p, FileWriteOptions{Mode: -1, CreateMode: 0o644, Size: 4}, strings.NewReader("mine"))
		if msg := refusal(err, wire.CodeExists, "", "appeared"); msg != "" {
			t.Errorf("FileWrite over a file that appeared = %v; %s", err, msg)
		}
		if b, _ := os.ReadFile(p); string(b) != "theirs" {
			t.Errorf("the file that appeared holds %q; want theirs", b)
		}
		// Changed between the check and the rename.
		plain := filepath.Join(ft.ok, "plain")
		a.faults = fileFaults{noTmpfile: named, rename: func() error {
			f, err := os.OpenFile(plain, os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				f.WriteString(" and more")
				f.Close()
			}
			return err
		}}
		_, err = a.FileWrite(ctx, plain, FileWriteOptions{Mode: -1, Size: 3, ExpectSHA256: sha([]byte("plain"))}, strings.NewReader("new"))
		if msg := refusal(err, wire.CodeRefused, wire.ReasonChanged, "changed while"); msg != "" {
			t.Errorf("FileWrite of a file changed meanwhile = %v; %s", err, msg)
		}
		if b, _ := os.ReadFile(plain); string(b) != "plain and more" {
			t.Errorf("changed file holds %q; want the other writer's content", b)
		}
		// Matching expect_sha256 goes through.
		a.faults = fileFaults{noTmpfile: named}
		if got, err := a.FileWrite(ctx, plain, FileWriteOptions{Mode: -1, Size: 3, ExpectSHA256: sha([]byte("plain and more"))}, strings.NewReader("new")); err != nil || got.Bytes != 3 {
			t.Errorf("FileWrite with the right expect_sha256 = %+v, %v", got, err)
		}
		// expect_sha256 of a missing file.
		if _, err := a.FileWrite(ctx, filepath.Join(ft.ok, "none"), FileWriteOptions{Mode: -1, Size: 1, ExpectSHA256: sha(nil)}, strings.NewReader("x")); !isCode(err, wire.CodeNotFound) {
			t.Errorf("expect_sha256 on a missing file = %v; want not found", err)
		}
		// Another write holds the file: this one waits, here until its context ends.
		f, _ := os.Open(plain)
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if _, err := a.FileWrite(cctx, plain, FileWriteOptions{Mode: -1, Size: 1}, strings.NewReader("y")); err == nil || !strings.Contains(err.Error(), "another write") {
			t.Errorf("FileWrite of a locked file = %v; want it to wait for the other write", err)
		}
		if b, _ := os.ReadFile(plain); string(b) != "new" {
			t.Errorf("locked file holds %q; want new", b)
		}
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		if l := leftovers(t, ft.ok); len(l) != 0 {
			t.Errorf("temporary files left: %v", l)
		}
	})
}

// TestCleanTemps removes only what a killed write of this user left:
// recognisable names, regular files with one link, unlocked, old enough.
func TestCleanTemps(t *testing.T) {
	ft := newFileTree(t)
	a := newFileAgent(t)
	dir := ft.ok
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("tmp"), 0o600); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-time.Hour)
		os.Chtimes(p, old, old)
		return p
	}
	stale := mk(tempPrefix + "0123456789abcdef")
	other := mk(tempPrefix + "0123456789abcdeg") // not hex
	notOurs := mk(tempPrefix + "1111111111111111")
	os.Chown(notOurs, 1234, 1234)
	linked := mk(tempPrefix + "2222222222222222")
	os.Link(linked, filepath.Join(dir, "second-name"))
	locked := mk(tempPrefix + "3333333333333333")
	lf, _ := os.Open(locked)
	defer lf.Close()
	unix.Flock(int(lf.Fd()), unix.LOCK_EX)
	young := filepath.Join(dir, tempPrefix+"4444444444444444")
	os.WriteFile(young, []byte("tmp"), 0o600)
	os.Symlink(ft.secret, filepath.Join(dir, tempPrefix+"5555555555555555"))
	os.Mkdir(filepath.Join(dir, tempPrefix+"6666666666666666"), 0o700)

	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	a.cleanTemps(dfd)
	got := leftovers(t, dir)
	want := []string{filepath.Base(other), filepath.Base(notOurs), filepath.Base(linked), filepath.Base(locked), filepath.Base(young), tempPrefix + "5555555555555555", tempPrefix + "6666666666666666"}
	if _, err := os.Lstat(stale); !os.IsNotExist(err) || strings.Join(got, " ") != strings.Join(sortedCopy(want), " ") {
		t.Errorf("after cleanTemps: stale %v, left %v; want stale gone and %v kept", err, got, sortedCopy(want))
	}
	ft.secretIntact(t)
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if c[j] < c[i] {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

// TestGuestProcess is vmgate-guest for TestFileWriteKilled: it runs only
// in the child that test starts.
func TestGuestProcess(t *testing.T) {
	if os.Getenv("VMGATE_GUEST_PROCESS") == "" {
		return
	}
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv("VMGATE_GUEST_ARGS")), &args); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Root: os.Getenv("VMGATE_GUEST_ROOT")})
	if err != nil {
		t.Fatal(err)
	}
	a.faults.noTmpfile = os.Getenv("VMGATE_GUEST_NAMED") != ""
	os.Exit(a.Main(context.Background(), args, os.Stdin, os.Stdout))
}

// TestFileWriteKilled kills vmgate-guest half-way through a whole-file
// write: the old file is intact; an unnamed temporary file leaves nothing,
// a named one is left and the next write in that directory removes it.
func TestFileWriteKilled(t *testing.T) {
	bothTemps(t, func(t *testing.T, named bool) {
		ft := newFileTree(t)
		p := filepath.Join(ft.ok, "plain")
		const size = 8 << 20
		args, _ := json.Marshal([]string{"file", "write", "--path", p, "--size", strconv.Itoa(size)})
		cmd := exec.Command(os.Args[0], "-test.run=^TestGuestProcess$")
		cmd.Env = append(os.Environ(), "VMGATE_GUEST_PROCESS=1", "VMGATE_GUEST_ROOT="+t.TempDir(), "VMGATE_GUEST_ARGS="+string(args))
		if named {
			cmd.Env = append(cmd.Env, "VMGATE_GUEST_NAMED=1")
		}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// Half the data: the pipe holds 64 KiB, so the child has read (and
		// written to its temporary file) most of it when this returns.
		if _, err := stdin.Write(patterned(size / 2)); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the temporary file", func() bool { return tempOpen(cmd.Process.Pid, ft.ok, named) })
		cmd.Process.Kill()
		<-done
		if b, _ := os.ReadFile(p); string(b) != "plain" {
			t.Errorf("old file after the kill = %q; want plain", b)
		}
		l := leftovers(t, ft.ok)
		if !named && len(l) != 0 || named && len(l) != 1 {
			t.Fatalf("temporary files after the kill: %v; want %d", l, map[bool]int{false: 0, true: 1}[named])
		}
		if !named {
			return
		}
		// The next write in the directory removes the dead writer's file.
		a := newFileAgent(t)
		a.faults = fileFaults{noTmpfile: true, tempAge: time.Nanosecond}
		if _, err := a.FileWrite(context.Background(), filepath.Join(ft.ok, "next"), FileWriteOptions{Mode: -1, CreateMode: 0o644, Size: 1}, strings.NewReader("n")); err != nil {
			t.Fatal(err)
		}
		if l := leftovers(t, ft.ok); len(l) != 0 {
			t.Errorf("temporary files after the next write: %v; want none", l)
		}
		if b, _ := os.ReadFile(p); string(b) != "plain" {
			t.Errorf("old file after the next write = %q; want plain", b)
		}
	})
}

// tempOpen reports whether process pid has a temporary file of dir open
// with data in it.
func tempOpen(pid int, dir string, named bool) bool {
	fds, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	for _, fd := range fds {
		target, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name())
		if err != nil || !strings.HasPrefix(target, dir+"/") {
			continue
		}
		name := strings.TrimPrefix(target, dir+"/")
		if named && strings.HasPrefix(name, tempPrefix) || !named && strings.HasPrefix(name, "#") {
			var st unix.Stat_t
			if unix.Stat("/proc/"+strconv.Itoa(pid)+"/fd/"+fd.Name(), &st) == nil && st.Size > 0 {
				return true
			}
		}
	}
	return false
}

// waitUntil polls cond until it holds (or fails the test after a minute).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
