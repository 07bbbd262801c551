package qemu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/vmgate/vmgate/hypervisor"
)

// Snapshots are QEMU internal snapshots taken with QMP's job-based
// snapshot-save, snapshot-load and snapshot-delete (QEMU 6.0 and later):
// the VM's memory and device state go into its first writable qcow2 disk
// and every writable qcow2 disk gets a disk snapshot of the same name.
// A revert therefore returns the whole VM, RAM included, to the moment of
// the snapshot, and the guest runs on from there (QEMU resumes it when it
// was running).
//
// memory: false is not offered: snapshot-save always writes the VM state,
// and QEMU cannot load a disk-only internal snapshot into a running VM
// (only qemu-img can apply one, to a disk no QEMU has open), so a
// disk-only request is hypervisor.ErrSnapshotDiskOnly. A snapshot made
// outside vmgate without VM state is listed (Memory false) but reverting
// to it is ErrNotSupported.
//
// A VM with a writable disk that is not qcow2 cannot be snapshotted: QEMU
// would snapshot the qcow2 disks only, leaving the other inconsistent; the
// driver refuses with ErrNotSupported.
//
// The jobs are waited for by polling query-jobs (each poll a fresh QMP
// connection, so other tools can use the socket between polls; QEMU
// answers no QMP command while it saves or loads the VM state), then
// dismissed; a failed job's error is QEMU's own text. Descriptions, which
// qcow2 snapshots cannot hold, are kept by the driver: in
// <LabDir>/<vm>/snapshots.json for a lab VM, in memory (until the plugin
// restarts) for a configured one. Snapshot operations on one VM are
// serialised.

var (
	_ hypervisor.Snapshotter        = (*Driver)(nil)
	_ hypervisor.SnapshotIDReverter = (*Driver)(nil)
)

// snapJobPrefix starts the ids of the jobs the driver creates.
const snapJobPrefix = "vmgate-snap-"

// SnapshotModes implements hypervisor.Snapshotter: snapshots with memory only.
func (d *Driver) SnapshotModes() hypervisor.SnapshotModes {
	return hypervisor.SnapshotModes{Memory: true}
}

// snapState is a VM's snapshot lock and, for configured VMs, descriptions.
// The zero value is ready to use.
type snapState struct {
	once sync.Once
	// sem is a one-slot semaphore held by the snapshot operation running
	// on the VM (a channel, so waiting for it honours the caller's context).
	sem chan struct{}
	// memMu guards mem.
	memMu sync.Mutex
	mem   []snapMeta
}

// lock takes the VM's snapshot slot, or fails when ctx ends first.
func (s *snapState) lock(ctx context.Context) error {
	s.once.Do(func() { s.sem = make(chan struct{}, 1) })
	select {
	case s.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for another snapshot operation on the VM: %w", hypervisor.ErrTimeout, ctx.Err())
	}
}

func (s *snapState) unlock() { <-s.sem }

// snapMeta is what the driver keeps of a snapshot: its description, tied
// to the snapshot's name and creation time (so a snapshot made again under
// the same name outside vmgate does not inherit it).
type snapMeta struct {
	Name        string `json:"name"`
	DateSec     int64  `json:"date_sec"`
	DateNsec    int64  `json:"date_nsec"`
	Description string `json:"description"`
}

// snapDisks is what query-block says about a VM's disks.
type snapDisks struct {
	// nodes are the writable qcow2 nodes; nodes[0] holds the VM state.
	nodes []string
	// snaps are the snapshots of nodes[0].
	snaps []raw.SnapshotInfo
	// onAll: names of snapshots present on every node.
	onAll map[string]bool
}

func (s snapDisks) find(name string) (raw.SnapshotInfo, bool) {
	for _, sn := range s.snaps {
		if sn.Name == name {
			return sn, true
		}
	}
	return raw.SnapshotInfo{}, false
}

// readDisks reads the VM's disks (query-block, typed by go-qemu) and
// refuses a VM whose writable disks cannot all hold internal snapshots.
func readDisks(s qmpSession) (snapDisks, error) {
	blocks, err := s.Raw.QueryBlock()
	if err != nil {
		return snapDisks{}, err
	}
	out := snapDisks{onAll: map[string]bool{}}
	count := map[string]int{}
	for _, b := range blocks {
		in := b.Inserted
		if in == nil || in.Ro {
			continue
		}
		if in.Drv != "qcow2" {
			return snapDisks{}, fmt.Errorf("%w: disk %s is %s, which cannot hold internal snapshots (every writable disk must be qcow2)",
				hypervisor.ErrNotSupported, in.File, in.Drv)
		}
		if in.NodeName == nil || *in.NodeName == "" {
			return snapDisks{}, fmt.Errorf("%w: disk %s has no block node name", hypervisor.ErrNotSupported, in.File)
		}
		out.nodes = append(out.nodes, *in.NodeName)
		if len(out.nodes) == 1 {
			out.snaps = in.Image.Snapshots
		}
		seen := map[string]bool{}
		for _, sn := range in.Image.Snapshots {
			if !seen[sn.Name] {
				seen[sn.Name] = true
				count[sn.Name]++
			}
		}
	}
	if len(out.nodes) == 0 {
		return snapDisks{}, fmt.Errorf("%w: the VM has no writable qcow2 disk to hold snapshots", hypervisor.ErrNotSupported)
	}
	for name, n := range count {
		if n == len(out.nodes) {
			out.onAll[name] = true
		}
	}
	slices.SortStableFunc(out.snaps, func(a, b raw.SnapshotInfo) int {
		if c := cmpInt(a.DateSec, b.DateSec); c != 0 {
			return c
		}
		return cmpInt(a.DateNsec, b.DateNsec)
	})
	return out, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// prepared is a snapshot operation ready to run its job: the VM with its
// snapshot slot held (unlock releases it) and its disks.
type prepared struct {
	vm     *vmState
	disks  snapDisks
	unlock func()
}

// prepare is the common start of the operations that run a job: it takes
// the VM's snapshot slot, reads its disks and, on the same QMP connection,
// runs check on them and dismisses stale jobs. On error nothing is held.
func (d *Driver) prepare(ctx context.Context, op, name string, check func(s qmpSession, disks snapDisks) error) (prepared, error) {
	vm, err := d.lookup(op, name)
	if err != nil {
		return prepared{}, err
	}
	if err := vm.snap.lock(ctx); err != nil {
		return prepared{}, fmt.Errorf("qemu: %s: %w", op, err)
	}
	p := prepared{vm: vm, unlock: vm.snap.unlock}
	err = vm.withQMP(ctx, func(s qmpSession) error {
		var err error
		if p.disks, err = readDisks(s); err != nil {
			return err
		}
		if err := check(s, p.disks); err != nil {
			return err
		}
		dismissStaleJobs(s, d)
		return nil
	})
	if err != nil {
		p.unlock()
		return prepared{}, snapError(op, err)
	}
	return p, nil
}

// SnapshotCreate takes a snapshot with memory (see the comment above).
func (d *Driver) SnapshotCreate(ctx context.Context, name string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
	const op = "snapshot create"
	if err := hypervisor.ValidateSnapshotRequest(req); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("qemu: %s: %w", op, err)
	}
	if err := hypervisor.CheckSnapshotMode(d.SnapshotModes(), req); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("qemu: %s: %w: QEMU's snapshot-save always saves the VM's memory and device state with its disks; ask for a snapshot with memory", op, err)
	}
	p, err := d.prepare(ctx, op, name, func(_ qmpSession, disks snapDisks) error {
		if _, ok := disks.find(req.Name); ok {
			return fmt.Errorf("%w: %q", hypervisor.ErrSnapshotExists, req.Name)
		}
		return nil
	})
	if err != nil {
		return hypervisor.Snapshot{}, err
	}
	defer p.unlock()
	vm, disks := p.vm, p.disks
	args := map[string]any{"tag": req.Name, "vmstate": disks.nodes[0], "devices": disks.nodes}
	if err := d.runJob(ctx, vm, "snapshot-save", args); err != nil {
		return hypervisor.Snapshot{}, snapError(op, err)
	}
	var info raw.SnapshotInfo
	err = vm.withQMP(ctx, func(s qmpSession) error {
		after, err := readDisks(s)
		if err != nil {
			return err
		}
		var ok bool
		if info, ok = after.find(req.Name); !ok {
			return fmt.Errorf("snapshot-save succeeded but %q is not listed", req.Name)
		}
		return nil
	})
	if err != nil {
		return hypervisor.Snapshot{}, snapError(op, err)
	}
	meta := snapMeta{Name: info.Name, DateSec: info.DateSec, DateNsec: info.DateNsec, Description: req.Description}
	if err := d.putMeta(vm, meta); err != nil {
		d.log.Warn("snapshot description not kept", "vm", vm.name, "snapshot", req.Name, "err", err)
	}
	return toSnapshot(info, req.Description), nil
}

// SnapshotList returns the VM's snapshots (those of the disk holding the VM
// state), oldest first.
func (d *Driver) SnapshotList(ctx context.Context, name string) ([]hypervisor.Snapshot, error) {
	const op = "snapshot list"
	vm, err := d.lookup(op, name)
	if err != nil {
		return nil, err
	}
	var disks snapDisks
	err = vm.withQMP(ctx, func(s qmpSession) error {
		disks, err = readDisks(s)
		return err
	})
	if err != nil {
		return nil, snapError(op, err)
	}
	metas := d.metas(vm)
	out := make([]hypervisor.Snapshot, 0, len(disks.snaps))
	for _, sn := range disks.snaps {
		out = append(out, toSnapshot(sn, describe(metas, sn)))
	}
	return out, nil
}

// SnapshotRevert loads the named snapshot: the VM's memory, devices and
// disks return to that moment. The agent connection is reset (the guest
// agent is back in the snapshot's state).
func (d *Driver) SnapshotRevert(ctx context.Context, name, snap string) error {
	return d.revert(ctx, name, snap, nil)
}

// SnapshotRevertID implements hypervisor.SnapshotIDReverter: the identity
// is checked on the disks read under the VM's snapshot lock, on the QMP
// connection that then starts the load.
func (d *Driver) SnapshotRevertID(ctx context.Context, name, snap, id string) error {
	return d.revert(ctx, name, snap, &id)
}

// revert is SnapshotRevert, bound to identity *id when id is set.
func (d *Driver) revert(ctx context.Context, name, snap string, id *string) error {
	const op = "snapshot revert"
	if err := hypervisor.ValidateSnapshotName(snap); err != nil {
		return fmt.Errorf("qemu: %s: %w", op, err)
	}
	var wasRunning bool
	p, err := d.prepare(ctx, op, name, func(s qmpSession, disks snapDisks) error {
		sn, ok := disks.find(snap)
		if ok && id != nil {
			if err := hypervisor.CheckSnapshotID(toSnapshot(sn, ""), *id); err != nil {
				return err
			}
		}
		switch {
		case !ok:
			return fmt.Errorf("%w: %q", hypervisor.ErrSnapshotNotFound, snap)
		case sn.VMStateSize == 0:
			return fmt.Errorf("%w: snapshot %q has no VM state (it was taken without memory, outside vmgate); QEMU cannot load it into a running VM", hypervisor.ErrNotSupported, snap)
		case !disks.onAll[snap]:
			return fmt.Errorf("%w: snapshot %q is not on every disk of the VM", hypervisor.ErrNotSupported, snap)
		}
		st, err := s.Raw.QueryStatus()
		wasRunning = err == nil && st.Running
		return err
	})
	if err != nil {
		return err
	}
	defer p.unlock()
	vm, disks := p.vm, p.disks
	defer d.closeVM(vm) // the guest agent is back in the snapshot's state: resynchronise, forget its info and commands
	args := map[string]any{"tag": snap, "vmstate": disks.nodes[0], "devices": disks.nodes}
	if err := d.runJob(ctx, vm, "snapshot-load", args); err != nil {
		return snapError(op, d.afterFailedLoad(ctx, vm, wasRunning, err))
	}
	return nil
}

// afterFailedLoad deals with the VM a failed snapshot-load leaves stopped
// (QEMU's status restore-vm): when QEMU refused before loading anything
// (the snapshot was gone) a VM that was running is resumed; otherwise it
// stays stopped, and the error says so.
func (d *Driver) afterFailedLoad(ctx context.Context, vm *vmState, wasRunning bool, loadErr error) error {
	var je *jobError
	if !errors.As(loadErr, &je) {
		return loadErr
	}
	if wasRunning && strings.Contains(je.Desc, "does not exist") {
		if _, err := vm.qmp(ctx, "cont"); err != nil {
			return fmt.Errorf("%w; resuming the VM failed too: %w", loadErr, err)
		}
		return loadErr
	}
	status, err := vm.queryStatus(ctx)
	if err == nil && stateOf(status) != hypervisor.StateRunning {
		return fmt.Errorf("%w; QEMU left the VM stopped (status %s) with its state possibly half loaded: revert to another snapshot or reset the VM", loadErr, status)
	}
	return loadErr
}

// SnapshotDelete removes the named snapshot from every disk.
func (d *Driver) SnapshotDelete(ctx context.Context, name, snap string) error {
	const op = "snapshot delete"
	if err := hypervisor.ValidateSnapshotName(snap); err != nil {
		return fmt.Errorf("qemu: %s: %w", op, err)
	}
	p, err := d.prepare(ctx, op, name, func(_ qmpSession, disks snapDisks) error {
		// QEMU's snapshot-delete succeeds for a name no disk has.
		if _, ok := disks.find(snap); !ok {
			return fmt.Errorf("%w: %q", hypervisor.ErrSnapshotNotFound, snap)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer p.unlock()
	vm, disks := p.vm, p.disks
	if err := d.runJob(ctx, vm, "snapshot-delete", map[string]any{"tag": snap, "devices": disks.nodes}); err != nil {
		return snapError(op, err)
	}
	if err := d.dropMeta(vm, snap); err != nil {
		d.log.Warn("snapshot description not removed", "vm", vm.name, "snapshot", snap, "err", err)
	}
	return nil
}

// snapshotID is a snapshot's identity as QEMU gives it (query-block's
// SnapshotInfo, what `info snapshots` shows): its id on the disk, when it
// was taken (to the microsecond), the size of its VM state and the guest's
// clock at that moment. A snapshot deleted and taken anew under the same
// name differs in its date and clock, whatever its id.
func snapshotID(sn raw.SnapshotInfo) string {
	return fmt.Sprintf("qemu:%s:%d.%09d:%d:%d.%09d", sn.ID, sn.DateSec, sn.DateNsec, sn.VMStateSize, sn.VMClockSec, sn.VMClockNsec)
}

func toSnapshot(sn raw.SnapshotInfo, desc string) hypervisor.Snapshot {
	out := hypervisor.Snapshot{Name: sn.Name, ID: snapshotID(sn), Description: desc, Memory: sn.VMStateSize > 0, SizeBytes: sn.VMStateSize}
	if sn.DateSec > 0 {
		out.CreatedAt = time.Unix(sn.DateSec, sn.DateNsec).UTC()
	}
	return out
}

// jobError is a snapshot job that concluded with an error: QEMU's text.
type jobError struct {
	Job  string // snapshot-save, ...
	Desc string
}

func (e *jobError) Error() string { return e.Job + " failed in QEMU: " + e.Desc }

// Unwrap maps QEMU's messages for an existing and a missing snapshot
// ("Snapshot 's1' already exists in one or more devices", "... does not
// exist in one or more devices") to the sentinels.
func (e *jobError) Unwrap() error {
	switch {
	case strings.Contains(e.Desc, "already exists"):
		return hypervisor.ErrSnapshotExists
	case strings.Contains(e.Desc, "does not exist"):
		return hypervisor.ErrSnapshotNotFound
	}
	return nil
}

// snapError prefixes err and maps the QMP transport's errors (vmError).
func snapError(op string, err error) error {
	return vmError(op, err)
}

// qmpJob is one row of query-jobs.
type qmpJob struct {
	ID     string `json:"id"`
	Type   string `json:"type"`
	Status string `json:"status"`
	Error  string `json:"error"`
}

func newJobID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return snapJobPrefix + hex.EncodeToString(b[:])
}

// runJob starts a snapshot job, waits until it has concluded, dismisses it
// and returns its error as a *jobError.
func (d *Driver) runJob(ctx context.Context, vm *vmState, command string, args map[string]any) error {
	id := newJobID()
	args["job-id"] = id
	if err := vm.withQMP(ctx, func(s qmpSession) error { return s.Run(command, args, nil) }); err != nil {
		return err
	}
	var b hypervisor.Backoff
	for {
		var job *qmpJob
		err := vm.withQMP(ctx, func(s qmpSession) error {
			var jobs []qmpJob
			if err := s.Run("query-jobs", nil, &jobs); err != nil {
				return err
			}
			for i := range jobs {
				if jobs[i].ID == id {
					job = &jobs[i]
				}
			}
			if job == nil || job.Status != "concluded" {
				return nil
			}
			if err := s.Run("job-dismiss", map[string]any{"id": id}, nil); err != nil {
				d.log.Warn("job-dismiss failed", "vm", vm.name, "job", id, "err", err)
			}
			return nil
		})
		switch {
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("%w: waiting for %s (job %s, which goes on in QEMU): %w", hypervisor.ErrTimeout, command, id, ctx.Err())
		case err != nil:
			return err
		case job == nil:
			return fmt.Errorf("%s: job %s vanished from query-jobs", command, id)
		case job.Status == "concluded" && job.Error != "":
			return &jobError{Job: command, Desc: job.Error}
		case job.Status == "concluded":
			return nil
		}
		if b.Sleep(ctx, 0) != nil {
			return fmt.Errorf("%w: waiting for %s (job %s, which goes on in QEMU): %w", hypervisor.ErrTimeout, command, id, ctx.Err())
		}
	}
}

// dismissStaleJobs dismisses concluded jobs of ours left by an earlier
// process that gave up waiting (best effort).
func dismissStaleJobs(s qmpSession, d *Driver) {
	var jobs []qmpJob
	if err := s.Run("query-jobs", nil, &jobs); err != nil {
		return
	}
	for _, j := range jobs {
		if strings.HasPrefix(j.ID, snapJobPrefix) && j.Status == "concluded" {
			if err := s.Run("job-dismiss", map[string]any{"id": j.ID}, nil); err != nil {
				d.log.Debug("dismissing a stale job failed", "job", j.ID, "err", err)
			}
		}
	}
}
