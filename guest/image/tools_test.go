package image_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/image"
	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

func TestMain(m *testing.M) {
	os.Exit(labtest.Main(m, lab.Spec{Name: "tools"}))
}

// busybox is the host's static busybox, which the image ships; the
// scripts run under it as they do in the guest.
func busybox(t *testing.T) string {
	t.Helper()
	requireTools(t)
	const p = "/bin/busybox" // where the scripts call it, in the guest and here
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: %v (Debian package busybox-static)", p, err)
	}
	return p
}

// scriptPath is the absolute path of a script of rootfs/.
func scriptPath(t *testing.T, name string) string {
	p, err := filepath.Abs(filepath.Join("rootfs", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// patchedBusybox writes the host busybox with PatchBusyboxWget applied
// to a file of its own and returns its path.
func patchedBusybox(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(busybox(t))
	if err != nil {
		t.Fatal(err)
	}
	patched, ok, err := image.PatchBusyboxWget(raw)
	if err != nil || !ok {
		t.Fatalf("PatchBusyboxWget(%s) = %v, %v; want the Debian busybox-static it is written for patched", busybox(t), ok, err)
	}
	if len(patched) != len(raw) || bytes.Equal(patched, raw) {
		t.Fatalf("PatchBusyboxWget: %d bytes from %d, equal %v; want a changed binary of the same size", len(patched), len(raw), bytes.Equal(patched, raw))
	}
	p := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(p, patched, 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// run runs bin with args and no proxy in the environment, and returns
// its exit status (-1 with the signal when one ended it), stdout and
// stderr. A run longer than a minute fails the test.
func run(t *testing.T, dir, bin string, args ...string) (code int, sig syscall.Signal, stdout, stderr string) {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
	cmd.Dir = dir
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %q did not end within a minute", bin, args)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -1, ws.Signal(), o.String(), e.String()
		}
		return ee.ExitCode(), 0, o.String(), e.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, 0, o.String(), e.String()
}

// TestBusyboxWgetPatch: Debian's busybox wget dies of SIGSEGV on any -T
// (issue 32, item 14); the image's patched copy accepts -T in every
// spelling busybox knows (-T N, -TN, in a cluster), ignores it, and
// otherwise downloads as before; the rest of busybox is unchanged.
func TestBusyboxWgetPatch(t *testing.T) {
	bb, fixed := busybox(t), patchedBusybox(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "path=%s agent=%s\n", r.URL.Path, r.UserAgent())
	}))
	defer srv.Close()
	closed := closedPort(t)
	dir := t.TempDir()

	// The cause, as the host's own busybox shows it.
	if code, sig, _, _ := run(t, dir, bb, "wget", "-T", "1"); sig != syscall.SIGSEGV {
		t.Logf("host busybox wget -T 1 = exit %d, signal %v: this busybox no longer crashes there", code, sig)
	}
	tests := []struct {
		args   []string
		code   int
		stdout string // a substring of stdout
		stderr string // a substring of stderr
	}{
		{args: []string{"wget", "-T", "1"}, code: 1, stderr: "Usage: wget"},
		{args: []string{"wget", "-T", "2", "-O-", "http://" + closed + "/"}, code: 1, stderr: "Connection refused"},
		{args: []string{"wget", "-T2", "-O-", srv.URL + "/a"}, stdout: "path=/a agent=Wget"},
		{args: []string{"wget", "-qT5", "-U", "my agent", "-O-", srv.URL + "/b"}, stdout: "path=/b agent=my agent"},
		{args: []string{"wget", "-qO-", "-T", "5", srv.URL + "/c"}, stdout: "path=/c"},
		// --timeout is a long option only in builds with the timeout.
		{args: []string{"wget", "--timeout=5", "-qO-", srv.URL + "/d"}, code: 1, stderr: "unrecognized option '--timeout=5'"},
		{args: []string{"wget", "-q", "-t", "3", "-O-", srv.URL + "/e"}, stdout: "path=/e"},
		{args: []string{"wget", "-q", "--header", "X-A: b", "-O-", srv.URL + "/f"}, stdout: "path=/f"},
	}
	for _, tt := range tests {
		code, sig, stdout, stderr := run(t, dir, fixed, tt.args...)
		if sig != 0 || code != tt.code || !strings.Contains(stdout, tt.stdout) || !strings.Contains(stderr, tt.stderr) {
			t.Errorf("patched busybox %q = exit %d, signal %v, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
				tt.args, code, sig, stdout, stderr, tt.code, tt.stdout, tt.stderr)
		}
	}
	_, _, want, _ := run(t, dir, bb, "--list-full")
	if _, _, got, _ := run(t, dir, fixed, "--list-full"); got != want || !strings.Contains(got, "usr/bin/wget\n") {
		t.Errorf("patched busybox --list-full differs from the original's (or lacks wget):\n%s", got)
	}
}

// TestPatchBusyboxWgetOther: a binary without wget's 1.35 option string is
// left alone; one with it twice is refused.
func TestPatchBusyboxWgetOther(t *testing.T) {
	other := []byte("\x7fELF not busybox ^cqSO:o:P:Y:U:T:t:n::\x00-1\x00")
	if got, ok, err := image.PatchBusyboxWget(other); err != nil || ok || !bytes.Equal(got, other) {
		t.Errorf("PatchBusyboxWget(a binary without the string) = %q, %v, %v; want it unchanged, false", got, ok, err)
	}
	opts := "^cqSO:o:P:Y:U:T:+t:n::\x00-1:\xfe--\xfb\x00"
	if _, _, err := image.PatchBusyboxWget([]byte("a" + opts + "b" + opts)); err == nil {
		t.Errorf("PatchBusyboxWget(the string twice) = nil error; want a refusal")
	}
	got, ok, err := image.PatchBusyboxWget([]byte("a" + opts + "next\x00"))
	if want := "a^cqSO:o:P:Y:U:T:t:n::\x00-1:\xfe--\xfb\x00\x00next\x00"; err != nil || !ok || string(got) != want {
		t.Errorf("PatchBusyboxWget = %q, %v, %v; want %q", got, ok, err, want)
	}
}

// TestNohupScript: the image's nohup runs its command with SIGHUP
// ignored, passes its arguments whole, and says 127 for a command that
// is not there.
func TestNohupScript(t *testing.T) {
	dir := t.TempDir()
	bb, nohup := busybox(t), scriptPath(t, "nohup")
	code, sig, stdout, stderr := run(t, dir, bb, "sh", nohup, "sh", "-c", `kill -HUP $$; echo "survived $1"`, "sh", "a b")
	if code != 0 || sig != 0 || stdout != "survived a b\n" {
		t.Errorf("nohup sh -c 'kill -HUP $$; …' = exit %d, signal %v, stdout %q, stderr %q; want exit 0, %q", code, sig, stdout, stderr, "survived a b\n")
	}
	if code, _, _, stderr := run(t, dir, bb, "sh", nohup, "/nonexistent/cmd"); code != 127 {
		t.Errorf("nohup /nonexistent/cmd = exit %d (stderr %q); want 127", code, stderr)
	}
	if code, _, _, stderr := run(t, dir, bb, "sh", nohup); code != 127 || !strings.Contains(stderr, "Usage") {
		t.Errorf("nohup = exit %d, stderr %q; want 127 and the usage", code, stderr)
	}
}

// TestLabGuestTools: in a lab guest, wget -T no longer crashes (through the
// shell, which runs the applet, and through PATH), a download with -T
// works, and nohup is there.
func TestLabGuestTools(t *testing.T) {
	vm := labtest.VM(t, "tools")
	c := qga.New(vm.QGASocket)
	defer c.Close()
	agent := qga.Agent{Caller: c}
	ctx, cancel := testload.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sh := func(script string) qga.ExecStatus {
		t.Helper()
		st, err := agent.Exec(ctx, qga.ExecRequest{Path: "/bin/sh", Args: []string{"-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return st
	}
	st := sh("wget -T 2 -O- http://127.0.0.1:1/; /usr/bin/wget -T 2 -O- http://127.0.0.1:1/")
	if st.Signal != 0 || st.ExitCode != 1 || strings.Count(string(st.Stderr), "Connection refused") != 2 {
		t.Errorf("wget -T 2 to a closed port in the guest (the applet, then through PATH) = exit %d, signal %d, stderr %q; want exit 1, connection refused twice", st.ExitCode, st.Signal, st.Stderr)
	}
	st = sh("mkdir -p /tmp/www && echo served >/tmp/www/f && httpd -p 127.0.0.1:8080 -h /tmp/www && wget -q -T 5 -O- http://127.0.0.1:8080/f")
	if st.ExitCode != 0 || string(st.Stdout) != "served\n" {
		t.Errorf("wget -T 5 of a page in the guest = exit %d, stdout %q, stderr %q; want %q", st.ExitCode, st.Stdout, st.Stderr, "served\n")
	}
	st = sh(`cd /tmp && nohup sh -c 'kill -HUP $$; echo still here'`)
	if st.ExitCode != 0 || string(st.Stdout) != "still here\n" {
		t.Errorf("nohup in the guest = exit %d, signal %d, stdout %q, stderr %q; want %q", st.ExitCode, st.Signal, st.Stdout, st.Stderr, "still here\n")
	}
}
