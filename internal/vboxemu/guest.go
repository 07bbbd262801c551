package vboxemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
)

// guest is the lab VM behind a machine, reached through its QEMU guest
// agent, standing in for VBoxService.
type guest struct {
	agent qga.Agent
}

// perCall is a qga.Caller that connects for each call and disconnects
// after: QEMU's agent socket takes one client at a time and several
// emulator processes share it (a run, the driver's kill of its process
// tree, a listing), as VBoxService serves several sessions. Calls of all
// emulator processes to one socket are serialised with a flock.
type perCall struct{ socket, lock string }

func (p perCall) Call(ctx context.Context, command string, args, result any) error {
	f, err := os.OpenFile(p.lock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	c := qga.New(p.socket, qga.WithCallTimeout(30*time.Second))
	defer c.Close()
	return c.Call(ctx, command, args, result)
}

func newGuest(h host, m *Machine) *guest {
	lock := filepath.Join(filepath.Dir(h.path), "qga.lock-"+m.UUID)
	return &guest{agent: qga.Agent{Caller: perCall{socket: m.QGASocket, lock: lock}}}
}

func (g *guest) ping(ctx context.Context) error { return g.agent.Ping(ctx) }

// controlService reports whether the guest's VBoxService has its control
// service connected: the emulated guest has it when qemu-ga has guest-exec
// enabled (a qemu-ga with guest-exec blocked stands for VBoxService
// --disable-control).
func (g *guest) controlService(ctx context.Context) (bool, error) {
	info, err := g.agent.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.Enabled("guest-exec") && info.Enabled("guest-exec-status"), nil
}

// launchScript runs the image with VBoxService's process set-up that
// guest-exec lacks: "$1" the working directory (empty: none), "$2" argv[0],
// the rest the image and its arguments. exec keeps the pid, so the process
// VBoxManage reports is the image's own. Environment changes go through
// env(1) in front of it.
const launchScript = `d=$1; a0=$2; shift 2
if [ -n "$d" ]; then cd -- "$d" || exit 127; fi
exec -a "$a0" "$@"`

// procSpec is a process as ProcessCreate hands it to VBoxService.
type procSpec struct {
	image string
	argv  []string // argv[0] first
	env   []string // putenv-style changes: NAME=VALUE sets, NAME unsets
	cwd   string
}

// errImageNotFound is VERR_FILE_NOT_FOUND from VBoxService's RTProcCreateEx.
var errImageNotFound = errors.New("image not found")

// start starts p in the guest and returns its pid (VBoxServiceControlProcess.cpp
// vgsvcGstCtrlProcessCreateProcess: RTProcCreateEx with the image, argv,
// the environment with the changes applied, and the working directory).
func (g *guest) start(ctx context.Context, p procSpec) (int64, error) {
	direct := len(p.argv) > 0 && p.argv[0] == p.image && len(p.env) == 0 && p.cwd == ""
	if direct {
		pid, err := g.agent.ExecStart(ctx, qga.ExecRequest{Path: p.image, Args: p.argv[1:]})
		return pid, notFound(err)
	}
	if strings.HasPrefix(p.image, "/") && !g.exists(ctx, p.image) {
		return 0, errImageNotFound
	}
	a0 := p.image
	if len(p.argv) > 0 {
		a0 = p.argv[0]
	}
	var args []string
	if len(p.env) > 0 {
		for _, kv := range p.env {
			if k, _, ok := strings.Cut(kv, "="); ok && k != "" {
				args = append(args, kv)
			} else {
				args = append([]string{"-u", kv}, args...)
			}
		}
		args = append(args, "/bin/sh")
	}
	args = append(args, "-c", launchScript, "vboxservice", p.cwd, a0, p.image)
	if len(p.argv) > 1 {
		args = append(args, p.argv[1:]...)
	}
	path := "/bin/sh"
	if len(p.env) > 0 {
		path = "/usr/bin/env"
	}
	pid, err := g.agent.ExecStart(ctx, qga.ExecRequest{Path: path, Args: args})
	return pid, notFound(err)
}

// notFound maps qemu-ga's failure to spawn a missing image to
// errImageNotFound.
func notFound(err error) error {
	var qe *qga.Error
	if errors.As(err, &qe) && strings.Contains(qe.Desc, "No such file or directory") {
		return errImageNotFound
	}
	return err
}

// exists reports whether the guest can open path for reading.
func (g *guest) exists(ctx context.Context, path string) bool {
	_, _, err := g.agent.FileRead(ctx, path, 1)
	var qe *qga.Error
	if errors.As(err, &qe) && strings.Contains(qe.Desc, "Is a directory") {
		return true
	}
	return err == nil
}

// fsType is IGuestSession::FsObjQueryInfo's type of path: "file",
// "directory", "other", or "" when the path does not exist.
func (g *guest) fsType(ctx context.Context, path string) (string, error) {
	st, err := g.agent.Exec(ctx, qga.ExecRequest{Path: "/bin/sh", Args: []string{"-c",
		`if [ -d "$1" ]; then echo directory; elif [ -f "$1" ]; then echo file; elif [ -e "$1" ]; then echo other; fi`, "sh", path},
		MaxOutputBytes: 64})
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(st.Stdout)), nil
}

func (g *guest) status(ctx context.Context, pid int64) (qga.ExecStatus, error) {
	return g.agent.ExecStatus(ctx, pid, qga.AgentOutputLimit)
}

// terminate is RTProcTerminate of VBoxService: SIGKILL to the process
// itself, not its children.
func (g *guest) terminate(ctx context.Context, pid int64) error { return g.agent.Kill(ctx, pid) }

func (g *guest) readFile(ctx context.Context, path string, max int64) ([]byte, bool, error) {
	return g.agent.FileRead(ctx, path, max)
}

func (g *guest) writeFile(ctx context.Context, path string, data []byte, mode uint32) error {
	return g.agent.FileWrite(ctx, path, data, mode)
}

func (g *guest) interfaces(ctx context.Context) ([]qga.NetworkInterface, error) {
	return g.agent.NetworkInterfaces(ctx)
}
