package vboxemu

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// handleList is VBoxManageList.cpp handleList for `vms` and `runningvms`:
// the subcommands are options without dashes, parsed by RTGetOpt with
// RTGETOPTINIT_FLAGS_NO_STD_OPTS; each machine is printed by showVMInfo in
// VMINFO_COMPACT form, `"name" {uuid}`, in registration order unless
// --sorted.
func (e *emu) handleList(args []string) int {
	g := newGetopt(args, []optDef{
		{long: "--long", short: 'l', id: "l"},
		{long: "--sorted", short: 's', id: "s"},
		{long: "vms", id: "vms"},
		{long: "runningvms", id: "runningvms"},
	}, false)
	g.stdOpts = false
	which, sorted := "", false
	if code := g.each(e.getoptError, func(r *optResult) int {
		if r.def == nil {
			return e.syntaxError("Unknown subcommand \"%s\".", r.value)
		}
		switch r.def.id {
		case "s":
			sorted = true
		case "l":
			// --long prints VMINFO_STANDARD: not emulated.
			e.errorf("emulator: list --long is not emulated")
			return exitFailure
		default:
			which = r.def.id
		}
		return -1
	}); code >= 0 {
		return code
	}
	if which == "" {
		return e.syntaxError("Missing subcommand for \"list\" command.\n")
	}
	vms := append([]*Machine(nil), e.w.VMs...)
	if sorted {
		sort.SliceStable(vms, func(i, j int) bool { return vms[i].Name < vms[j].Name })
	}
	for _, m := range vms {
		if which == "runningvms" && !m.running() {
			continue
		}
		e.printf("\"%s\" {%s}\n", m.Name, m.UUID)
	}
	return exitSuccess
}

// handleShowVMInfo is VBoxManageInfo.cpp handleShowVMInfo. Only
// --machinereadable output is emulated.
func (e *emu) handleShowVMInfo(args []string) int {
	g := newGetopt(args, []optDef{
		{long: "--details", id: "D"}, {long: "-details", id: "D"},
		{long: "--machinereadable", id: "M"}, {long: "-machinereadable", id: "M"},
		{long: "--log", id: "l", kind: reqUint32},
	}, false)
	g.stdOpts = false
	name, machine := "", false
	if code := g.each(e.getoptError, func(r *optResult) int {
		switch {
		case r.def == nil && name == "":
			name = r.value
		case r.def == nil:
			return e.syntaxError("Invalid parameter '%s'", r.value)
		case r.def.id == "M":
			machine = true
		}
		return -1
	}); code >= 0 {
		return code
	}
	if name == "" {
		return e.syntaxError("VM name or UUID required")
	}
	m := e.w.find(name)
	if m == nil {
		return e.notFound(name, siteInfoFindMachine)
	}
	if !machine {
		e.errorf("emulator: only showvminfo --machinereadable is emulated")
		return exitFailure
	}
	e.showMachineReadable(m)
	return exitSuccess
}

// mrString is outputMachineReadableString (VBoxManageInfo.cpp): name="value"
// with '"' and '\' in the value escaped by '\'.
func (e *emu) mrString(name, value string) {
	value = strings.ReplaceAll(value, `\`, `\\`)
	value = strings.ReplaceAll(value, `"`, `\"`)
	e.printf("%s=\"%s\"\n", name, value)
}

// showMachineReadable is showVMInfo(VMINFO_MACHINEREADABLE): the keys the
// emulator knows, in showVMInfo's order. Left out: the hardware, storage,
// network, USB, audio, recording and shared-folder sections between
// "cpus" and "VMState" and after it, but for the UARTs (screen.go).
func (e *emu) showMachineReadable(m *Machine) {
	e.mrString("name", m.Name)
	if e.v.AtLeast(7, 0) {
		e.mrString("encryption", "disabled")
	}
	e.mrString("groups", "/")
	if e.v.AtLeast(7, 1) {
		e.mrString("platformArchitecture", "x86")
	}
	os := m.OSType
	if os == "" {
		os = "Linux (64-bit)"
	}
	e.mrString("ostype", os)
	e.mrString("UUID", m.UUID)
	cfg := e.w.cfgFile(e.h.path, m)
	e.mrString("CfgFile", cfg)
	dir := cfg[:strings.LastIndexByte(cfg, '/')]
	e.mrString("SnapFldr", dir+"/Snapshots")
	e.mrString("LogFldr", dir+"/Logs")
	e.mrString("hardwareuuid", m.UUID)
	e.printf("memory=%d\n", orDefault(m.MemoryMB, 256))
	e.printf("cpus=%d\n", orDefault(m.CPUs, 1))
	e.printf("VMState=\"%s\"\n", m.State)
	e.printf("VMStateChangeTime=\"%s\"\n", rtTimeSpecToString(m.StateChange))
	e.showUARTs(m)
	e.showSnapshots(m)
	e.printf("GuestMemoryBalloon=0\n")
	if m.running() {
		e.showGuest(m)
	}
}

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// rtTimeSpecToString is RTTimeSpecToString (src/VBox/Runtime/common/time/
// time.cpp RTTimeToString): UTC with nanoseconds and a Z.
func rtTimeSpecToString(t time.Time) string {
	t = t.UTC()
	return fmt.Sprintf("%04d-%02d-%02dT%02d:%02d:%02d.%09dZ", t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond())
}

// showSnapshots is VBoxManageInfo.cpp showSnapshots in machine-readable
// form: hierarchical numbering ("", "-1", "-1-2"), the current snapshot
// marked after its own lines. Names and descriptions are printed raw.
func (e *emu) showSnapshots(m *Machine) {
	var walk func(s *Snapshot, prefix string)
	walk = func(s *Snapshot, prefix string) {
		e.printf("SnapshotName%s=\"%s\"\n", prefix, s.Name)
		e.printf("SnapshotUUID%s=\"%s\"\n", prefix, s.UUID)
		if s.Description != "" {
			e.printf("SnapshotDescription%s=\"%s\"\n", prefix, s.Description)
		}
		if s.UUID == m.CurrentSnapshot {
			e.printf("CurrentSnapshotName=\"%s\"\n", s.Name)
			e.printf("CurrentSnapshotUUID=\"%s\"\n", s.UUID)
			e.printf("CurrentSnapshotNode=\"SnapshotName%s\"\n", prefix)
		}
		for i, c := range m.children(s.UUID) {
			walk(c, fmt.Sprintf("%s-%d", prefix, i+1))
		}
	}
	if root := m.root(); root != nil {
		walk(root, "")
	}
}

// showGuest is showVMInfo's "Guest stuff" for a running machine: the run
// level, the Additions version and the facilities. The emulated guest's
// Additions answer when its guest agent does: then the base driver and
// VBoxService are active and the run level is Userland (GuestImpl.cpp
// Guest::i_facilityUpdate recalculates the run level from the facilities).
func (e *emu) showGuest(m *Machine) {
	ga := m.gaVersion(e.v)
	up := ga != "" && m.QGASocket != "" && m.State == "running" && e.agentAnswers(m)
	if !up {
		e.printf("GuestAdditionsRunLevel=0\n")
		return
	}
	e.printf("GuestOSType=\"Linux26_64\"\n")
	e.printf("GuestAdditionsRunLevel=2\n")
	e.mrString("GuestAdditionsVersion", fmt.Sprintf("%s r%d", ga, e.gaRevision(ga)))
	ms := m.StateChange.UnixMilli()
	// AdditionsFacilityStatus_Active is 50 (VirtualBox.xidl).
	e.printf("GuestAdditionsFacility_VirtualBox Base Driver=50,%d\n", ms)
	e.printf("GuestAdditionsFacility_VirtualBox System Service=50,%d\n", ms)
}

// gaRevision is the Additions' revision: the release's own for an
// emulated release, 0 for another version.
func (e *emu) gaRevision(ga string) int {
	for _, v := range Versions() {
		if v.String() == ga {
			return v.Revision
		}
	}
	return 0
}

// agentAnswers reports whether the lab VM's guest agent answers a ping.
func (e *emu) agentAnswers(m *Machine) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return newGuest(e.h, m).ping(ctx) == nil
}

// root is the machine's first snapshot (IMachine::FindSnapshot("")).
func (m *Machine) root() *Snapshot {
	for _, s := range m.Snapshots {
		if s.Parent == "" {
			return s
		}
	}
	return nil
}

// children are a snapshot's children in the order they were taken.
func (m *Machine) children(uuid string) []*Snapshot {
	var c []*Snapshot
	for _, s := range m.Snapshots {
		if s.Parent == uuid && s.UUID != uuid {
			c = append(c, s)
		}
	}
	return c
}
