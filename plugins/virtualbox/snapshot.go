package virtualbox

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// Snapshots go through `VBoxManage snapshot VM take|restore|delete|list
// --machinereadable` (VBoxManageSnapshot.cpp handleSnapshot,
// handleSnapshotList; VBoxManageInfo.cpp showSnapshots).
//
// VirtualBox saves the memory of a machine that runs with every snapshot
// (SnapshotImpl.cpp SessionMachine::takeSnapshot composes a saved state
// file whenever the snapshot is taken online), so the driver takes
// snapshots with memory of a running (or paused) machine only. A restore
// refuses a running machine (SessionMachine::restoreSnapshot): a revert
// powers it off, restores, and starts it again; the restored saved state
// resumes the guest at the snapshot's moment.
//
// `snapshot list --machinereadable` prints each snapshot's name, UUID and
// description (raw, not escaped: a description may span lines) and marks
// the current one, but neither when a snapshot was taken nor whether it
// holds memory: those come from the machine's settings file (CfgFile, the
// Snapshot elements' timeStamp and stateFile: Settings.cpp
// MachineConfigFile::buildSnapshotXML). Where that file cannot be read
// (VBoxManage on another host), CreatedAt is zero (no created_at in the
// result) and Memory false: no VBoxManage output has a snapshot's time
// (showSnapshots prints name, UUID and description; showvminfo's
// VMStateChangeTime is the machine's LastStateChange, not a snapshot's).

var (
	_ hypervisor.Snapshotter        = (*Driver)(nil)
	_ hypervisor.SnapshotIDReverter = (*Driver)(nil)
)

// SnapshotModes: memory only (see above).
func (d *Driver) SnapshotModes() hypervisor.SnapshotModes {
	return hypervisor.SnapshotModes{Memory: true}
}

// vboxSnapshot is one snapshot as VBoxManage and the settings file show it.
type vboxSnapshot struct {
	hypervisor.Snapshot
	uuid string
}

// snapshotTaken is the UUID line of `snapshot take` (handleSnapshot:
// "Snapshot taken. UUID: %s").
var snapshotTaken = regexp.MustCompile(`(?m)^Snapshot taken\. UUID: ([0-9a-fA-F-]{36})\s*$`)

// SnapshotCreate takes req's snapshot of a running machine.
func (d *Driver) SnapshotCreate(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
	const op = "snapshot create"
	if err := d.snapshotArgs(op, vm, req.Name); err != nil {
		return hypervisor.Snapshot{}, err
	}
	if err := hypervisor.ValidateSnapshotRequest(req); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	if strings.Contains(req.Description, `"`) {
		return hypervisor.Snapshot{}, fmt.Errorf("virtualbox: %s: %w: the description holds '\"': VBoxManage lists descriptions unescaped, so it could not be read back", op, hypervisor.ErrInvalidArgument)
	}
	if err := hypervisor.CheckSnapshotMode(d.SnapshotModes(), req); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("virtualbox: %s: %w: VirtualBox saves a running machine's memory with every snapshot", op, err)
	}
	mi, err := d.showVMInfo(ctx, op, vm)
	if err != nil {
		return hypervisor.Snapshot{}, err
	}
	if mi.State != "running" && mi.State != "paused" {
		return hypervisor.Snapshot{}, fmt.Errorf("virtualbox: %s: %w: the machine is %s; VirtualBox saves memory only of a running machine (start it first)", op, hypervisor.ErrSnapshotMemory, mi.State)
	}
	snaps, err := d.snapshots(ctx, op, vm, mi.CfgFile)
	if err != nil {
		return hypervisor.Snapshot{}, err
	}
	if findByName(snaps, req.Name) != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("virtualbox: %s: %w: %q", op, hypervisor.ErrSnapshotExists, req.Name)
	}
	args := []string{"snapshot", vm, "take", req.Name}
	if req.Description != "" {
		args = append(args, "--description="+req.Description)
	}
	r, err := d.vbox(ctx, args...)
	if err != nil {
		return hypervisor.Snapshot{}, ctxError(op, err)
	}
	if r.code != 0 {
		return hypervisor.Snapshot{}, snapshotError(op, r)
	}
	m := snapshotTaken.FindSubmatch(r.stdout)
	if m == nil {
		return hypervisor.Snapshot{}, fmt.Errorf("virtualbox: %s: %w: VBoxManage printed no snapshot UUID: %q", op, hypervisor.ErrBackend, r.stdout)
	}
	if snaps, err = d.snapshots(ctx, op, vm, mi.CfgFile); err != nil {
		return hypervisor.Snapshot{}, err
	}
	for _, s := range snaps {
		if strings.EqualFold(s.uuid, string(m[1])) {
			return s.Snapshot, nil
		}
	}
	return hypervisor.Snapshot{}, fmt.Errorf("virtualbox: %s: %w: snapshot %s is not listed after it was taken", op, hypervisor.ErrBackend, m[1])
}

// SnapshotList lists vm's snapshots, oldest first.
func (d *Driver) SnapshotList(ctx context.Context, vm string) ([]hypervisor.Snapshot, error) {
	const op = "snapshot list"
	if err := d.checkName(op, vm); err != nil {
		return nil, err
	}
	mi, err := d.showVMInfo(ctx, op, vm)
	if err != nil {
		return nil, err
	}
	snaps, err := d.snapshots(ctx, op, vm, mi.CfgFile)
	if err != nil {
		return nil, err
	}
	out := make([]hypervisor.Snapshot, len(snaps))
	for i, s := range snaps {
		out[i] = s.Snapshot
	}
	return out, nil
}

// SnapshotRevert returns vm to the named snapshot: a running machine is
// powered off first (restore refuses it), and started again after, as is
// a machine restored to a saved state: it runs on from the snapshot.
func (d *Driver) SnapshotRevert(ctx context.Context, vm, name string) error {
	return d.revert(ctx, vm, name, nil)
}

// SnapshotRevertID implements hypervisor.SnapshotIDReverter: the identity
// is the snapshot's UUID, which is what `snapshot restore` is given, so a
// snapshot made anew under the name is never the one restored.
func (d *Driver) SnapshotRevertID(ctx context.Context, vm, name, id string) error {
	return d.revert(ctx, vm, name, &id)
}

// revert is SnapshotRevert, bound to identity *id when id is set.
func (d *Driver) revert(ctx context.Context, vm, name string, id *string) error {
	const op = "snapshot revert"
	s, mi, err := d.resolveSnapshot(ctx, op, vm, name)
	if err != nil {
		return err
	}
	if id != nil {
		if err := hypervisor.CheckSnapshotID(s.Snapshot, *id); err != nil {
			return fmt.Errorf("virtualbox: %s: %w", op, err)
		}
	}
	wasRunning := mi.State == "running" || mi.State == "paused"
	step := func(what string, args ...string) func() error {
		return func() error {
			r, err := d.vbox(ctx, args...)
			if err != nil {
				return ctxError(op+": "+what, err)
			}
			if r.code != 0 {
				return snapshotError(op+": "+what, r)
			}
			return nil
		}
	}
	var steps []func() error
	if wasRunning {
		steps = append(steps, step("power off", "controlvm", vm, "poweroff"))
	}
	steps = append(steps, step("restore", "snapshot", vm, "restore", s.uuid))
	if wasRunning || s.Memory {
		steps = append(steps, func() error {
			// The VM process the power off ended may still hold the session.
			return d.vboxUnlocked(ctx, op+": start", vm, "startvm", vm, "--type", "headless")
		})
	}
	// Commands running in the guest end with the machine.
	d.execs.Forget(vm)
	for _, run := range steps {
		if err := run(); err != nil {
			return err
		}
	}
	return nil
}

// SnapshotDelete deletes the named snapshot (VirtualBox merges its disk
// changes into its child; the machine's state is unchanged).
func (d *Driver) SnapshotDelete(ctx context.Context, vm, name string) error {
	const op = "snapshot delete"
	s, _, err := d.resolveSnapshot(ctx, op, vm, name)
	if err != nil {
		return err
	}
	r, err := d.vbox(ctx, "snapshot", vm, "delete", s.uuid)
	if err != nil {
		return ctxError(op, err)
	}
	if r.code != 0 {
		return snapshotError(op, r)
	}
	return nil
}

// snapshotArgs checks the VM and snapshot names before anything runs.
func (d *Driver) snapshotArgs(op, vm, name string) error {
	if err := d.checkName(op, vm); err != nil {
		return err
	}
	if err := hypervisor.ValidateSnapshotName(name); err != nil {
		return fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	return nil
}

// resolveSnapshot finds the named snapshot: VBoxManage is then given its
// UUID, since it takes an argument that looks like a UUID for one
// (Machine::findSnapshot), and a valid name can look like one.
func (d *Driver) resolveSnapshot(ctx context.Context, op, vm, name string) (vboxSnapshot, machineInfo, error) {
	if err := d.snapshotArgs(op, vm, name); err != nil {
		return vboxSnapshot{}, machineInfo{}, err
	}
	mi, err := d.showVMInfo(ctx, op, vm)
	if err != nil {
		return vboxSnapshot{}, machineInfo{}, err
	}
	snaps, err := d.snapshots(ctx, op, vm, mi.CfgFile)
	if err != nil {
		return vboxSnapshot{}, machineInfo{}, err
	}
	s := findByName(snaps, name)
	if s == nil {
		return vboxSnapshot{}, machineInfo{}, fmt.Errorf("virtualbox: %s: %w: %q", op, hypervisor.ErrSnapshotNotFound, name)
	}
	return *s, mi, nil
}

// findByName returns the first snapshot named name (VirtualBox allows
// several; the driver never makes a second).
func findByName(snaps []vboxSnapshot, name string) *vboxSnapshot {
	for i := range snaps {
		if snaps[i].Name == name {
			return &snaps[i]
		}
	}
	return nil
}

// snapshotError maps a failed snapshot command.
func snapshotError(op string, r result) error {
	msg := errorText(r.stderr)
	if strings.Contains(msg, "Could not find a snapshot") {
		return fmt.Errorf("virtualbox: %s: %w: %s", op, hypervisor.ErrSnapshotNotFound, msg)
	}
	return vboxError(op, r)
}

// snapshots lists vm's snapshots: the tree from `snapshot list
// --machinereadable`, the time and memory from the settings file.
func (d *Driver) snapshots(ctx context.Context, op, vm, cfgFile string) ([]vboxSnapshot, error) {
	r, err := d.vbox(ctx, "snapshot", vm, "list", "--machinereadable")
	if err != nil {
		return nil, ctxError(op, err)
	}
	if r.code != 0 {
		// handleSnapshotList: "This machine does not have any snapshots"
		// on stdout, exit 1.
		if strings.Contains(string(r.stdout), "does not have any snapshots") && len(errorText(r.stderr)) == 0 {
			return nil, nil
		}
		return nil, vboxError(op, r)
	}
	snaps, err := ParseSnapshotList(r.stdout)
	if err != nil {
		return nil, fmt.Errorf("virtualbox: %s: %w: %w", op, hypervisor.ErrBackend, err)
	}
	if facts, err := readSnapshotSettings(cfgFile); err != nil {
		d.log.Debug("snapshot times and memory unknown: the settings file cannot be read", "vm", vm, "file", cfgFile, "err", err)
	} else {
		for i := range snaps {
			if f, ok := facts[strings.ToLower(snaps[i].uuid)]; ok {
				snaps[i].CreatedAt, snaps[i].Memory = f.at, f.memory
			}
		}
	}
	slices.SortStableFunc(snaps, func(a, b vboxSnapshot) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return snaps, nil
}

// ParseSnapshotList parses `snapshot VM list --machinereadable`
// (VBoxManageInfo.cpp showSnapshots): SnapshotName<suffix>,
// SnapshotUUID<suffix> and SnapshotDescription<suffix> per snapshot, the
// suffix its place in the tree ("", "-1", "-1-2"), and CurrentSnapshotUUID.
// Names and descriptions are printed raw: a description runs on over the
// following lines until one ends with '"'.
func ParseSnapshotList(out []byte) ([]vboxSnapshot, error) {
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	type node struct {
		name, uuid, desc string
	}
	nodes := map[string]*node{}
	var order []string
	current := ""
	get := func(suffix string) *node {
		if nodes[suffix] == nil {
			nodes[suffix] = &node{}
			order = append(order, suffix)
		}
		return nodes[suffix]
	}
	for i := 0; i < len(lines); i++ {
		k, v, ok := strings.Cut(lines[i], "=")
		if !ok || !strings.HasPrefix(v, `"`) {
			return nil, fmt.Errorf("snapshot list: unexpected line %q", lines[i])
		}
		for len(v) < 2 || !strings.HasSuffix(v, `"`) {
			if i+1 >= len(lines) {
				return nil, fmt.Errorf("snapshot list: unterminated value of %s", k)
			}
			i++
			v += "\n" + lines[i]
		}
		v = v[1 : len(v)-1]
		switch {
		case strings.HasPrefix(k, "SnapshotName"):
			get(strings.TrimPrefix(k, "SnapshotName")).name = v
		case strings.HasPrefix(k, "SnapshotUUID"):
			get(strings.TrimPrefix(k, "SnapshotUUID")).uuid = v
		case strings.HasPrefix(k, "SnapshotDescription"):
			get(strings.TrimPrefix(k, "SnapshotDescription")).desc = v
		case k == "CurrentSnapshotUUID":
			current = v
		}
	}
	var snaps []vboxSnapshot
	for _, suffix := range order {
		n := nodes[suffix]
		if n.name == "" || n.uuid == "" {
			return nil, fmt.Errorf("snapshot list: snapshot %q has no name or UUID", "SnapshotName"+suffix)
		}
		s := vboxSnapshot{uuid: n.uuid, Snapshot: hypervisor.Snapshot{Name: n.name, ID: "vbox:" + strings.ToLower(n.uuid), Description: n.desc, Current: n.uuid == current}}
		if j := strings.LastIndexByte(suffix, '-'); j >= 0 {
			p := nodes[suffix[:j]]
			if p == nil {
				return nil, fmt.Errorf("snapshot list: snapshot %q has no parent", "SnapshotName"+suffix)
			}
			s.Parent = p.name
		}
		snaps = append(snaps, s)
	}
	return snaps, nil
}

// snapshotFacts is what the settings file says of one snapshot.
type snapshotFacts struct {
	at     time.Time
	memory bool
}

// xmlSnapshot is a Snapshot element of the settings file.
type xmlSnapshot struct {
	UUID      string        `xml:"uuid,attr"`
	TimeStamp string        `xml:"timeStamp,attr"`
	StateFile string        `xml:"stateFile,attr"`
	Children  []xmlSnapshot `xml:"Snapshots>Snapshot"`
}

// maxSettingsFile bounds the settings file the driver reads.
const maxSettingsFile = 16 << 20

// readSnapshotSettings reads each snapshot's timeStamp (UTC, seconds:
// ConfigFileBase::stringifyTimestamp) and whether it has a stateFile from
// the machine's settings file, keyed by lower-case UUID without braces.
func readSnapshotSettings(path string) (map[string]snapshotFacts, error) {
	if path == "" {
		return nil, errors.New("showvminfo printed no CfgFile")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var doc struct {
		Machine struct {
			Snapshot []xmlSnapshot `xml:"Snapshot"`
		} `xml:"Machine"`
	}
	if err := xml.NewDecoder(&limitedReader{f, maxSettingsFile}).Decode(&doc); err != nil {
		return nil, err
	}
	facts := map[string]snapshotFacts{}
	var walk func(ss []xmlSnapshot)
	walk = func(ss []xmlSnapshot) {
		for _, s := range ss {
			at, _ := time.Parse("2006-01-02T15:04:05Z", s.TimeStamp)
			facts[strings.ToLower(strings.Trim(s.UUID, "{}"))] = snapshotFacts{at: at, memory: s.StateFile != ""}
			walk(s.Children)
		}
	}
	walk(doc.Machine.Snapshot)
	return facts, nil
}

// limitedReader fails once more than n bytes were read.
type limitedReader struct {
	f *os.File
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("settings file too large")
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.f.Read(p)
	l.n -= int64(n)
	return n, err
}
