package vboxemu

import (
	"fmt"
	"sort"
	"time"
	"unicode"
)

// Extra data and modifyvm: the machine settings a created VM's owner sets
// after clonevm (the lease mark, memory and CPUs). Their CHECK_ERROR sites
// are in version.go.

// handleGetExtraData is VBoxManageMisc.cpp handleGetExtraData for a
// machine: one or two arguments; "enumerate" (or no key) lists "Key: %s,
// Value: %s" lines; a key prints "Value: %s" or "No value set!" (an empty
// value is no value). A machine that is not found is CHECK_ERROR's report
// and exit 1. The "global" extra data is not emulated.
func (e *emu) handleGetExtraData(args []string) int {
	if len(args) > 2 || len(args) < 1 {
		return e.syntaxError("Incorrect number of parameters")
	}
	if args[0] == "global" {
		e.errorf("emulator: global extra data is not emulated")
		return exitFailure
	}
	m := e.w.find(args[0])
	if m == nil {
		return e.notFound(args[0], siteGetExtraFindMachine)
	}
	if len(args) < 2 || args[1] == "enumerate" {
		// Machine::getExtraDataKeys: the settings' map, in key order.
		for _, k := range sortedKeys(m.ExtraData) {
			e.printf("Key: %s, Value: %s\n", k, m.ExtraData[k])
		}
		return exitSuccess
	}
	if v := m.ExtraData[args[1]]; v != "" {
		e.printf("Value: %s\n", v)
	} else {
		e.printf("No value set!\n")
	}
	return exitSuccess
}

// handleSetExtraData is VBoxManageMisc.cpp handleSetExtraData for a
// machine: at least two arguments, at most three; LockMachine(Shared),
// which a running machine allows; then Machine::setExtraData: an empty or
// missing value deletes the key; a key with a control character and a
// value is E_INVALIDARG (without error info, which the emulator reports
// as the bare code).
func (e *emu) handleSetExtraData(args []string) int {
	if len(args) < 2 {
		return e.syntaxError("Not enough parameters")
	}
	if args[0] == "global" {
		e.errorf("emulator: global extra data is not emulated")
		return exitFailure
	}
	m := e.w.find(args[0])
	if m == nil {
		return e.notFound(args[0], siteSetExtraFindMachine)
	}
	if len(args) > 3 {
		return e.syntaxError("Too many parameters")
	}
	key, value := args[1], ""
	if len(args) == 3 {
		value = args[2]
	}
	if value != "" {
		for _, r := range key {
			if r < 0x80 && unicode.IsControl(r) {
				e.errorf("Code E_INVALIDARG (0x80070057) - One or more arguments are invalid (extended info not available)")
				return exitFailure
			}
		}
	}
	if err := e.h.updateMachine(m.UUID, func(m *Machine) error {
		if value == "" {
			delete(m.ExtraData, key)
			return nil
		}
		if m.ExtraData == nil {
			m.ExtraData = map[string]string{}
		}
		m.ExtraData[key] = value
		return nil
	}); err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	return exitSuccess
}

// handleModifyVM is VBoxManageModifyVM.cpp handleModifyVM for --memory and
// --cpus: FindMachine, LockMachine(Write) (Machine::lockMachine refuses a
// machine with a VM process: "already locked for a session"), then each
// setter: Machine::setMemorySize (4 to 2097152 MB) and
// Machine::setCPUCount (1 to 64: SchemaDefs from VirtualBox-settings.xsd
// TCPUCount) check their range, then
// i_checkStateDependency(MutableStateDep), which refuses a saved machine
// ("The machine is not mutable (state is Saved)"); a failed setter stops
// the loop and nothing is saved (SaveSettings runs only on success); so
// does an option errorGetOpt reports (exit 1, not 2).
// Other modifyvm options are not emulated: the emulator reports them as
// unknown options.
func (e *emu) handleModifyVM(args []string) int {
	if len(args) < 2 {
		return e.syntaxError("Not enough parameters")
	}
	m := e.w.find(args[0])
	if m == nil {
		return e.notFound(args[0], siteModifyFindMachine)
	}
	if m.sessionLocked(time.Now()) {
		e.comError(fmt.Sprintf("The machine '%s' is already locked for a session (or being unlocked)", m.Name),
			codeInvalidObject, "MachineWrap", "IMachine", siteModifyLock)
		return exitFailure
	}
	mem, cpus := m.MemoryMB, m.CPUs
	g := newGetopt(args[1:], []optDef{
		{long: "--memory", short: 'm', id: "m", kind: reqUint32}, {long: "--cpus", id: "c", kind: reqUint32},
	}, false)
	g.stdOpts = false
	// A bad option or parameter goes to errorGetOpt without returning: the
	// loop ends on the failed status and the exit code is 1.
	onErr := func(oe *optError) int { e.getoptError(oe); return exitFailure }
	code := g.each(onErr, func(r *optResult) int {
		if r.def == nil {
			e.invalidParameter(r.value)
			return exitFailure
		}
		switch r.def.id {
		case "m":
			if r.u32 < 4 || r.u32 > 2097152 {
				return e.sessionMachineError(fmt.Sprintf("Invalid RAM size: %d MB (must be in range [4, 2097152] MB)", r.u32), codeInvalidArg, siteModifyMemory)
			}
			if code := e.mutable(m, siteModifyMemory); code >= 0 {
				return code
			}
			mem = int(r.u32)
		case "c":
			if r.u32 < 1 || r.u32 > 64 {
				return e.sessionMachineError(fmt.Sprintf("Invalid virtual CPU count: %d (must be in range [1, 64])", r.u32), codeInvalidArg, siteModifyCPUs)
			}
			if code := e.mutable(m, siteModifyCPUs); code >= 0 {
				return code
			}
			cpus = int(r.u32)
		}
		return -1
	})
	if code >= 0 {
		return code
	}
	if err := e.h.updateMachine(m.UUID, func(m *Machine) error {
		m.MemoryMB, m.CPUs = mem, cpus
		return nil
	}); err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	return exitSuccess
}

// mutable is Machine::i_checkStateDependency(MutableStateDep) on the
// session machine: PoweredOff, Aborted and Teleported are mutable.
func (e *emu) mutable(m *Machine, site contextSite) int {
	switch m.State {
	case "poweroff", "aborted", "teleported":
		return -1
	}
	return e.sessionMachineError(fmt.Sprintf("The machine is not mutable (state is %s)", machineStateName(m.State)), codeInvalidVMState, site)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
