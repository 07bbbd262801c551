package proxmox

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/luthermonson/go-proxmox"

	"github.com/vmgate/vmgate/hypervisor"
)

// TaskError is a worker task that ended with an exit status other than
// "OK" or "WARNINGS: N" (pve-common src/PVE/UPID.pm, status_is_error): the
// exit status is the task's error message.
type TaskError struct {
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
	if m == nil || m[1] != v.node {
		return fmt.Errorf("%w: answer %q is not a UPID of node %s", hypervisor.ErrBackend, upid, v.node)
	}
	t := proxmox.NewTask(proxmox.UPID(upid), d.api.c)
	var b hypervisor.Backoff
	for {
		if err := t.Ping(ctx); err != nil {
			return unwrapAPIError(err)
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
	return &TaskError{Type: m[6], ID: m[7], ExitStatus: t.ExitStatus}
}
