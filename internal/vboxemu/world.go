package vboxemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// WorldFile and LogFile are the names of the emulated host's state and
// invocation log, next to the emulator's executable.
const (
	WorldFile = "vbox.json"
	LogFile   = "vbox.log"
)

// World is the emulated host: what VBoxSVC and the VM processes know.
type World struct {
	// Version is the emulated release: "6.1", "7.0", "7.1" (or "7.1.6");
	// empty means 7.1.
	Version string `json:"version"`
	// Users are the guest accounts (name → password) every guest accepts.
	Users map[string]string `json:"users"`
	// VMs are the registered machines.
	VMs []*Machine `json:"vms"`

	// COMServerDown makes every command that needs COM fail as when
	// VBoxSVC is not running (VBoxManage.cpp main).
	COMServerDown bool `json:"com_server_down,omitempty"`
	// VBoxDrvMissing makes the Linux wrapper print its "vboxdrv kernel
	// module is not loaded" warning on stdout before every command
	// (src/VBox/Installer/linux/VBox.sh) and VMs fail to start.
	VBoxDrvMissing bool `json:"vboxdrv_missing,omitempty"`
	// EffectiveUser is the host account VBox.sh compares LOGNAME and USER
	// with; empty means the emulator's own user.
	EffectiveUser string `json:"effective_user,omitempty"`
	// StdoutBuffer is the stdio buffer size of VBoxManage's stdout;
	// 0 means DefaultStdoutBuffer.
	StdoutBuffer int `json:"stdout_buffer,omitempty"`
	// WaitSpin is how many run-loop iterations the emulator prints per
	// second while a guest process runs (VBoxManage spins: with
	// --wait-stdout/--wait-stderr, IGuestProcess::WaitForArray answers
	// WaitFlagNotSupported at once under guest control protocol 2,
	// GuestProcessImpl.cpp i_waitFlagsToResultEx). 0 means 200.
	WaitSpin int `json:"wait_spin,omitempty"`
	// VMProcessTeardownMS is how long a machine's VM process keeps its
	// session locked after `controlvm poweroff` returned: the headless VM
	// process leaves its event loop on the OnStateChanged event and only
	// then calls ISession::UnlockMachine (VBoxHeadless.cpp TrustedMain in
	// 6.1.38, 7.0.18 and 7.1.6), while VBoxManage returns when
	// Console::PowerDown's progress completes (VBoxManageControlVM.cpp
	// handleControlVM). 0: the session is free when poweroff returns.
	VMProcessTeardownMS int `json:"vm_process_teardown_ms,omitempty"`
	// Dir is where machine folders live (CfgFile paths); empty means the
	// world file's directory.
	Dir string `json:"dir,omitempty"`
	// Spares are lab VMs a registered clone takes as its guest (in order);
	// unregistering the clone gives its lab VM back.
	Spares []Backing `json:"spares,omitempty"`
}

// Backing is a lab VM that can stand behind a machine.
type Backing struct {
	QGASocket string `json:"qga_socket"`
	QMPSocket string `json:"qmp_socket"`
}

// Machine is one registered VM.
type Machine struct {
	Name   string `json:"name"`
	UUID   string `json:"uuid"`
	OSType string `json:"ostype,omitempty"`
	// MemoryMB and CPUs are the configured hardware.
	MemoryMB int `json:"memory_mb,omitempty"`
	CPUs     int `json:"cpus,omitempty"`
	// State is MachineState in machineStateToName's short form:
	// poweroff, running, paused, saved, aborted.
	State       string    `json:"state"`
	StateChange time.Time `json:"state_change"`
	// QGASocket and QMPSocket reach the lab VM behind the machine, if any.
	QGASocket string `json:"qga_socket,omitempty"`
	QMPSocket string `json:"qmp_socket,omitempty"`
	// GAVersion is the installed Guest Additions' version; empty means the
	// host's release, "none" means no Additions.
	GAVersion string `json:"ga_version,omitempty"`
	// HostServiceMissing: the VM process has no guest control host service
	// (HGCM answers VERR_HGCM_SERVICE_NOT_FOUND).
	HostServiceMissing bool `json:"host_service_missing,omitempty"`
	// GuestTimeoutFirst: VBoxService's timeout of a process fires before
	// VBoxManage's own deadline (the race in gctlHandleRunCommon).
	GuestTimeoutFirst bool `json:"guest_timeout_first,omitempty"`

	Snapshots       []*Snapshot `json:"snapshots,omitempty"`
	CurrentSnapshot string      `json:"current_snapshot,omitempty"` // UUID
	// SessionLockedUntil is when the VM process of a machine powered off
	// ends and releases the machine's session (World.VMProcessTeardownMS).
	SessionLockedUntil time.Time `json:"session_locked_until,omitzero"`
	// Sessions are the guest control sessions the VM process knows.
	Sessions []*GuestSession `json:"sessions,omitempty"`
	// LinkedFrom is the UUID of the snapshot a linked clone hangs off.
	LinkedFrom string `json:"linked_from,omitempty"`
	// Spare: the lab VM behind the machine came from World.Spares.
	Spare bool `json:"spare,omitempty"`
	// ExtraData is the machine's extra data (settings file ExtraData
	// items: IMachine::SetExtraData / GetExtraData).
	ExtraData map[string]string `json:"extra_data,omitempty"`
	// ResumeState: the machine is "saved" and its lab VM's QEMU holds the
	// state a snapshot restore loaded; starting it resumes the guest.
	ResumeState bool `json:"resume_state,omitempty"`
	// UART1 is the machine's first serial port; nil means it is off
	// (screen.go).
	UART1 *UART `json:"uart1,omitempty"`
}

// Snapshot is one node of a machine's snapshot tree.
type Snapshot struct {
	UUID        string    `json:"uuid"`
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	Parent      string    `json:"parent,omitempty"` // UUID; empty for the root
	Taken       time.Time `json:"taken"`
	Online      bool      `json:"online"`
	// QEMUTag names the QMP snapshot holding the guest's state; empty when
	// the lab VM could not take one (then only the record exists).
	QEMUTag string `json:"qemu_tag,omitempty"`
	// StateAtTake is the machine state the snapshot restores.
	StateAtTake string `json:"state_at_take"`
}

// GuestSession is a guest control session of a VM (GuestSessionImpl).
type GuestSession struct {
	ID        uint32          `json:"id"`
	Name      string          `json:"name"`
	User      string          `json:"user"`
	Status    string          `json:"status"`
	OwnerPID  int             `json:"owner_pid"` // the VBoxManage process
	Processes []*GuestProcess `json:"processes,omitempty"`
}

// GuestProcess is a process of a guest session.
type GuestProcess struct {
	PID     int64  `json:"pid"`
	Status  string `json:"status"`
	Command string `json:"command"`
}

// ReadWorld reads a world file.
func ReadWorld(path string) (*World, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var w World
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, fmt.Errorf("vboxemu: %s: %w", path, err)
	}
	return &w, nil
}

// WriteWorld writes w to path atomically.
func WriteWorld(path string, w *World) error {
	raw, err := json.MarshalIndent(w, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// host is the emulated host behind one invocation: the world file and its
// lock.
type host struct {
	path string
}

// lock takes the world's lock (shared or exclusive) and returns its release.
func (h host) lock(exclusive bool) (func(), error) {
	f, err := os.OpenFile(h.path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// read returns a snapshot of the world.
func (h host) read() (*World, error) {
	unlock, err := h.lock(false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return ReadWorld(h.path)
}

// errNoChange is returned by an update function that changed nothing.
var errNoChange = errors.New("no change")

// update applies f to the world under the exclusive lock and writes the
// result back unless f fails (errNoChange: a success that writes nothing).
func (h host) update(f func(w *World) error) error {
	unlock, err := h.lock(true)
	if err != nil {
		return err
	}
	defer unlock()
	w, err := ReadWorld(h.path)
	if err != nil {
		return err
	}
	if err := f(w); err != nil {
		if errors.Is(err, errNoChange) {
			return nil
		}
		return err
	}
	if err := WriteWorld(h.path, w); err != nil {
		return err
	}
	for _, m := range w.VMs {
		if err := writeSettings(w.cfgFile(h.path, m), m); err != nil {
			return err
		}
	}
	return nil
}

// errGone: the machine was unregistered by another invocation meanwhile.
var errGone = errors.New("machine unregistered meanwhile")

// updateMachine applies f to the machine uuid under the exclusive lock.
func (h host) updateMachine(uuid string, f func(m *Machine) error) error {
	return h.update(func(w *World) error {
		m := w.find(uuid)
		if m == nil {
			return errGone
		}
		return f(m)
	})
}

// find is VirtualBox::findMachine: by UUID or by name.
func (w *World) find(nameOrUUID string) *Machine {
	for _, m := range w.VMs {
		if m.UUID == nameOrUUID || "{"+m.UUID+"}" == nameOrUUID || m.Name == nameOrUUID {
			return m
		}
	}
	return nil
}

// dir is where the world keeps machine folders.
func (w *World) dir(worldPath string) string {
	if w.Dir != "" {
		return w.Dir
	}
	return filepath.Dir(worldPath)
}

// cfgFile is a machine's settings file path (the default machine folder
// layout: <dir>/<name>/<name>.vbox).
func (w *World) cfgFile(worldPath string, m *Machine) string {
	return filepath.Join(w.dir(worldPath), m.Name, m.Name+".vbox")
}

// running reports whether the machine has a VM process (Global::IsOnline
// for the states the emulator uses).
func (m *Machine) running() bool { return m.State == "running" || m.State == "paused" }

// sessionLocked reports whether a VM process holds the machine's session
// at now: it runs, or it is still ending after a poweroff. Machine::unregister,
// Machine::lockMachine (a write lock, as modifyvm takes) and
// Machine::i_launchVMProcess refuse such a machine (MachineImpl.cpp).
func (m *Machine) sessionLocked(now time.Time) bool {
	return m.running() || now.Before(m.SessionLockedUntil)
}

// UpdateWorld applies f to the world file at path under the lock every
// emulator invocation takes, and writes the result back unless f fails.
// Tests use it to change the host between commands (end a VM process).
func UpdateWorld(path string, f func(w *World) error) error {
	return host{path: path}.update(f)
}

// gaVersion is the Additions version the guest reports, "" for none.
func (m *Machine) gaVersion(v *Version) string {
	switch m.GAVersion {
	case "none":
		return ""
	case "":
		return v.String()
	}
	return m.GAVersion
}
