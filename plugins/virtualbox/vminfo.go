package virtualbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// machineInfo is the part of showvminfo --machinereadable the driver uses.
type machineInfo struct {
	State string
	// UUID is the machine's UUID, as showvminfo prints it (lower case).
	UUID     string
	RunLevel int
	// Version is the Guest Additions' "7.1.6 r167084", empty when none.
	Version string
	// ServiceActive: the "VirtualBox System Service" facility (VBoxService)
	// is active (AdditionsFacilityStatus_Active, 50).
	ServiceActive bool
	// CfgFile is the machine's settings file (<name>.vbox) on the host.
	CfgFile string
}

// additionsAtLeast reports whether the Guest Additions are major.minor or
// newer.
func (mi machineInfo) additionsAtLeast(major, minor int) bool {
	f := strings.FieldsFunc(mi.Version, func(r rune) bool { return r == '.' || r == ' ' || r == '_' })
	if len(f) < 2 {
		return false
	}
	a, err1 := strconv.Atoi(f[0])
	b, err2 := strconv.Atoi(f[1])
	return err1 == nil && err2 == nil && (a > major || a == major && b >= minor)
}

// ParseMachineReadable parses `showvminfo --machinereadable` output:
// key=value lines; string keys and values are in double quotes with '"'
// and '\' escaped by '\' (VBoxManageInfo.cpp outputMachineReadableString),
// numbers are bare. Snapshot names are printed raw, and a line may hold a
// key whose name contains '=' in quotes.
func ParseMachineReadable(out []byte) map[string]string {
	kv := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimRight(line, "\r")
		k, rest, ok := cutKey(line)
		if !ok {
			continue
		}
		kv[k] = unquote(rest)
	}
	return kv
}

// cutKey splits a machine-readable line into its key and the value text.
func cutKey(line string) (string, string, bool) {
	if strings.HasPrefix(line, `"`) {
		k, n, ok := readQuoted(line)
		if !ok || n >= len(line) || line[n] != '=' {
			return "", "", false
		}
		return k, line[n+1:], true
	}
	k, v, ok := strings.Cut(line, "=")
	return k, v, ok
}

// readQuoted reads a quoted, backslash-escaped string at the start of s
// and returns it and the index after its closing quote.
func readQuoted(s string) (string, int, bool) {
	var sb strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i+1 < len(s) {
				i++
				sb.WriteByte(s[i])
			}
		case '"':
			return sb.String(), i + 1, true
		default:
			sb.WriteByte(s[i])
		}
	}
	return "", 0, false
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		if v, n, ok := readQuoted(s); ok && n == len(s) {
			return v
		}
		return s[1 : len(s)-1]
	}
	return s
}

func (d *Driver) showVMInfo(ctx context.Context, op, name string) (machineInfo, error) {
	r, err := d.vbox(ctx, "showvminfo", name, "--machinereadable")
	if err != nil {
		return machineInfo{}, ctxError(op, err)
	}
	if r.code != 0 {
		return machineInfo{}, vboxError(op, r)
	}
	kv := ParseMachineReadable(r.stdout)
	mi := machineInfo{State: kv["VMState"], UUID: kv["UUID"], Version: kv["GuestAdditionsVersion"], CfgFile: kv["CfgFile"]}
	if mi.State == "" {
		return machineInfo{}, fmt.Errorf("virtualbox: %s: showvminfo printed no VMState", op)
	}
	mi.RunLevel, _ = strconv.Atoi(kv["GuestAdditionsRunLevel"])
	status, _, _ := strings.Cut(kv["GuestAdditionsFacility_VirtualBox System Service"], ",")
	mi.ServiceActive = status == "50"
	return mi, nil
}

func stateOf(vmState string) hypervisor.State {
	switch vmState {
	case "running":
		return hypervisor.StateRunning
	case "paused":
		return hypervisor.StatePaused
	case "poweroff", "saved", "aborted", "aborted-saved", "teleported":
		return hypervisor.StateStopped
	}
	return hypervisor.StateUnknown
}

// ParseListVMs parses `VBoxManage list vms`: one `"name" {uuid}` per line
// (showVMInfo's VMINFO_COMPACT form; the name is printed raw). Machines
// whose settings cannot be read are listed as "<inaccessible>" and left
// out.
func ParseListVMs(out []byte) ([]string, error) {
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" {
			continue
		}
		i := strings.LastIndex(line, "\" {")
		if !strings.HasPrefix(line, "\"") || i < 1 || !strings.HasSuffix(line, "}") {
			return nil, fmt.Errorf("unexpected line %q", line)
		}
		if name := line[1:i]; name != "<inaccessible>" {
			names = append(names, name)
		}
	}
	return names, nil
}

// ListVMs lists the registered VMs with their states, sorted by name. VMs
// whose names the driver refuses (see CheckVMName) are left out.
func (d *Driver) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	r, err := d.vbox(ctx, "list", "vms")
	if err != nil {
		return nil, ctxError("list vms", err)
	}
	if r.code != 0 {
		return nil, vboxError("list vms", r)
	}
	names, err := ParseListVMs(r.stdout)
	if err != nil {
		return nil, fmt.Errorf("virtualbox: list vms: %w", err)
	}
	sort.Strings(names)
	var vms []hypervisor.VM
	for _, name := range names {
		if CheckVMName(name) != nil {
			d.log.Warn("skipping a VM whose name vmgate refuses", "name", name)
			continue
		}
		mi, err := d.showVMInfo(ctx, "list vms", name)
		if errors.Is(err, hypervisor.ErrUnknownVM) {
			continue // unregistered meanwhile
		}
		if err != nil {
			return nil, err
		}
		vms = append(vms, hypervisor.VM{Name: name, State: stateOf(mi.State), Info: "VMState " + mi.State, Agent: mi.RunLevel > 0})
	}
	return vms, nil
}

// Status reports VMState and whether the Guest Additions run.
func (d *Driver) Status(ctx context.Context, name string) (hypervisor.Status, error) {
	if err := d.checkName("status", name); err != nil {
		return hypervisor.Status{}, err
	}
	mi, err := d.showVMInfo(ctx, "status", name)
	if err != nil {
		return hypervisor.Status{}, err
	}
	st := hypervisor.Status{Name: name, State: stateOf(mi.State), Detail: mi.State}
	if st.State == hypervisor.StateRunning && mi.RunLevel > 0 {
		st.AgentConnected = true
		st.AgentVersion = mi.Version
	}
	return st, nil
}

// AgentInfo reports the Guest Additions version and the operations the
// driver offers. Guest Additions have no command list: whether guest
// control works is probed by running `/bin/sh -c :` in the guest; the file
// commands use the same service.
func (d *Driver) AgentInfo(ctx context.Context, name string) (hypervisor.AgentInfo, error) {
	if err := d.checkName("agent info", name); err != nil {
		return hypervisor.AgentInfo{}, err
	}
	mi, err := d.showVMInfo(ctx, "agent info", name)
	if err != nil {
		return hypervisor.AgentInfo{}, err
	}
	if stateOf(mi.State) != hypervisor.StateRunning || mi.RunLevel == 0 {
		return hypervisor.AgentInfo{}, fmt.Errorf("virtualbox: agent info: %w: VMState %s, Guest Additions run level %d", hypervisor.ErrAgentUnavailable, mi.State, mi.RunLevel)
	}
	enabled, err := d.probe(ctx, name)
	if err != nil {
		return hypervisor.AgentInfo{}, err
	}
	info := hypervisor.AgentInfo{Version: mi.Version}
	if info.Version == "" {
		info.Version = "run level " + strconv.Itoa(mi.RunLevel)
	}
	for _, c := range []string{"guest-exec", "guest-exec-status", "guest-file-read", "guest-file-write"} {
		info.Commands = append(info.Commands, hypervisor.AgentCommand{Name: c, Enabled: enabled})
	}
	return info, nil
}

// probe reports whether guest control can run a process in vm.
func (d *Driver) probe(ctx context.Context, vm string) (bool, error) {
	res, err := d.runOnce(ctx, "agent info", vm, runSpec{argv: []string{"/bin/sh", "-c", ":"}, timeout: time.Minute, limit: 4096})
	switch {
	case errors.Is(err, hypervisor.ErrCommandDisabled):
		return false, nil
	case err != nil:
		return false, err
	case !res.Exited || res.ExitCode != 0:
		return false, fmt.Errorf("virtualbox: agent info: probe `/bin/sh -c :` ended with exit %d, signal %d", res.ExitCode, res.Signal)
	}
	return true, nil
}

// disabledOrUnavailable refines "The guest execution service is not
// ready": when VBoxService is active but no guest control client is
// connected, its control service is off in the guest (VBoxService
// --disable-control): the guest has exec disabled. Otherwise the
// Additions are not up (yet).
func (d *Driver) disabledOrUnavailable(ctx context.Context, op, vm string, err error) error {
	if !errors.Is(err, errControlNotReady) {
		return err
	}
	mi, ierr := d.showVMInfo(ctx, op, vm)
	if ierr != nil || !mi.ServiceActive {
		return err
	}
	return fmt.Errorf("virtualbox: %s: %w: VBoxService runs in the guest without its guest control service (started with --disable-control); enable it to run commands or move files", op,
		&hypervisor.CommandDisabledError{Command: "guest-exec"})
}

// Power maps shutdown to the ACPI power button, reset and stop to
// controlvm reset and poweroff, start to startvm --type headless. VirtualBox
// has no guest reboot: reboot is ErrNotSupported.
func (d *Driver) Power(ctx context.Context, vm string, action hypervisor.PowerAction) error {
	if !action.Valid() {
		return fmt.Errorf("virtualbox: power: %w: unknown action %q", hypervisor.ErrInvalidArgument, action)
	}
	op := "power " + string(action)
	if err := d.checkName(op, vm); err != nil {
		return err
	}
	var args []string
	switch action {
	case hypervisor.PowerShutdown:
		args = []string{"controlvm", vm, "acpipowerbutton"}
	case hypervisor.PowerReset:
		args = []string{"controlvm", vm, "reset"}
	case hypervisor.PowerStop:
		args = []string{"controlvm", vm, "poweroff"}
	case hypervisor.PowerStart:
		// Right after a stop the VM process may still hold the session.
		return d.vboxUnlocked(ctx, op, vm, "startvm", vm, "--type", "headless")
	case hypervisor.PowerReboot:
		if _, err := d.showVMInfo(ctx, op, vm); err != nil {
			return err
		}
		return fmt.Errorf("virtualbox: %s: %w: VirtualBox has no guest reboot (use shutdown then start, or reset)", op, hypervisor.ErrNotSupported)
	}
	return d.vboxOK(ctx, op, args...)
}
