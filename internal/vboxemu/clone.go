package vboxemu

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/qmp"
)

// siteCreateMachine is handleCloneVM's IVirtualBox::CreateMachine call.
var siteCreateMachine = contextSite{"VBoxManageMisc.cpp", "CreateMachine(bstrSettingsFile.raw(), Bstr(pszTrgName).raw(), ...)",
	map[string]int{"6.1": 594, "7.0": 704, "7.1": 742}}

// siteCloneTo is handleCloneVM's IMachine::CloneTo call.
var siteCloneTo = contextSite{"VBoxManageMisc.cpp", "CloneTo(trgMachine, mode, ComSafeArrayAsInParam(options), progress.asOutParam())",
	map[string]int{"6.1": 604, "7.0": 717, "7.1": 756}}

// siteUnregister is handleUnregisterVM's IMachine::Unregister call.
var siteUnregister = contextSite{"VBoxManageMisc.cpp", "Unregister(fDeleteAll ? CleanupMode_DetachAllReturnHardDisksAndVMRemovable :CleanupMode_DetachAllReturnHardDisksOnly, ComSafeArrayAsOutParam(aMedia))",
	map[string]int{"7.0": 233, "7.1": 232}}

// siteUnregister61 is 6.1's Unregister call (no --delete-all).
var siteUnregister61 = contextSite{"VBoxManageMisc.cpp", "Unregister(CleanupMode_DetachAllReturnHardDisksOnly, ComSafeArrayAsOutParam(aMedia))",
	map[string]int{"6.1": 152}}

// siteRegisterClone is handleCloneVM's IVirtualBox::RegisterMachine call.
var siteRegisterClone = contextSite{"VBoxManageMisc.cpp", "RegisterMachine(trgMachine)",
	map[string]int{"6.1": 613, "7.0": 726, "7.1": 765}}

// cloneOpts are handleCloneVM's options.
type cloneOpts struct {
	src, snapshot, name, uuid string
	register, link            bool
}

// uuidArg is what RTGETOPT_REQ_UUID takes (RTUuidFromStr: braces optional).
var uuidArg = regexp.MustCompile(`^\{?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\}?$`)

// handleCloneVM is VBoxManageMisc.cpp handleCloneVM: FindMachine, the
// snapshot (FindSnapshot), CreateMachine for "<name>" (default "<src>
// Clone"), CloneTo (Machine::cloneTo: a linked clone needs a snapshot),
// the progress, RegisterMachine when --register, and the success line.
// The clone is a new machine record, powered off, or saved when it is a
// clone of a snapshot taken online; when the world has a spare lab VM
// (World.Spares) the clone gets it as its guest (starting a saved clone
// boots that guest afresh: it holds no copy of the snapshot's memory).
func (e *emu) handleCloneVM(args []string) int {
	o, code := e.parseClone(args)
	if code >= 0 {
		return code
	}
	src := e.w.find(o.src)
	if src == nil {
		return e.notFound(o.src, siteCloneFindMachine)
	}
	var from *Snapshot
	if o.snapshot != "" {
		var why string
		if from, why = src.findSnapshot(o.snapshot); from == nil {
			e.comError(why, codeObjectNotFound, "MachineWrap", "IMachine", siteCloneFindSnapshot)
			return exitFailure
		}
	}
	if o.name == "" {
		o.name = o.src + " Clone"
	}
	cfg := e.w.cfgFile(e.h.path, &Machine{Name: o.name})
	if e.w.find(o.name) != nil || fileExists(cfg) {
		e.comError(fmt.Sprintf("Machine settings file '%s' already exists", cfg), codeFileError, "VirtualBoxWrap", "IVirtualBox", siteCreateMachine)
		return exitFailure
	}
	if o.link && from == nil {
		e.comError("Linked clone can only be created from a snapshot", codeInvalidArg, "MachineWrap", "IMachine", siteCloneTo)
		return exitFailure
	}
	clone := &Machine{Name: o.name, UUID: newUUID(), OSType: src.OSType, MemoryMB: src.MemoryMB, CPUs: src.CPUs,
		State: "poweroff", StateChange: time.Now(), GAVersion: src.GAVersion}
	// MachineImplCloneVM.cpp MachineCloneVM::run: the target's settings
	// are a copy of the source's machine config file (trgMCF), extra data
	// items included.
	if len(src.ExtraData) > 0 {
		clone.ExtraData = make(map[string]string, len(src.ExtraData))
		for k, v := range src.ExtraData {
			clone.ExtraData[k] = v
		}
	}
	if o.link {
		clone.LinkedFrom = from.UUID
	}
	if from != nil && from.Online {
		// MachineImplCloneVM.cpp: MachineCloneVMPrivate::addSaveState
		// copies the snapshot's saved state as the clone's current state
		// (fAttachCurrent), and MachineCloneVM::run then sets the target
		// MachineState_Saved.
		clone.State = "saved"
	}
	if o.uuid != "" {
		// CreateMachine's "UUID=" flag (VirtualBoxImpl.cpp createMachine).
		clone.UUID = strings.ToLower(strings.Trim(o.uuid, "{}"))
	}
	e.progress()
	if o.register {
		// VirtualBox::i_registerMachine refuses a UUID already registered.
		if m := e.w.find(clone.UUID); m != nil {
			e.comError(fmt.Sprintf("Registered machine with UUID {%s} ('%s') already exists", clone.UUID, e.w.cfgFile(e.h.path, m)),
				codeInvalidArg, "VirtualBoxWrap", "IVirtualBox", siteRegisterClone)
			return exitFailure
		}
		if err := e.h.update(func(w *World) error {
			if len(w.Spares) > 0 {
				clone.QGASocket, clone.QMPSocket, clone.Spare = w.Spares[0].QGASocket, w.Spares[0].QMPSocket, true
				w.Spares = w.Spares[1:]
			}
			w.VMs = append(w.VMs, clone)
			return nil
		}); err != nil {
			e.errorf("emulator: %v", err)
			return exitFailure
		}
	}
	e.printf("Machine has been successfully cloned as \"%s\"\n", o.name)
	return exitSuccess
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (e *emu) parseClone(args []string) (cloneOpts, int) {
	var o cloneOpts
	g := newGetopt(args, []optDef{
		{long: "--snapshot", id: "s", kind: reqString}, {long: "--name", id: "n", kind: reqString},
		{long: "--groups", id: "g", kind: reqString}, {long: "--mode", id: "m", kind: reqString},
		{long: "--options", id: "o", kind: reqString}, {long: "--register", id: "r"},
		{long: "--basefolder", id: "p", kind: reqString}, {long: "--uuid", id: "u", kind: reqString},
	}, false)
	g.stdOpts = false
	code := g.each(e.getoptError, func(r *optResult) int {
		if r.def == nil {
			if o.src != "" {
				return e.syntaxError("Invalid parameter '%s'", r.value)
			}
			o.src = r.value
			return -1
		}
		return e.cloneOption(&o, r)
	})
	if code >= 0 {
		return o, code
	}
	if o.src == "" {
		return o, e.syntaxError("VM name required")
	}
	return o, -1
}

// cloneOption handles one of clonevm's options.
func (e *emu) cloneOption(o *cloneOpts, r *optResult) int {
	switch r.def.id {
	case "s":
		o.snapshot = r.value
	case "n":
		o.name = r.value
	case "r":
		o.register = true
	case "u":
		if !uuidArg.MatchString(r.value) {
			return e.getoptError(&optError{rc: "VERR_GETOPT_INVALID_ARGUMENT_FORMAT", psz: r.value, long: r.def.long})
		}
		o.uuid = r.value
	case "o":
		// parseCloneOptions: comma-separated, case-insensitive prefixes.
		for _, opt := range strings.Split(r.value, ",") {
			switch strings.ToLower(opt) {
			case "link", "linked":
				o.link = true
			case "keepallmacs", "keepnatmacs", "keepdisknames", "keephwuuids", "keephwuuid", "":
			default:
				e.errorf("Invalid clone options '%s'\n", r.value)
				return exitSyntax
			}
		}
	case "m":
		switch strings.ToLower(r.value) {
		case "machine", "machineandchildren", "all":
		default:
			e.errorf("Invalid clone mode '%s'\n", r.value)
			return exitSyntax
		}
	}
	return -1
}

// handleUnregisterVM is VBoxManageMisc.cpp handleUnregisterVM: a machine
// with a VM process cannot be unregistered (Machine::unregister); with
// --delete its files go too (DeleteConfig and its progress). A clone's lab
// VM returns to the spares.
func (e *emu) handleUnregisterVM(args []string) int {
	g := newGetopt(args, []optDef{
		{long: "--delete", id: "d"}, {long: "-delete", id: "d"},
		{long: "--delete-all", id: "a"}, {long: "-delete-all", id: "a"},
	}, false)
	g.stdOpts = false
	name, del := "", false
	code := g.each(e.miscOptError, func(r *optResult) int {
		switch {
		case r.def == nil && name == "":
			name = r.value
		case r.def == nil:
			return e.syntaxError("Invalid parameter '%s'", r.value)
		case r.def.id == "a" && !e.v.AtLeast(7, 0):
			return e.syntaxError("unknown option: %s\n", r.def.long)
		default:
			del = true
		}
		return -1
	})
	if code >= 0 {
		return code
	}
	if name == "" {
		return e.syntaxError("VM name required")
	}
	m := e.w.find(name)
	if m == nil {
		return e.notFound(name, siteUnregFindMachine)
	}
	if m.sessionLocked(time.Now()) {
		site := siteUnregister
		if !e.v.AtLeast(7, 0) {
			site = siteUnregister61
		}
		e.comError(fmt.Sprintf("Cannot unregister the machine '%s' while it is locked", m.Name), codeInvalidObject, "MachineWrap", "IMachine", site)
		return exitFailure
	}
	if err := e.h.update(func(w *World) error {
		kept := w.VMs[:0]
		for _, x := range w.VMs {
			if x.UUID == m.UUID {
				if x.Spare {
					w.Spares = append(w.Spares, Backing{QGASocket: x.QGASocket, QMPSocket: x.QMPSocket})
				}
				continue
			}
			kept = append(kept, x)
		}
		if len(kept) == len(w.VMs) {
			return errors.New("machine unregistered meanwhile")
		}
		w.VMs = kept
		return nil
	}); err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	if del {
		// Machine::deleteConfig: the snapshots' images go too.
		for _, s := range m.Snapshots {
			if s.QEMUTag == "" {
				continue
			}
			if _, err := qemuSnapshot(m, qmp.StateImage.Delete, s.QEMUTag); err != nil {
				e.errorf("emulator: snapshot-delete: %v", err)
				return exitFailure
			}
		}
		e.progress()
	}
	return exitSuccess
}
