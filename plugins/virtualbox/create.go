package virtualbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/vmgate/vmgate/hypervisor"
)

// VMs on demand: a created VM is `VBoxManage clonevm --name NAME --uuid
// UUID --register TEMPLATE`, with a UUID the driver derives from the
// lease's mark (machineUUID) so that every later step, and the cleanup of a
// failed or interrupted creation, reaches this clone and no other VM that
// took the name meanwhile; from a snapshot of the template when the source names one
// (--snapshot), linked to it when the source asks (--options link: a
// differencing disk on the snapshot's, VirtualBox's linked clone). The
// lease's mark goes into the clone's extra data (setextradata NAME
// vmgate/lease MARK); memory and CPUs are set with modifyvm before the
// clone is started headless; CreateVM returns once guest control runs a
// process in it. DeleteVM reads the mark back (getextradata), powers the
// VM off if it runs and removes it with its disks (unregistervm --delete),
// and touches no VM without the mark. A clone whose creation was cut
// between clonevm and setextradata (the plugin killed there) has no mark
// yet; it is known by its UUID, which only that mark gives.
//
// VBoxManage's own refusals become clear errors: a name already taken
// (IVirtualBox::CreateMachine: "Machine settings file ... already
// exists"), a template or snapshot missing, a linked clone without a
// snapshot (Machine::cloneTo), a VM still locked by its VM process
// (Machine::unregister). A clone of a snapshot taken while the template
// ran is "saved" (MachineCloneVM::run keeps the state file), and a saved
// machine is not mutable (Machine::i_checkStateDependency): such a
// template cannot be sized, and asking to is refused.

var _ hypervisor.Creator = (*Driver)(nil)

// TemplateSource is a VirtualBox template's source.
type TemplateSource struct {
	// VM is the registered machine to clone (name or UUID).
	VM string `json:"vm"`
	// Snapshot is the template's snapshot to clone from; empty means the
	// template's current state.
	Snapshot string `json:"snapshot,omitempty"`
	// Linked asks for a linked clone of Snapshot (which it needs).
	Linked bool `json:"linked,omitempty"`
}

// markKey is the extra data key holding a created VM's lease mark.
const markKey = "vmgate/lease"

// cleanupTimeout bounds the cleanup of a failed creation.
const cleanupTimeout = 2 * time.Minute

func (s TemplateSource) check() error {
	if err := CheckVMName(s.VM); err != nil {
		return fmt.Errorf("%w: template vm: %w", hypervisor.ErrInvalidArgument, err)
	}
	switch {
	case s.Snapshot != "" && (strings.HasPrefix(s.Snapshot, "-") || strings.ContainsAny(s.Snapshot, "\x00\r\n") || !utf8.ValidString(s.Snapshot)):
		return fmt.Errorf("%w: template snapshot %q: it may not begin with '-' nor hold NUL or a line break", hypervisor.ErrInvalidArgument, s.Snapshot)
	case s.Linked && s.Snapshot == "":
		return fmt.Errorf("%w: a linked clone needs the template's snapshot (VirtualBox links a clone to a snapshot's disks); set snapshot", hypervisor.ErrInvalidArgument)
	}
	return nil
}

// CreateVM clones the template, marks, sizes and starts the clone and
// waits until guest control runs a process in it. On failure the clone is
// removed.
func (d *Driver) CreateVM(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
	src, err := d.createArgs(req)
	if err != nil {
		return hypervisor.CreatedVM{}, err
	}
	if err := d.checkTemplate(ctx, src, req.Name); err != nil {
		return hypervisor.CreatedVM{}, err
	}
	id := machineUUID(req.Mark)
	if err := d.clone(ctx, src, req.Name, id); err != nil {
		return hypervisor.CreatedVM{}, err
	}
	if err := d.prepareClone(ctx, id, req); err != nil {
		d.undoClone(id)
		return hypervisor.CreatedVM{}, err
	}
	return hypervisor.CreatedVM{Name: req.Name}, nil
}

// createArgs validates req and decodes its source, before any side effect.
func (d *Driver) createArgs(req hypervisor.CreateRequest) (TemplateSource, error) {
	var src TemplateSource
	if err := req.Validate(); err != nil {
		return src, fmt.Errorf("virtualbox: create: %w", err)
	}
	if err := hypervisor.DecodeSource(req.Source, &src); err != nil {
		return src, fmt.Errorf("virtualbox: create: %w", err)
	}
	if err := src.check(); err != nil {
		return src, fmt.Errorf("virtualbox: create: %w", err)
	}
	return src, nil
}

// checkTemplate: the template exists and the name is free.
func (d *Driver) checkTemplate(ctx context.Context, src TemplateSource, name string) error {
	if _, err := d.showVMInfo(ctx, "create", src.VM); errors.Is(err, hypervisor.ErrUnknownVM) {
		return fmt.Errorf("virtualbox: create: %w: no template VM %q is registered; check the template's source", hypervisor.ErrInvalidArgument, src.VM)
	} else if err != nil {
		return err
	}
	if _, err := d.showVMInfo(ctx, "create", name); err == nil {
		return fmt.Errorf("virtualbox: create: %w: a VM named %q is already registered; choose another name", hypervisor.ErrInvalidArgument, name)
	} else if !errors.Is(err, hypervisor.ErrUnknownVM) {
		return err
	}
	return nil
}

// machineUUID is the UUID of the clone created for mark (a lease id): the
// first 16 bytes of SHA-256 of markKey, NUL and mark, as an RFC 9562
// version 8 (custom) UUID. The mark is unique per lease, so the UUID is;
// and a VM with this UUID was cloned by this driver for this lease even
// when its creation stopped before the mark was written.
func machineUUID(mark string) string {
	sum := sha256.Sum256([]byte(markKey + "\x00" + mark))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x80
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// clone runs clonevm; the source VM comes last, after every option (its
// name cannot begin with '-': TemplateSource.check).
func (d *Driver) clone(ctx context.Context, src TemplateSource, name, id string) error {
	args := []string{"clonevm", "--name", name, "--uuid", id, "--register"}
	if src.Snapshot != "" {
		args = append(args, "--snapshot", src.Snapshot)
	}
	if src.Linked {
		args = append(args, "--options", "link")
	}
	args = append(args, src.VM)
	r, err := d.vbox(ctx, args...)
	if err != nil {
		// Interrupted: the clone may exist; its UUID says it is this one.
		d.undoClone(id)
		return ctxError("create: clone", err)
	}
	if r.code != 0 {
		return createError("create: clone", src, name, r)
	}
	d.log.Info("cloned", "template", src.VM, "snapshot", src.Snapshot, "linked", src.Linked, "vm", name)
	return nil
}

// createError explains clonevm's refusals.
func createError(op string, src TemplateSource, name string, r result) error {
	msg := errorText(r.stderr)
	switch {
	case strings.Contains(msg, "Registered machine with UUID"):
		// The UUID is the lease's (machineUUID): a clone an earlier creation
		// for the same lease left behind (VirtualBox::i_registerMachine).
		return fmt.Errorf("virtualbox: %s: %w: a VM cloned for this same lease by an earlier creation that did not finish is still registered; delete it (vm_delete) and create again: %s", op, hypervisor.ErrInvalidArgument, msg)
	case strings.Contains(msg, "already exists"):
		return fmt.Errorf("virtualbox: %s: %w: a VM named %q (or its settings folder) already exists; choose another name or remove it: %s", op, hypervisor.ErrInvalidArgument, name, msg)
	case strings.Contains(msg, "Could not find a snapshot"):
		return fmt.Errorf("virtualbox: %s: %w: template VM %q has no snapshot %q; take it or fix the template's source: %s", op, hypervisor.ErrInvalidArgument, src.VM, src.Snapshot, msg)
	case strings.Contains(msg, "Could not find a registered machine"):
		return fmt.Errorf("virtualbox: %s: %w: template VM %q is not registered: %s", op, hypervisor.ErrInvalidArgument, src.VM, msg)
	case strings.Contains(msg, "Linked clone can only be created"):
		return fmt.Errorf("virtualbox: %s: %w: %s; set the template's snapshot", op, hypervisor.ErrInvalidArgument, msg)
	}
	return vboxError(op, r)
}

// prepareClone marks, sizes and starts the clone (by its UUID) and waits
// for its guest.
func (d *Driver) prepareClone(ctx context.Context, id string, req hypervisor.CreateRequest) error {
	if err := d.vboxOK(ctx, "create: mark", "setextradata", id, markKey, req.Mark); err != nil {
		return err
	}
	if req.MemoryMB > 0 || req.CPUs > 0 {
		if err := d.size(ctx, id, req); err != nil {
			return err
		}
	}
	if err := d.vboxUnlocked(ctx, "create: start", id, "startvm", id, "--type", "headless"); err != nil {
		return err
	}
	return d.waitGuest(ctx, id)
}

// size sets memory and CPUs with modifyvm.
func (d *Driver) size(ctx context.Context, id string, req hypervisor.CreateRequest) error {
	mi, err := d.showVMInfo(ctx, "create: size", id)
	if err != nil {
		return err
	}
	if mi.State == "saved" {
		return fmt.Errorf("virtualbox: create: size: %w: the clone holds the saved state of a snapshot taken while the template ran, and VirtualBox cannot resize a saved machine; leave memory and CPUs unset or take the template's snapshot powered off",
			hypervisor.ErrInvalidArgument)
	}
	args := []string{"modifyvm", id}
	if req.MemoryMB > 0 {
		args = append(args, "--memory", strconv.FormatInt(req.MemoryMB, 10))
	}
	if req.CPUs > 0 {
		args = append(args, "--cpus", strconv.FormatInt(req.CPUs, 10))
	}
	return d.vboxUnlocked(ctx, "create: size", id, args...)
}

// waitGuest waits until guest control runs `/bin/sh -c :` in vm.
func (d *Driver) waitGuest(ctx context.Context, vm string) error {
	var b hypervisor.Backoff
	for {
		_, err := d.AgentInfo(ctx, vm)
		if err == nil {
			return nil
		}
		if !errors.Is(err, hypervisor.ErrAgentUnavailable) && !errors.Is(err, hypervisor.ErrTimeout) {
			return fmt.Errorf("virtualbox: create: waiting for the guest: %w", err)
		}
		if b.Sleep(ctx, time.Second) != nil {
			return fmt.Errorf("virtualbox: create: %w: the Guest Additions of %q did not answer (last: %v)", hypervisor.ErrTimeout, vm, err)
		}
	}
}

// undoClone removes the clone this call made, by its UUID, mark or not
// (it may have failed before the mark was set).
func (d *Driver) undoClone(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := d.remove(ctx, "create: undo", id); err != nil && !errors.Is(err, hypervisor.ErrUnknownVM) {
		d.log.Warn("a clone whose creation failed could not be removed", "uuid", id, "err", err)
	}
}

// DeleteVM powers off and removes the VM req names, disks included, if its
// extra data carries req.Mark.
func (d *Driver) DeleteVM(ctx context.Context, req hypervisor.DeleteRequest) error {
	if err := req.Validate(); err != nil {
		return fmt.Errorf("virtualbox: delete: %w", err)
	}
	op := "delete " + req.Name
	if err := d.checkName(op, req.Name); err != nil {
		return err
	}
	mark, err := d.extraData(ctx, op, req.Name, markKey)
	if err != nil {
		return err
	}
	if mark == "" {
		return d.removeUnmarked(ctx, op, req)
	}
	if mark != req.Mark {
		return fmt.Errorf("virtualbox: %s: %w", op, hypervisor.ErrNotCreated)
	}
	return d.remove(ctx, op, req.Name)
}

// removeUnmarked removes the unmarked VM req names only if its UUID is
// machineUUID(req.Mark): a clone made for that lease whose creation was cut
// before the mark was written. Any other unmarked VM is not ours.
func (d *Driver) removeUnmarked(ctx context.Context, op string, req hypervisor.DeleteRequest) error {
	mi, err := d.showVMInfo(ctx, op, req.Name)
	if err != nil {
		return err
	}
	id := machineUUID(req.Mark)
	if !strings.EqualFold(mi.UUID, id) {
		return fmt.Errorf("virtualbox: %s: %w", op, hypervisor.ErrNotCreated)
	}
	d.log.Warn("removing a clone whose creation stopped before it was marked", "vm", req.Name, "uuid", id)
	return d.removeAs(ctx, op, id, mi)
}

// extraData reads one extra data key: "Value: v" or "No value set!"
// (VBoxManageMisc.cpp handleGetExtraData), "" for the latter.
func (d *Driver) extraData(ctx context.Context, op, vm, key string) (string, error) {
	r, err := d.vbox(ctx, "getextradata", vm, key)
	if err != nil {
		return "", ctxError(op, err)
	}
	if r.code != 0 {
		return "", vboxError(op, r)
	}
	out := strings.TrimRight(string(r.stdout), "\r\n")
	if v, ok := strings.CutPrefix(out, "Value: "); ok && !strings.Contains(v, "\n") {
		return v, nil
	}
	if out == "No value set!" {
		return "", nil
	}
	return "", fmt.Errorf("virtualbox: %s: %w: unexpected getextradata output %q", op, hypervisor.ErrBackend, out)
}

// remove powers vm off when it has a VM process and unregisters it with
// its disks. The VM process releases the machine's session only after
// poweroff returns, so unregistervm waits for that (vboxUnlocked).
func (d *Driver) remove(ctx context.Context, op, vm string) error {
	mi, err := d.showVMInfo(ctx, op, vm)
	if err != nil {
		return err
	}
	return d.removeAs(ctx, op, vm, mi)
}

// removeAs is remove of vm whose showvminfo its caller already read (mi).
func (d *Driver) removeAs(ctx context.Context, op, vm string, mi machineInfo) error {
	if hasVMProcess(mi.State) {
		if err := d.vboxOK(ctx, op+": power off", "controlvm", vm, "poweroff"); err != nil && !errors.Is(err, hypervisor.ErrVMNotRunning) {
			return err
		}
	}
	if err := d.vboxUnlocked(ctx, op, vm, "unregistervm", vm, "--delete"); err != nil {
		return err
	}
	d.log.Info("deleted", "vm", vm)
	return nil
}
