package pveemu

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/qmp"
)

// snapshot is one entry of a VM config's snapshot section
// (PVE::AbstractConfig, pve-guest-common).
type snapshot struct {
	name        string
	description string
	parent      string
	snaptime    int64
	vmstate     bool
}

// vm is one emulated VM: its config (what /etc/pve/qemu-server/VMID.conf
// holds) and the QEMU behind it.
type vm struct {
	vmid    int
	machine Machine
	// ownMachine: the emulator made the machine (a clone's) and closes it.
	ownMachine bool
	agent      *qga.Client // nil when the Machine has no agent socket

	// cfgMu is the config lock (PVE::AbstractConfig::lock_config).
	cfgMu sync.Mutex
	// qmpSem serialises the calls on the machine's monitor, which takes
	// one client at a time.
	qmpSem chan struct{}
	// mu guards the fields below (read without the config lock).
	mu       sync.Mutex
	node     string
	name     string
	agentOn  bool
	template bool
	memoryMB int
	cores    int
	// description is the config's free text (clone_vm's description).
	description string
	lock        string
	snapshots   map[string]*snapshot
	parent      string
	started     time.Time
}

func newVM(s VMSpec) *vm {
	v := &vm{vmid: s.VMID, node: s.Node, name: s.Name, agentOn: !s.NoAgent, template: s.Template,
		memoryMB: s.MemoryMB, cores: s.Cores, snapshots: map[string]*snapshot{}, started: time.Now(),
		qmpSem: make(chan struct{}, 1)}
	if v.memoryMB == 0 {
		v.memoryMB = 512
	}
	if v.cores == 0 {
		v.cores = 1
	}
	v.machine = s.Machine
	if v.machine == nil {
		v.machine = &nullMachine{running: s.Running}
	}
	if sock := v.machine.AgentSocket(); sock != "" {
		v.agent = newAgentClient(sock)
	}
	return v
}

// newAgentClient is the emulator's connection to a guest agent.
func newAgentClient(sock string) *qga.Client { return qga.New(sock) }

// withMonitor runs f holding the monitor; it waits at most until ctx ends
// (QMPClient's open_connection gives up after its timeout too).
func (v *vm) withMonitor(ctx context.Context, f func() error) error {
	select {
	case v.qmpSem <- struct{}{}:
	case <-ctx.Done():
		return errMonitorBusy
	}
	defer func() { <-v.qmpSem }()
	return f()
}

// errMonitorBusy: another call held the monitor until the deadline.
var errMonitorBusy = errors.New("monitor busy")

func (v *vm) close() error {
	var errs []error
	if v.agent != nil {
		errs = append(errs, v.agent.Close())
	}
	if v.ownMachine {
		errs = append(errs, v.machine.Close())
	}
	return errors.Join(errs...)
}

// nullMachine is a VM without a QEMU: it records the power state, answers
// query-status and has no guest agent.
type nullMachine struct {
	mu      sync.Mutex
	running bool
}

func (m *nullMachine) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running {
		return 1 << 22
	}
	return 0
}

func (m *nullMachine) AgentSocket() string { return "" }

func (m *nullMachine) QMP(_ context.Context, command string, _ any) (json.RawMessage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.running {
		return nil, errors.New("not running")
	}
	switch command {
	case "query-status":
		return json.RawMessage(`{"status":"running","running":true}`), nil
	case "quit":
		m.running = false
		return json.RawMessage(`{}`), nil
	case "system_reset", "system_powerdown":
		return json.RawMessage(`{}`), nil
	}
	return nil, &qmp.Error{Class: "CommandNotFound", Desc: "The command " + command + " has not been found"}
}

func (m *nullMachine) Launch(context.Context) error {
	m.mu.Lock()
	m.running = true
	m.mu.Unlock()
	return nil
}

func (m *nullMachine) Signal(syscall.Signal) error {
	m.mu.Lock()
	m.running = false
	m.mu.Unlock()
	return nil
}

func (m *nullMachine) Close() error { return nil }
