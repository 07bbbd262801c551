package vboxemu

import (
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/qmp"
)

// Snapshots are the machine's records (SnapshotImpl.cpp): name, UUID,
// description, tree, the current snapshot and the state a restore leads to.
// A snapshot of a lab-backed machine also holds the guest's disk and, when
// taken online, its memory and devices (qemusnap.go). Restoring an online
// one leaves the machine "saved" as VirtualBox would, with the lab VM's
// QEMU stopped at the snapshot's moment, and starting the machine resumes
// the guest there; restoring an offline one leaves it powered off with the
// disk as it was, and the guest boots afresh on it.

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// findSnapshot is Machine::findSnapshot: by UUID (braces optional) when
// the argument is one, else by name; the error texts of MachineImpl.cpp.
func (m *Machine) findSnapshot(nameOrID string) (*Snapshot, string) {
	if len(m.Snapshots) == 0 {
		return nil, "This machine does not have any snapshots"
	}
	id := strings.TrimSuffix(strings.TrimPrefix(nameOrID, "{"), "}")
	if isUUID(id) {
		for _, s := range m.Snapshots {
			if strings.EqualFold(s.UUID, id) {
				return s, ""
			}
		}
		return nil, fmt.Sprintf("Could not find a snapshot with UUID {%s}", strings.ToLower(id))
	}
	for _, s := range m.Snapshots {
		if s.Name == nameOrID {
			return s, ""
		}
	}
	return nil, fmt.Sprintf("Could not find a snapshot named '%s'", nameOrID)
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
	}
	return true
}

// handleSnapshot is VBoxManageSnapshot.cpp handleSnapshot for take,
// delete, restore, restorecurrent and list.
func (e *emu) handleSnapshot(args []string) int {
	if len(args) < 2 {
		return e.syntaxError("Not enough parameters")
	}
	m := e.w.find(args[0])
	if m == nil {
		return e.notFound(args[0], siteSnapFindMachine)
	}
	switch args[1] {
	case "take":
		return e.snapshotTake(m, args)
	case "delete", "restore", "restorecurrent":
		return e.snapshotChange(m, args)
	case "list":
		return e.snapshotList(m, args)
	}
	e.syntaxError("Invalid parameter '%s'", args[1])
	return exitFailure
}

// sessionMachineError is CHECK_ERROR's report of a failed call on the
// session's IMachine.
func (e *emu) sessionMachineError(text string, code comCode, site contextSite) int {
	e.comError(text, code, "SessionMachine", "IMachine", site)
	return exitFailure
}

func (e *emu) snapshotTake(m *Machine, args []string) int {
	if len(args) < 3 {
		e.syntaxError("Missing snapshot name")
		return exitFailure
	}
	name, desc, live := args[2], "", false
	g := newGetopt(args[3:], []optDef{
		{long: "--description", short: 'd', id: "d", kind: reqString},
		{long: "-description", id: "d", kind: reqString}, {long: "-desc", id: "d", kind: reqString},
		{long: "--pause", short: 'p', id: "p"}, {long: "--live", short: 'l', id: "l"},
		{long: "--uniquename", short: 'u', id: "u", kind: reqString},
	}, false)
	g.stdOpts = false
	// handleSnapshot turns every syntax error of a subcommand into exit 1.
	failed := func(int) int { return exitFailure }
	if code := g.each(func(oe *optError) int { return failed(e.getoptError(oe)) }, func(r *optResult) int {
		if r.def == nil {
			return failed(e.invalidParameter(r.value))
		}
		switch r.def.id {
		case "d":
			desc = r.value
		case "l":
			live = true
		case "p":
			live = false
		}
		return -1
	}); code >= 0 {
		return code
	}
	if live && m.State != "running" {
		return e.sessionMachineError("Cannot take a live snapshot of a virtual machine unless it is running.", codeInvalidVMState, siteSnapTake)
	}
	s := &Snapshot{UUID: newUUID(), Name: name, Description: desc, Parent: m.CurrentSnapshot, Taken: time.Now(), Online: m.running(), StateAtTake: m.State}
	// SessionMachine::takeSnapshot: the disks always, the VM's state when
	// online (QEMU saves memory either way; an offline snapshot's is never
	// used, see snapshotChange).
	done, err := qemuSnapshot(m, qmp.StateImage.Save, s.UUID)
	if err != nil {
		e.errorf("emulator: snapshot-save: %v", err)
		return exitFailure
	}
	if done {
		s.QEMUTag = s.UUID
	}
	if err := e.h.updateMachine(m.UUID, func(wm *Machine) error {
		wm.Snapshots = append(wm.Snapshots, s)
		wm.CurrentSnapshot = s.UUID
		return nil
	}); err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	e.progress()
	e.printf("Snapshot taken. UUID: %s\n", s.UUID)
	return exitSuccess
}

// snapshotChange is delete, restore and restorecurrent:
// SessionMachine::deleteSnapshot refuses a snapshot with more than one
// child and the current one with a child; SessionMachine::restoreSnapshot
// refuses a machine that runs.
func (e *emu) snapshotChange(m *Machine, args []string) int {
	verb := args[1]
	var s *Snapshot
	if verb == "restorecurrent" {
		if len(args) > 2 {
			e.syntaxError("Too many arguments")
			return exitFailure
		}
		if s, _ = m.findSnapshot(m.CurrentSnapshot); m.CurrentSnapshot == "" || s == nil {
			e.printf("This machine does not have any snapshots\n")
			return exitFailure
		}
	} else {
		if len(args) != 3 {
			e.syntaxError("Expecting snapshot name only")
			return exitFailure
		}
		var why string
		if s, why = m.findSnapshot(args[2]); s == nil {
			return e.sessionMachineError(why, codeObjectNotFound, siteSnapFind)
		}
	}
	if verb == "delete" {
		e.printf("Deleting snapshot '%s' (%s)\n", s.Name, s.UUID)
		return e.snapshotDelete(m, s)
	}
	e.printf("Restoring snapshot '%s' (%s)\n", s.Name, s.UUID)
	if m.running() {
		return e.sessionMachineError(fmt.Sprintf("Cannot delete the current state of the running machine (machine state: %s)", machineStateName(m.State)),
			codeInvalidVMState, siteSnapRestore)
	}
	state := "poweroff"
	if s.Online {
		state = "saved"
	}
	if s.QEMUTag != "" {
		// The lab VM's QEMU stands still at the snapshot's moment.
		if err := e.qmp(m, "stop"); err != nil {
			e.errorf("emulator: stop: %v", err)
			return exitFailure
		}
		if _, err := qemuSnapshot(m, qmp.StateImage.Load, s.QEMUTag); err != nil {
			e.errorf("emulator: snapshot-load: %v", err)
			return exitFailure
		}
	}
	if err := e.h.updateMachine(m.UUID, func(wm *Machine) error {
		wm.CurrentSnapshot, wm.State, wm.StateChange = s.UUID, state, time.Now()
		wm.ResumeState = s.QEMUTag != "" && s.Online
		return nil
	}); err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	e.progress()
	return exitSuccess
}

func (e *emu) snapshotDelete(m *Machine, s *Snapshot) int {
	kids := m.children(s.UUID)
	switch {
	case len(kids) > 1:
		return e.sessionMachineError(fmt.Sprintf("Snapshot '%s' of the machine '%s' cannot be deleted, because it has %d child snapshots, which is more than the one snapshot allowed for deletion",
			s.Name, m.Name, len(kids)), codeInvalidObject, siteSnapDelete)
	case len(kids) == 1 && s.UUID == m.CurrentSnapshot:
		return e.sessionMachineError(fmt.Sprintf("Snapshot '%s' of the machine '%s' cannot be deleted, because it is the current snapshot and has one child snapshot",
			s.Name, m.Name), codeInvalidObject, siteSnapDelete)
	}
	if s.QEMUTag != "" {
		if _, err := qemuSnapshot(m, qmp.StateImage.Delete, s.QEMUTag); err != nil {
			e.errorf("emulator: snapshot-delete: %v", err)
			return exitFailure
		}
	}
	if err := e.h.updateMachine(m.UUID, func(wm *Machine) error {
		kept := wm.Snapshots[:0]
		for _, x := range wm.Snapshots {
			if x.UUID == s.UUID {
				continue
			}
			if x.Parent == s.UUID {
				x.Parent = s.Parent // the child moves up
			}
			kept = append(kept, x)
		}
		wm.Snapshots = kept
		if wm.CurrentSnapshot == s.UUID {
			wm.CurrentSnapshot = s.Parent
		}
		return nil
	}); err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	e.progress()
	return exitSuccess
}

// snapshotList is handleSnapshotList: --machinereadable prints
// showSnapshots' hierarchical keys, the default its indented form.
func (e *emu) snapshotList(m *Machine, args []string) int {
	g := newGetopt(args[2:], []optDef{
		{long: "--details", short: 'D', id: "D"},
		{long: "--machinereadable", short: 'M', id: "M"},
	}, false)
	machine := false
	failed := func(int) int { return exitFailure }
	if code := g.each(func(oe *optError) int { return failed(e.getoptError(oe)) }, func(r *optResult) int {
		if code, done := e.stdOption(r); done {
			return code
		}
		if r.def == nil {
			return failed(e.invalidParameter(r.value))
		}
		machine = r.def.id == "M"
		return -1
	}); code >= 0 {
		return code
	}
	if m.root() == nil {
		e.printf("This machine does not have any snapshots\n")
		return exitFailure
	}
	if machine {
		e.showSnapshots(m)
		return exitSuccess
	}
	var walk func(s *Snapshot, prefix string)
	walk = func(s *Snapshot, prefix string) {
		cur := ""
		if s.UUID == m.CurrentSnapshot {
			cur = " *"
		}
		e.printf("   %sName: %s (UUID: %s)%s\n", prefix, s.Name, s.UUID, cur)
		if s.Description != "" && !strings.Contains(s.Description, "\n") {
			e.printf("   %sDescription: %s\n", prefix, s.Description)
		} else if s.Description != "" {
			e.printf("   %sDescription:\n%s\n", prefix, s.Description)
		}
		for _, c := range m.children(s.UUID) {
			walk(c, prefix+"   ")
		}
	}
	walk(m.root(), "")
	return exitSuccess
}
