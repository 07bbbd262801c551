package proxmox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// VMs on demand: a created VM is a clone of a template VM (POST
// /nodes/{node}/qemu/{vmid}/clone, a worker task waited for), linked where
// Proxmox can (a template's clone is linked unless the source says full),
// with the vmid /cluster/nextid gives, the name asked for and the lease's
// mark as a line of its description. Memory and cores are set in its
// config (PUT .../config) before it is started; CreateVM returns once its
// guest agent answers. DeleteVM stops and destroys (DELETE, purged with
// its unreferenced disks) only a VM whose description carries the mark.
//
// The token needs, besides what Privileges lists: VM.Clone on the
// template, VM.Allocate on /vms (the new vmid; also for destroying),
// VM.Config.Memory and VM.Config.CPU (sizing), Datastore.AllocateSpace on
// the storage the clone's disks go to.

var _ hypervisor.Creator = (*Driver)(nil)

// TemplateSource is a Proxmox template's source.
type TemplateSource struct {
	// VMID is the VM to clone, ideally a template (then the clone is
	// linked: it shares the template's disks until it writes).
	VMID int `json:"vmid"`
	// Full, when set, asks for a full (true) or linked (false) clone;
	// unset is Proxmox's own choice (linked for a template).
	Full *bool `json:"full,omitempty"`
}

// markPrefix starts the description line that marks a created VM.
const markPrefix = "vmgate-lease: "

// hasMark reports whether a VM's description carries mark on a line of its own.
func hasMark(description, mark string) bool {
	for _, line := range strings.Split(description, "\n") {
		if strings.TrimRight(line, "\r") == markPrefix+mark {
			return true
		}
	}
	return false
}

// CreateVM clones the template, sizes, starts and waits for the clone.
func (d *Driver) CreateVM(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
	if err := req.Validate(); err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("proxmox: create: %w", err)
	}
	var src TemplateSource
	if err := hypervisor.DecodeSource(req.Source, &src); err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("proxmox: create: %w", err)
	}
	if src.VMID < MinVMID || src.VMID > MaxVMID {
		return hypervisor.CreatedVM{}, fmt.Errorf("proxmox: create: %w: template vmid %d", hypervisor.ErrInvalidArgument, src.VMID)
	}
	tmpl, err := d.lookup(ctx, "create", strconv.Itoa(src.VMID))
	if errors.Is(err, hypervisor.ErrUnknownVM) {
		return hypervisor.CreatedVM{}, fmt.Errorf("proxmox: create: %w: no template VM %d (or the token cannot see it)", hypervisor.ErrInvalidArgument, src.VMID)
	} else if err != nil {
		return hypervisor.CreatedVM{}, err
	}
	ref, err := d.clone(ctx, tmpl, src, req)
	if err != nil {
		return hypervisor.CreatedVM{}, err
	}
	if err := d.prepare(ctx, ref, req); err != nil {
		d.undo(ref, req.Mark)
		return hypervisor.CreatedVM{}, err
	}
	if _, err := d.resources(ctx); err != nil {
		d.log.Warn("the VM list could not be refreshed after a clone", "vmid", ref.vmid, "err", err)
	}
	return hypervisor.CreatedVM{Name: strconv.Itoa(ref.vmid)}, nil
}

// clone takes a vmid from /cluster/nextid and clones the template to it;
// a vmid another client took meanwhile is tried once more.
func (d *Driver) clone(ctx context.Context, tmpl vmRef, src TemplateSource, req hypervisor.CreateRequest) (vmRef, error) {
	for attempt := 0; ; attempt++ {
		var next json.Number
		if err := d.api.do(ctx, "GET", "/cluster/nextid", nil, nil, &next); err != nil {
			return vmRef{}, d.classify("create: next vmid", err)
		}
		newid, err := strconv.Atoi(next.String())
		if err != nil || newid < MinVMID || newid > MaxVMID {
			return vmRef{}, fmt.Errorf("proxmox: create: %w: /cluster/nextid answered %q", hypervisor.ErrBackend, next)
		}
		body := map[string]any{"newid": newid, "name": req.Name, "description": markPrefix + req.Mark + "\n"}
		if src.Full != nil {
			body["full"] = *src.Full
		}
		var upid string
		err = d.api.do(ctx, "POST", tmpl.path+"/clone", nil, body, &upid)
		if err == nil {
			d.log.Info("clone task started", "template", tmpl.vmid, "vmid", newid, "upid", upid)
			err = d.waitTask(ctx, tmpl, upid)
		}
		ref := vmRef{vmid: newid, node: tmpl.node, path: "/nodes/" + tmpl.node + "/qemu/" + strconv.Itoa(newid)}
		switch {
		case err == nil:
			return ref, nil
		case attempt == 0 && strings.Contains(err.Error(), "config file already exists"):
			continue
		}
		// A clone task that failed may leave a locked, half-made VM.
		d.undo(ref, req.Mark)
		return vmRef{}, d.classify("create: clone", err)
	}
}

// prepare sizes the clone, starts it and waits for its guest agent.
func (d *Driver) prepare(ctx context.Context, ref vmRef, req hypervisor.CreateRequest) error {
	conf := map[string]any{}
	if req.MemoryMB > 0 {
		conf["memory"] = strconv.FormatInt(req.MemoryMB, 10)
	}
	if req.CPUs > 0 {
		conf["cores"] = req.CPUs
	}
	if len(conf) > 0 {
		if err := d.api.do(ctx, "PUT", ref.path+"/config", nil, conf, nil); err != nil {
			return d.classify("create: size", err)
		}
	}
	var upid string
	if err := d.api.do(ctx, "POST", ref.path+"/status/start", nil, struct{}{}, &upid); err != nil {
		return d.classify("create: start", err)
	}
	if err := d.waitTask(ctx, ref, upid); err != nil {
		return d.classify("create: start", err)
	}
	var b hypervisor.Backoff
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := d.api.do(pctx, "POST", ref.path+"/agent/ping", nil, struct{}{}, nil)
		cancel()
		if err == nil {
			return nil
		}
		if b.Sleep(ctx, time.Second) != nil {
			return fmt.Errorf("proxmox: create: %w: the guest agent of VM %d did not answer (last: %v)", hypervisor.ErrTimeout, ref.vmid, err)
		}
	}
}

// undo removes a clone whose creation failed, if it carries mark.
func (d *Driver) undo(ref vmRef, mark string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := d.remove(ctx, ref, mark); err != nil && !errors.Is(err, hypervisor.ErrUnknownVM) {
		d.log.Warn("a clone whose creation failed could not be removed", "vmid", ref.vmid, "err", err)
	}
}

// DeleteVM stops and destroys the VM req names (a vmid, or the name asked
// for when creation stopped before the vmid was known) if its description
// carries req.Mark.
func (d *Driver) DeleteVM(ctx context.Context, req hypervisor.DeleteRequest) error {
	if err := req.Validate(); err != nil {
		return fmt.Errorf("proxmox: delete: %w", err)
	}
	if _, err := ParseVMID(req.Name); err == nil {
		ref, err := d.lookup(ctx, "delete", req.Name)
		if err != nil {
			return err
		}
		return d.remove(ctx, ref, req.Mark)
	}
	rs, err := d.resources(ctx)
	if err != nil {
		return d.classify("delete", err)
	}
	found := false
	for _, r := range rs {
		if r.Name != req.Name {
			continue
		}
		ref := vmRef{vmid: r.VMID, node: r.Node, path: "/nodes/" + r.Node + "/qemu/" + strconv.Itoa(r.VMID)}
		err := d.remove(ctx, ref, req.Mark)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, hypervisor.ErrNotCreated):
			found = true
		default:
			return err
		}
	}
	if found {
		return fmt.Errorf("proxmox: delete %s: %w", req.Name, hypervisor.ErrNotCreated)
	}
	return fmt.Errorf("proxmox: delete %s: %w", req.Name, hypervisor.ErrUnknownVM)
}

// remove checks the mark in ref's description, stops the VM if it runs and
// destroys it with its disks.
func (d *Driver) remove(ctx context.Context, ref vmRef, mark string) error {
	op := "delete " + strconv.Itoa(ref.vmid)
	var conf struct {
		Description string `json:"description"`
	}
	if err := d.api.do(ctx, "GET", ref.path+"/config", nil, nil, &conf); err != nil {
		return d.classify(op, err)
	}
	if !hasMark(conf.Description, mark) {
		return fmt.Errorf("proxmox: %s: %w", op, hypervisor.ErrNotCreated)
	}
	var cur struct {
		Status string `json:"status"`
	}
	if err := d.api.do(ctx, "GET", ref.path+"/status/current", nil, nil, &cur); err != nil {
		return d.classify(op, err)
	}
	if cur.Status == "running" {
		var upid string
		if err := d.api.do(ctx, "POST", ref.path+"/status/stop", nil, struct{}{}, &upid); err != nil {
			return d.classify(op+": stop", err)
		}
		if err := d.waitTask(ctx, ref, upid); err != nil {
			return d.classify(op+": stop", err)
		}
	}
	var upid string
	q := url.Values{"purge": {"1"}, "destroy-unreferenced-disks": {"1"}}
	if err := d.api.do(ctx, "DELETE", ref.path, q, nil, &upid); err != nil {
		return d.classify(op, err)
	}
	if err := d.waitTask(ctx, ref, upid); err != nil {
		return d.classify(op, err)
	}
	d.core.Forget(strconv.Itoa(ref.vmid))
	if _, err := d.resources(ctx); err != nil {
		d.log.Warn("the VM list could not be refreshed after a destroy", "vmid", ref.vmid, "err", err)
	}
	return nil
}
