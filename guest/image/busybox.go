package image

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// Busybox in the image: busybox-static's binary, the shell and every
// applet, with one fix.
//
// Debian's busybox-static (1:1.35.0-4 in bookworm) is built without
// FEATURE_WGET_TIMEOUT. wget's option string still has "T:+" (an integer
// argument) while its destination is then NULL (networking/wget.c:
// IF_NOT_FEATURE_WGET_TIMEOUT(NULL)), and getopt32 stores an integer
// argument without checking its destination (libbb/getopt32.c: PARAM_INT
// is written through on_off->optarg; a string argument is stored only when
// the destination is not NULL). So any `wget -T N` died of SIGSEGV before
// it did anything. Debian enabled the timeout in 1.36.1-5, after bookworm.
//
// A wrapper script cannot help: that busybox's ash runs applets before it
// searches PATH (FEATURE_SH_STANDALONE: ash.c find_command), so every
// `sh -c 'wget …'` reaches the applet. The image's copy of busybox has the
// fix upstream proposed for such builds instead: "T:" for "T:+", so -T takes
// a string argument that getopt32 ignores. wget then accepts -T and does
// without a timeout, as busybox's documentation says of builds without it.

// wgetOpts is wget's option string in busybox 1.35 up to "T:", and what
// follows the '+' the patch removes.
var (
	wgetOpts     = []byte("^cqSO:o:P:Y:U:T:")
	wgetOptsTail = []byte("+t:n::\x00")
)

// addBusybox puts busybox (patched when PatchBusyboxWget applies) at
// /bin/busybox and links every applet to it where tree has no file yet.
func addBusybox(ctx context.Context, tree map[string]*entry) error {
	bb, err := lookPath("busybox")
	if err != nil {
		return err
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return fmt.Errorf("busybox: %w", err)
	}
	if err := requireStatic(bb); err != nil {
		return err
	}
	source := bb
	patched, ok, err := PatchBusyboxWget(data)
	if err != nil {
		return err
	}
	if ok {
		if err := checkPatchedBusybox(ctx, patched); err != nil {
			return err
		}
		data, source = patched, bb+" (wget -T fixed: T:+ became T:)"
	}
	tree["/bin/busybox"] = &entry{typ: cpioTypeFile, perm: 0o755, data: data, source: source}
	out, err := exec.CommandContext(ctx, bb, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox --list-full: %w", exitDetail(err))
	}
	for _, l := range strings.Fields(string(out)) {
		p := "/" + strings.TrimPrefix(path.Clean(l), "/")
		if _, taken := tree[p]; taken || p == "/linuxrc" {
			continue
		}
		tree[p] = &entry{typ: cpioTypeSymlink, perm: 0o777, target: "/bin/busybox"}
	}
	return nil
}

// PatchBusyboxWget returns a copy of the busybox binary bin whose wget
// option string reads "T:" where it read "T:+" (see above), and true; bin
// itself and false when bin has no such string (another busybox, whose
// wget the image ships as it is). The string keeps its length: what
// followed the '+' moves up a byte and the literal ends in two NULs. A
// string found more than once is an error: the patch would be a guess.
func PatchBusyboxWget(bin []byte) ([]byte, bool, error) {
	needle := append(append([]byte{}, wgetOpts...), wgetOptsTail...)
	i := bytes.Index(bin, needle)
	if i < 0 {
		return bin, false, nil
	}
	if bytes.Index(bin[i+1:], needle) >= 0 {
		return nil, false, errors.New("busybox: wget's option string appears twice; not patching it")
	}
	// The literal runs on after the options' NUL (the complementary
	// options: "-1:\xfe--\xfb…") to its own NUL.
	start := i + len(wgetOpts) // the '+'
	end := bytes.IndexByte(bin[i+len(needle):], 0)
	if end < 0 {
		return nil, false, errors.New("busybox: wget's option string has no end")
	}
	end += i + len(needle) // the literal's NUL
	out := bytes.Clone(bin)
	copy(out[start:end], bin[start+1:end+1])
	out[end] = 0
	return out, true, nil
}

// checkPatchedBusybox runs the patched binary's `wget -T 1` (no URL: it
// parses the options, then prints its usage and exits 1) and refuses a
// binary that a signal ends, or that says anything but wget's usage.
func checkPatchedBusybox(ctx context.Context, bin []byte) error {
	dir, err := os.MkdirTemp("", "vmgate-busybox-")
	if err != nil {
		return fmt.Errorf("busybox: %w", err)
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "busybox")
	if err := os.WriteFile(p, bin, 0o700); err != nil {
		return fmt.Errorf("busybox: %w", err)
	}
	cmd := exec.CommandContext(ctx, p, "wget", "-T", "1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("busybox with wget -T fixed: wget -T 1 = %v; want its usage and exit 1", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Errorf("busybox with wget -T fixed: wget -T 1 died of %v", ws.Signal())
	}
	if ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "Usage: wget") {
		return fmt.Errorf("busybox with wget -T fixed: wget -T 1 = exit %d, %q; want its usage and exit 1", ee.ExitCode(), stderr.String())
	}
	return nil
}

// requireStatic refuses a dynamically linked busybox: the image ships
// busybox-static's binary without libraries.
func requireStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("busybox: %w", err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("busybox %s is dynamically linked; install busybox-static", p)
		}
	}
	return nil
}
