package vboxemu

import (
	"context"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/internal/qmp"
)

// The VM process of a lab-backed machine is its QEMU, kept alive across
// emulated power cycles: "powered off" is QEMU with its vCPUs stopped
// (QMP stop) and nothing answering in the guest; power on is a reset and
// cont, so the guest boots afresh (but from a restored snapshot's state,
// snapshot.go). A machine without a lab VM only changes
// state.

// setState records a machine's new state (IMachine::State and
// LastStateChange); a VM process that ends takes its guest sessions with it
// and holds the machine's session for World.VMProcessTeardownMS more.
func (e *emu) setState(uuid, state string) error {
	return e.h.updateMachine(uuid, func(m *Machine) error {
		wasRunning := m.running()
		m.State, m.StateChange = state, time.Now()
		if state != "saved" {
			m.ResumeState = false
		}
		if !m.running() {
			m.Sessions = nil
		}
		if wasRunning && !m.running() {
			// The VM process ends, and holds the session until it has.
			m.SessionLockedUntil = m.StateChange.Add(time.Duration(e.w.VMProcessTeardownMS) * time.Millisecond)
		}
		return nil
	})
}

func (e *emu) qmp(m *Machine, command string) error {
	if m.QMPSocket == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := qmp.Call(ctx, m.QMPSocket, command, nil)
	return err
}

// progress is showProgress for an operation that completed: "0%...",
// the tens, "100%" on stderr.
func (e *emu) progress() {
	fmt.Fprintf(e.stderr, "0%%...10%%...20%%...30%%...40%%...50%%...60%%...70%%...80%%...90%%...100%%\n")
}

// handleStartVM is VBoxManageMisc.cpp handleStartVM: RTGetOpt without
// sorting or standard options; each VM is launched with LaunchVMProcess
// and waited for.
func (e *emu) handleStartVM(args []string) int {
	g := newGetopt(args, []optDef{
		{long: "--type", short: 't', id: "t", kind: reqString},
		{long: "-type", id: "t", kind: reqString},
		{long: "--putenv", short: 'E', id: "E", kind: reqString},
		{long: "--password", short: 'p', id: "p", kind: reqString},
		{long: "--password-id", short: 'i', id: "i", kind: reqString},
	}, false)
	g.stdOpts = false
	var vms []string
	if code := g.each(e.miscOptError, func(r *optResult) int {
		if r.def == nil {
			vms = append(vms, r.value)
		}
		return -1
	}); code >= 0 {
		return code
	}
	if len(vms) == 0 {
		return e.syntaxError("at least one VM name or uuid required")
	}
	code := exitSuccess
	for _, name := range vms {
		if c := e.startOne(name); c != exitSuccess {
			code = c
		}
	}
	return code
}

func (e *emu) startOne(name string) int {
	m := e.w.find(name)
	if m == nil {
		return e.notFound(name, siteStartFindMachine)
	}
	if m.sessionLocked(time.Now()) || len(m.Sessions) > 0 {
		// Machine::i_launchVMProcess: a machine whose session is locked
		// (or being unlocked by a VM process that is ending).
		e.comError(fmt.Sprintf("The machine '%s' is already locked by a session (or being locked or unlocked)", m.Name),
			codeInvalidObject, "MachineWrap", "IMachine", siteStartLaunch)
		return exitFailure
	}
	e.printf("Waiting for VM \"%s\" to power on...\n", name)
	if e.w.VBoxDrvMissing {
		// The VM process cannot open /dev/vboxdrv; the progress fails.
		e.errorf("The virtual machine '%s' has terminated unexpectedly during startup with exit code 1 (0x1)\nDetails: code NS_ERROR_FAILURE (0x80004005), component MachineWrap, interface IMachine", m.Name)
		return exitFailure
	}
	if err := e.powerOnGuest(m); err != nil {
		e.errorf("emulator: power on: %v", err)
		return exitFailure
	}
	if err := e.setState(m.UUID, "running"); err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	e.printf("VM \"%s\" has been successfully started.\n", name)
	return exitSuccess
}

// powerOnGuest boots the lab VM afresh: reset, then let the vCPUs run; a
// machine restored to a snapshot's state resumes from it instead.
func (e *emu) powerOnGuest(m *Machine) error {
	if m.State == "saved" && m.ResumeState {
		return e.qmp(m, "cont")
	}
	if err := e.qmp(m, "system_reset"); err != nil {
		return err
	}
	return e.qmp(m, "cont")
}

// handleControlVM is VBoxManageControlVM.cpp handleControlVM for pause,
// resume, reset, poweroff and acpipowerbutton, and the display and
// keyboard subcommands of screen.go.
func (e *emu) handleControlVM(args []string) int {
	if len(args) < 2 {
		return e.syntaxError("Not enough parameters.")
	}
	m := e.w.find(args[0])
	if m == nil {
		return e.notFound(args[0], siteControlFindMachine)
	}
	// LockMachine(Shared) of a machine without a VM process gives a
	// session without a console.
	if !m.running() {
		e.errorf("Machine '%s' is not currently running.", args[0])
		return exitFailure
	}
	switch args[1] {
	case "pause":
		return e.consoleOp(m, "paused", "stop", siteControlPause, m.State == "running")
	case "resume":
		return e.consoleOp(m, "running", "cont", siteControlResume, m.State == "paused")
	case "reset":
		return e.consoleOp(m, m.State, "system_reset", siteControlReset, true)
	case "poweroff":
		// Console::PowerDown: the VM process ends (QEMU's vCPUs stop); it
		// holds the machine's session until it has ended (setState).
		if err := e.qmp(m, "stop"); err != nil {
			e.errorf("emulator: power off: %v", err)
			return exitFailure
		}
		if err := e.setState(m.UUID, "poweroff"); err != nil {
			e.errorf("emulator: %v", err)
			return exitFailure
		}
		e.progress()
		return exitSuccess
	case "acpipowerbutton":
		// Console::PowerButton: an ACPI event the guest may act on.
		return e.consoleOp(m, m.State, "system_powerdown", siteControlPowerButton, m.State == "running")
	}
	if code, ok := e.controlScreen(m, args); ok {
		return code
	}
	return e.syntaxError("Invalid parameter '%s'", args[1])
}

// consoleOp runs one IConsole call that needs the machine in a state
// (Console's "Invalid machine state: %s" otherwise) and records the new
// state.
func (e *emu) consoleOp(m *Machine, state, qmpCommand string, site contextSite, allowed bool) int {
	if !allowed {
		e.comError(fmt.Sprintf("Invalid machine state: %s", machineStateName(m.State)), codeInvalidVMState, "ConsoleWrap", "IConsole", site)
		return exitFailure
	}
	if err := e.qmp(m, qmpCommand); err != nil {
		e.errorf("emulator: %s: %v", qmpCommand, err)
		return exitFailure
	}
	if state != m.State {
		if err := e.setState(m.UUID, state); err != nil {
			e.errorf("emulator: %v", err)
			return exitFailure
		}
	}
	return exitSuccess
}

// machineStateName is Global::stringifyMachineState for the states used.
func machineStateName(short string) string {
	switch short {
	case "poweroff":
		return "PoweredOff"
	case "running":
		return "Running"
	case "paused":
		return "Paused"
	case "saved":
		return "Saved"
	case "aborted":
		return "Aborted"
	}
	return short
}
