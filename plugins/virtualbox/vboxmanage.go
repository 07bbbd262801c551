package virtualbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmgate/vmgate/hypervisor"
)

// command builds VBoxManage with args, owned by the caller: SIGINT on
// cancel (VBoxManage then closes its guest session, which ends the guest
// process), SIGKILL after cancelGrace, SIGKILL if this process dies.
//
// The environment is the driver's with LC_ALL=C (VBoxManage's messages in
// English) and USER and LOGNAME set to the effective user: the Linux
// wrapper script warns on stdout when they are missing or differ
// (src/VBox/Installer/linux/VBox.sh), and XPCOM uses them to find VBoxSVC's
// socket.
func (d *Driver) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, d.bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = cancelGrace
	env := make([]string, 0, len(os.Environ())+3)
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LC_ALL", "USER", "LOGNAME":
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "LC_ALL=C")
	if d.user != "" {
		env = append(env, "USER="+d.user, "LOGNAME="+d.user)
	}
	cmd.Env = env
	return cmd
}

// result of one VBoxManage run that is not guestcontrol run.
type result struct {
	stdout, stderr []byte
	code           int
}

// vbox runs VBoxManage args to completion (output bounded), without the
// wrapper script's warnings on stdout.
func (d *Driver) vbox(ctx context.Context, args ...string) (result, error) {
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	cmd := d.command(ctx, args...)
	out := &capped{limit: 4 << 20}
	errb := &capped{limit: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, errb
	err := cmd.Run()
	r := result{}
	raw, _ := out.bytes()
	r.stdout = stripWrapperWarnings(raw)
	r.stderr, _ = errb.bytes()
	if err != nil {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return r, err
		}
		r.code = ee.ExitCode()
	}
	return r, nil
}

// vboxOK runs VBoxManage args and maps a failure.
func (d *Driver) vboxOK(ctx context.Context, op string, args ...string) error {
	r, err := d.vbox(ctx, args...)
	if err != nil {
		return ctxError(op, err)
	}
	if r.code != 0 {
		return vboxError(op, r)
	}
	return nil
}

// vboxVersion is what `VBoxManage --version` says.
type vboxVersion struct {
	major, minor, build int
	raw                 string
}

func (v vboxVersion) atLeast(major, minor int) bool {
	return v.major > major || (v.major == major && v.minor >= minor)
}

// versionLine is VBoxManage.cpp main's "%sr%u": VBOX_VERSION_STRING, which
// may carry a publisher suffix ("7.1.6_Ubuntu", "6.1.50_Debian") or a
// pre-release tag, then "r" and the revision.
var versionLine = regexp.MustCompile(`(?m)^([0-9]+)\.([0-9]+)\.([0-9]+)[^\s]*r[0-9]+\s*$`)

// parseVersion reads `VBoxManage --version` output.
func parseVersion(out []byte) (vboxVersion, error) {
	out = stripWrapperWarnings(out)
	m := versionLine.FindSubmatch(out)
	if m == nil {
		return vboxVersion{}, fmt.Errorf("unexpected VBoxManage --version output %q", bytes.TrimSpace(out))
	}
	v := vboxVersion{raw: string(bytes.TrimSpace(m[0]))}
	v.major, _ = strconv.Atoi(string(m[1]))
	v.minor, _ = strconv.Atoi(string(m[2]))
	v.build, _ = strconv.Atoi(string(m[3]))
	if v.major < 6 || (v.major == 6 && v.minor < 1) {
		return v, fmt.Errorf("VirtualBox %s is too old: guestcontrol run needs 6.1 or later", v.raw)
	}
	return v, nil
}

// version detects VirtualBox's version once (a failure is retried on the
// next call). The driver follows it: 7.0 and later print the image as
// argv[0] of run, 7.1 has run --cwd, the verbose text differs.
func (d *Driver) version(ctx context.Context) (vboxVersion, error) {
	d.mu.Lock()
	v, ok := d.ver, d.verOK
	d.mu.Unlock()
	if ok {
		return v, nil
	}
	r, err := d.vbox(ctx, "--version")
	if err != nil {
		return vboxVersion{}, ctxError("version", err)
	}
	if r.code != 0 {
		return vboxVersion{}, vboxError("version", r)
	}
	v, err = parseVersion(r.stdout)
	if err != nil {
		return vboxVersion{}, fmt.Errorf("virtualbox: version: %w", err)
	}
	d.mu.Lock()
	d.ver, d.verOK = v, true
	d.mu.Unlock()
	return v, nil
}

// Markers for errors the exec path refines.
var (
	// errControlNotReady: the session could not start because no guest
	// control client is connected in the guest (VBoxGuestControlSvc.cpp
	// hostProcessMessage answers VERR_NOT_FOUND): VBoxService is not
	// running yet, or runs without its control service.
	errControlNotReady = errors.New("the guest execution service is not ready")
	// errCwdUnsupported: the Guest Additions cannot set a working directory
	// (GuestSession::processCreateEx without VBOX_GUESTCTRL_GF_0_PROCESS_CWD).
	errCwdUnsupported = errors.New("the Guest Additions cannot set a working directory")
)

// vboxError turns VBoxManage's error lines into the hypervisor sentinels
// and plain words. An error that is VBoxManage's own reason wraps
// hypervisor.ErrBackend, so the agent sees it: VBoxManage reads the
// password from a file, so its messages hold no secret.
func vboxError(op string, r result) error {
	msg := errorText(r.stderr)
	has := func(s string) bool { return strings.Contains(msg, s) }
	switch {
	case has("VirtualBox COM server is not running"), has("Failed to create the VirtualBox object"):
		return fmt.Errorf("virtualbox: %s: %w: the VirtualBox service (VBoxSVC) cannot be reached; start VirtualBox or check its installation for this user: %s", op, hypervisor.ErrBackend, msg)
	case has("Could not find a registered machine"):
		return fmt.Errorf("virtualbox: %s: %w: %s", op, hypervisor.ErrUnknownVM, msg)
	case has("The guest execution service is not available"):
		return fmt.Errorf("virtualbox: %s: %w: the VM's guest control host service is missing (VERR_HGCM_SERVICE_NOT_FOUND: VirtualBox itself, not the guest, lacks it); restart the VM or repair the VirtualBox installation: %s", op, hypervisor.ErrBackend, msg)
	case has("The guest execution service is not ready"):
		return fmt.Errorf("virtualbox: %s: %w: %w: %s", op, hypervisor.ErrAgentUnavailable, errControlNotReady, msg)
	case has("Guest Additions are not installed or not ready"), has("Error starting guest session"):
		return fmt.Errorf("virtualbox: %s: %w: %s", op, hypervisor.ErrAgentUnavailable, msg)
	case has("was not able to logon"):
		return fmt.Errorf("virtualbox: %s: %w: the guest refused the logon (check the backend's username and password_file): %s", op, hypervisor.ErrBackend, msg)
	case has("Setting the current working directory is not supported"):
		return fmt.Errorf("virtualbox: %s: %w: %s", op, errCwdUnsupported, msg)
	case notRunning.MatchString(msg), has("VMM device is not available"):
		return fmt.Errorf("virtualbox: %s: %w: %s", op, hypervisor.ErrVMNotRunning, msg)
	case r.code == exitSyntax:
		return fmt.Errorf("virtualbox: %s: VBoxManage refused its arguments (exit 2): %s", op, msg)
	}
	if msg == "" {
		msg = "no message"
	}
	return fmt.Errorf("virtualbox: %s: %w: VBoxManage exit %d: %s", op, hypervisor.ErrBackend, r.code, msg)
}

// notRunning matches VBoxManage's two "machine not running" messages:
// gctlCtxInitVmSession's `Machine "x" is not running (currently ...)!` and
// handleControlVM's "Machine 'x' is not currently running.".
var notRunning = regexp.MustCompile(`^Machine ["'].*["'] is not (running \(currently [^)]*\)!|currently running\.)`)

// errorText returns VBoxManage's "error:" lines, without the prefix and
// without the Details and Context lines.
func errorText(stderr []byte) string {
	var msgs []string
	for _, line := range strings.Split(string(stderr), "\n") {
		if i := strings.Index(line, ": error: "); i >= 0 {
			m := strings.TrimSpace(line[i+len(": error: "):])
			if strings.HasPrefix(m, "Details: ") || strings.HasPrefix(m, "Context: ") {
				continue
			}
			msgs = append(msgs, m)
		}
	}
	if len(msgs) == 0 {
		return strings.TrimSpace(string(stderr))
	}
	for _, m := range msgs {
		if notRunning.MatchString(m) {
			return m
		}
	}
	return strings.Join(msgs, "; ")
}

func ctxError(op string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("virtualbox: %s: %w: %w", op, hypervisor.ErrTimeout, err)
	}
	return fmt.Errorf("virtualbox: %s: %w", op, err)
}

// stripWrapperWarnings drops the warnings the Linux wrapper script
// /usr/bin/VBoxManage prints on stdout before it runs VBoxManage
// (src/VBox/Installer/linux/VBox.sh), from the start of out.
func stripWrapperWarnings(out []byte) []byte {
	for {
		trimmed := false
		for _, w := range wrapperWarnings {
			if bytes.HasPrefix(out, []byte(w.head)) {
				end := bytes.Index(out, []byte(w.tail))
				if end < 0 {
					return out
				}
				out = out[end+len(w.tail):]
				trimmed = true
			}
		}
		if !trimmed {
			return out
		}
	}
}

// wrapperWarnings are VBox.sh's warnings: their first and last bytes (the
// kernel release inside one of them varies).
var wrapperWarnings = []struct{ head, tail string }{
	{"WARNING: The vboxdrv kernel module is not loaded.", "You will not be able to start VMs until this problem is fixed.\n"},
	{"WARNING: The character device /dev/vboxdrv does not exist.", "You will not be able to start VMs until this problem is fixed.\n"},
	{"WARNING: The compilation of the vboxdrv.ko kernel module failed", "Please consult the User Manual for build instructions.\n"},
	{"WARNING: Unable to detect effective user name.", "VirtualBox might run incorrectly.\n"},
	{"WARNING: Environment variable LOGNAME or USER does not correspond to effective user id.\n", "effective user id.\n"},
}

// wrapperFilter drops the wrapper's warnings from the start of a stream
// (run's stdout) and passes the rest on.
type wrapperFilter struct {
	next interface{ Write([]byte) (int, error) }
	head []byte
	done bool
}

// maxWrapperText bounds how much is held back looking for the warnings.
const maxWrapperText = 2048

func (w *wrapperFilter) Write(p []byte) (int, error) {
	if w.done {
		return w.next.Write(p)
	}
	w.head = append(w.head, p...)
	rest := stripWrapperWarnings(w.head)
	if len(rest) > 0 && !couldBeWarning(rest) || len(w.head) > maxWrapperText {
		w.done = true
		w.next.Write(rest)
		w.head = nil
	} else {
		w.head = append(w.head[:0], rest...)
	}
	return len(p), nil
}

// Close passes on what is held back.
func (w *wrapperFilter) Close() {
	if !w.done && len(w.head) > 0 {
		w.next.Write(w.head)
	}
	w.done, w.head = true, nil
}

// couldBeWarning reports whether p may still grow into a wrapper warning.
func couldBeWarning(p []byte) bool {
	for _, w := range wrapperWarnings {
		n := min(len(p), len(w.head))
		if bytes.Equal(p[:n], []byte(w.head[:n])) {
			return true
		}
	}
	return false
}
