package proxmox

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"time"

	"github.com/luthermonson/go-proxmox"

	"github.com/vmgate/vmgate/hypervisor"
)

// TaskError is a worker task that ended with an exit status other than
// "OK" or "WARNINGS: N" (pve-common src/PVE/UPID.pm, status_is_error): the
// exit status is the task's error message.
type TaskError struct {
	Node       string // where it ran
	Type       string // qmstart, qmstop, ...
	ID         string // the vmid
	ExitStatus string
}

func (e *TaskError) Error() string {
	return fmt.Sprintf("the %s task of VM %s failed: %s", e.Type, e.ID, e.ExitStatus)
}

// Unwrap makes a failed task an ErrBackend: its exit status is Proxmox's
// own reason.
func (e *TaskError) Unwrap() error { return hypervisor.ErrBackend }

// upidRE is PVE::UPID::decode's pattern. go-proxmox's NewTask indexes the
// UPID's parts without checking their number, so a UPID is checked first.
var upidRE = regexp.MustCompile(`^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$`)

// warningsRE is a task's exit status with warnings, a success.
var warningsRE = regexp.MustCompile(`^WARNINGS: \d+$`)

// maxTaskPoll caps the pause between two polls of a task.
const maxTaskPoll = time.Second

// waitTask polls the worker task upid of VM v (GET
// /nodes/{node}/tasks/{upid}/status through go-proxmox's Task.Ping) until it
// has stopped, starting within milliseconds and backing off to a second
// (go-proxmox's Task.Wait polls at a fixed interval and sleeps past the
// context). It returns a *TaskError for a failed task.
func (d *Driver) waitTask(ctx context.Context, v vmRef, upid string) error {
	m := upidRE.FindStringSubmatch(upid)
	if m == nil || (m[1] != v.node && !d.place.isAt(v.vmid, m[1])) {
		return fmt.Errorf("%w: answer %q is not a UPID of node %s", hypervisor.ErrBackend, upid, v.node)
	}
	t := proxmox.NewTask(proxmox.UPID(upid), d.api.c)
	var b hypervisor.Backoff
	for {
		if err := t.Ping(ctx); err != nil {
			// A node that went offline during the task names itself.
			return d.place.reached(m[1], 0, unwrapAPIError(err))
		}
		if t.Status == "stopped" {
			break
		}
		if err := b.Sleep(ctx, maxTaskPoll); err != nil {
			return fmt.Errorf("waiting for task %s: %w", upid, err)
		}
	}
	switch {
	case t.ExitStatus == "OK":
		return nil
	case warningsRE.MatchString(t.ExitStatus):
		d.log.Warn("task ended with warnings", "upid", upid, "exitstatus", t.ExitStatus)
		return nil
	}
	return &TaskError{Node: m[1], Type: m[6], ID: m[7], ExitStatus: t.ExitStatus}
}

// runTask starts a worker task of VM v (method on path answers its UPID)
// and waits for it. A task whose first step found no config of the VM on
// its node did nothing (the VM migrated before the worker took the config
// lock, see cluster.go): it is started once more, on the VM's node now.
func (d *Driver) runTask(ctx context.Context, v vmRef, op, method, path string, query url.Values, body any) error {
	for attempt := 0; ; attempt++ {
		var upid string
		if err := d.api.do(ctx, method, path, query, body, &upid); err != nil {
			return err
		}
		d.log.Info("task started", "op", op, "vmid", v.vmid, "upid", upid)
		err := d.waitTask(ctx, v, upid)
		var te *TaskError
		if attempt > 0 || !errors.As(err, &te) || !wrongNodeMessage(te.ExitStatus, te.Node, v.vmid) {
			return err
		}
		to, rerr := d.place.relocate(ctx, v.vmid, te.Node)
		if ne := (*NodeError)(nil); errors.As(rerr, &ne) {
			return ne
		}
		if rerr != nil || to == "" {
			return err
		}
		d.log.Info("VM moved before its task ran; starting the task on its node", "op", op, "vmid", v.vmid, "node", to)
	}
}
