package pveemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/qmp"
)

// Machine is the real QEMU process behind an emulated VM: what qemu-server
// reaches through the VM's pid file, its QMP socket and its guest agent
// socket. The emulator serialises the calls it makes on one Machine.
type Machine interface {
	// PID is the running QEMU's pid, 0 when it is not running
	// (PVE::QemuServer::Helpers::vm_running_locally reads the pid file
	// and checks the process).
	PID() int
	// AgentSocket is the path of the guest agent's socket.
	AgentSocket() string
	// QMP runs one monitor command and returns its "return" value.
	QMP(ctx context.Context, command string, args any) (json.RawMessage, error)
	// Launch starts QEMU (PVE::QemuServer::vm_start_nolock) and returns once
	// its monitor answers; the guest boots afterwards.
	Launch(ctx context.Context) error
	// Signal sends sig to the running QEMU.
	Signal(sig syscall.Signal) error
	// Close ends a QEMU this Machine launched itself; one it was handed
	// is left to its owner.
	Close() error
}

// Snapshotter is an optional capability of a Machine: internal snapshots of
// the whole VM state (RAM included) through QMP's snapshot-save,
// snapshot-load and snapshot-delete jobs.
type Snapshotter interface {
	SaveState(ctx context.Context, tag string) error
	LoadState(ctx context.Context, tag string) error
	DeleteState(ctx context.Context, tag string) error
}

// LabMachine is a lab VM (package lab) as a Machine. It is handed a running
// VM; once that QEMU has exited, Launch runs the same QEMU command line
// again as a child of this process (Setpgid, SIGKILL when this process
// dies), which Close ends.
type LabMachine struct {
	argv    []string
	qmpSock string
	qgaSock string
	dir     string
	// vncSock and serialSock are the lab VM's VNC server and serial
	// console (console.go).
	vncSock, serialSock string

	// mu guards pid, cmd and done.
	mu   sync.Mutex
	pid  int       // the QEMU this machine knows of (handed or launched)
	cmd  *exec.Cmd // the QEMU Launch started, nil before
	done chan struct{}
}

var (
	_ Machine     = (*LabMachine)(nil)
	_ Snapshotter = (*LabMachine)(nil)
)

// NewLabMachine wraps a running lab VM.
func NewLabMachine(v *lab.VM) *LabMachine {
	argv := slices.DeleteFunc(slices.Clone(v.Argv), func(s string) bool { return s == "-daemonize" })
	return &LabMachine{argv: argv, qmpSock: v.QMPSocket, qgaSock: v.QGASocket, dir: v.Dir, pid: v.PID,
		vncSock: v.VNCSocket, serialSock: v.ConsoleSocket}
}

// VNCSocket is the lab VM's VNC server (-vnc unix:PATH,password=on).
func (m *LabMachine) VNCSocket() string { return m.vncSock }

// SerialSocket is the lab VM's serial console (its socket chardev).
func (m *LabMachine) SerialSocket() string { return m.serialSock }

// AgentSocket implements Machine.
func (m *LabMachine) AgentSocket() string { return m.qgaSock }

// PID implements Machine: the pid while it is this QEMU and not a zombie.
func (m *LabMachine) PID() int {
	m.mu.Lock()
	pid, done := m.pid, m.done
	m.mu.Unlock()
	if done != nil {
		select {
		case <-done:
			return 0
		default:
		}
	}
	if !procIsArgv(pid, m.argv) {
		return 0
	}
	return pid
}

// procIsArgv reports whether pid is alive, not a zombie, and runs argv.
func procIsArgv(pid int, argv []string) bool {
	if pid <= 1 {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	if s := string(stat); strings.Contains(s[strings.LastIndexByte(s, ')')+1:], " Z ") {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	got := slices.DeleteFunc(strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), func(s string) bool { return s == "-daemonize" })
	return slices.Equal(got, argv)
}

// QMP implements Machine.
func (m *LabMachine) QMP(ctx context.Context, command string, args any) (json.RawMessage, error) {
	return qmp.Call(ctx, m.qmpSock, command, args)
}

// Launch implements Machine.
func (m *LabMachine) Launch(ctx context.Context) error {
	if m.PID() != 0 {
		return errors.New("QEMU is already running")
	}
	logf, err := os.OpenFile(filepath.Join(m.dir, lab.QEMULogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(m.argv[0], m.argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() // the only waiter of this child
	m.mu.Lock()
	m.pid, m.cmd, m.done = cmd.Process.Pid, cmd, done
	m.mu.Unlock()
	var b hypervisor.Backoff
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := m.QMP(cctx, "query-status", nil)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("QEMU exited with %v", cmd.ProcessState)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(b.Next()):
		}
	}
}

// Signal implements Machine.
func (m *LabMachine) Signal(sig syscall.Signal) error {
	pid := m.PID()
	if pid == 0 {
		return errors.New("QEMU is not running")
	}
	return syscall.Kill(pid, sig)
}

// Close implements Machine: it kills and reaps a QEMU Launch started.
func (m *LabMachine) Close() error {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("pveemu: QEMU pid %d did not exit", cmd.Process.Pid)
	}
}

// state is the qcow2 image that holds the internal snapshots of a lab VM
// (its guest runs from RAM and has no disk of its own).
func (m *LabMachine) state() qmp.StateImage {
	return qmp.StateImage{Socket: m.qmpSock, Node: "pveemu-state", File: filepath.Join(m.dir, "pveemu-state.qcow2")}
}

// SaveState implements Snapshotter.
func (m *LabMachine) SaveState(ctx context.Context, tag string) error {
	return m.state().Save(ctx, tag)
}

// LoadState implements Snapshotter.
func (m *LabMachine) LoadState(ctx context.Context, tag string) error {
	return m.state().Load(ctx, tag)
}

// DeleteState implements Snapshotter.
func (m *LabMachine) DeleteState(ctx context.Context, tag string) error {
	return m.state().Delete(ctx, tag)
}
