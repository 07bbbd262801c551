package tools

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/lease"
)

// VMs on demand: vm_create and vm_delete. The life of a created VM (its
// lease, its quotas, the reaper) is server/lease's; this file is the tools'
// side: the template an agent names, what it may choose, and the refusals.

// maxTTLS bounds ttl_s in the catalogue; the policy's lease block caps it
// further (policy.LeaseSpec).
const maxTTLS = 7 * 24 * 3600

func createTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_create", Title: "Create a VM", Destructive: true,
		Desc: "Create a VM from a template and return its id once its guest agent answers. " +
			"The VM is leased: it is deleted when its lease (ttl_s, capped by policy) ends. Quotas bound how many VMs and how much memory you hold.",
		Fields: []catalog.Field{
			{Name: "template", Kind: catalog.KindString, Desc: "Template name (the server's config lists them; vmgate's default is \"lab\").", Required: true, MaxLen: 64},
			{Name: "name", Kind: catalog.KindString, Desc: "Suffix of the VM's name after the template's prefix (template lab: name w1 makes lab/lab-w1; the result's vm is the id): lowercase letters, digits and '-'. Default: random.", MaxLen: 64},
			{Name: "memory_mb", Kind: catalog.KindInteger, Desc: "Memory in MiB, within the template's bounds. Default: the template's.", Min: 1, Max: hypervisor.MaxCreateMemoryMB},
			{Name: "cpus", Kind: catalog.KindInteger, Desc: "Virtual CPUs, within the template's bounds. Default: the template's.", Min: 1, Max: hypervisor.MaxCreateCPUs},
			{Name: "ttl_s", Kind: catalog.KindInteger, Desc: "Lease in seconds; the VM is deleted when it ends. Default and cap: the policy's.", Min: 1, Max: maxTTLS},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vm": catalog.OString(), "template": catalog.OString(), "memory_mb": catalog.ONonNeg(), "cpus": catalog.ONonNeg(), "ttl_s": catalog.ONonNeg(), "lease_ends": catalog.OTime(), "ttl_clamped": catalog.OBoolean(),
			"requested_name": catalog.OString(), "name_prefix": catalog.OString(),
		}, "vm", "template", "memory_mb", "cpus", "ttl_s", "lease_ends")},
	}, runCreate)
}

func deleteTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_delete", Title: "Delete a VM", Destructive: true,
		Desc:   "Stop and delete a VM that vm_create made (with its disks); VMs vmgate did not create are never deleted.",
		Fields: []catalog.Field{catalog.VMField(true)},
		Output: []map[string]any{catalog.OObject(map[string]any{"vm": catalog.OString(), "deleted": catalog.OBoolean()}, "vm", "deleted")},
	}, runDelete)
}

// createArgs are vm_create's arguments. complete fills MemoryMB and CPUs
// with the template's defaults before the policy decides.
type createArgs struct {
	Template string  `arg:"template"`
	Name     *string `arg:"name"`
	MemoryMB *int64  `arg:"memory_mb"`
	CPUs     *int64  `arg:"cpus"`
	TTLS     *int64  `arg:"ttl_s"`
}

// Complete checks the template and the sizes asked for, and fills in the
// template's defaults (catalog.Completer): a memory quota then weighs the
// memory the VM gets.
func (a *createArgs) Complete(e *catalog.Env, valid map[string]any) error {
	t, ok := e.Templates[a.Template]
	if !ok {
		return fmt.Errorf("template: no template %q (the server has %s)", catalog.Truncate(a.Template, 64), templateNames(e))
	}
	for _, v := range []struct {
		name string
		r    config.Range
		p    **int64
	}{{"memory_mb", t.MemoryMB, &a.MemoryMB}, {"cpus", t.CPUs, &a.CPUs}} {
		var asked int64
		if *v.p != nil {
			asked = **v.p
		}
		got, err := v.r.Value(asked)
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		*v.p = &got
		valid[v.name] = got
	}
	if a.Name != nil {
		if _, err := t.VMName(*a.Name, ""); err != nil {
			return err
		}
	}
	return nil
}

// deadline: a TCG guest on a loaded machine may take minutes to boot.
func (a *createArgs) Deadline(e *catalog.Env) time.Duration { return e.Timeouts.Create }

// templateNames lists the templates for a refusal.
func templateNames(e *catalog.Env) string {
	if len(e.Templates) == 0 {
		return "no templates"
	}
	names := make([]string, 0, len(e.Templates))
	for n := range e.Templates {
		names = append(names, n)
	}
	slices.Sort(names)
	return "templates " + strings.Join(names, ", ")
}

// randomSuffix is the name suffix of a VM whose call gave none.
func randomSuffix() string { return strings.ToLower(rand.Text()[:8]) }

func runCreate(e *catalog.Env, c *catalog.Call, a *createArgs) catalog.Result {
	if e.Leases == nil {
		return catalog.Failure(catalog.TagBackend, "this server keeps no leases (its store has none), so it cannot create VMs", true)
	}
	t := e.Templates[a.Template] // complete found it
	suffix := ""
	if a.Name != nil {
		suffix = *a.Name
	}
	name, err := t.VMName(suffix, randomSuffix())
	if err != nil {
		return catalog.Failure(catalog.TagInvalid, err.Error(), true)
	}
	id := t.Backend + "/" + name
	if !c.Grant.Sees(id) {
		return catalog.Failure(catalog.TagDenied, fmt.Sprintf("this grant could not use %s (its vms patterns do not cover it), so it is not created", id), true)
	}
	spec := policy.DefaultLease()
	if c.Rules.Lease != nil {
		spec = *c.Rules.Lease
	}
	var asked time.Duration
	if a.TTLS != nil {
		asked = time.Duration(*a.TTLS) * time.Second
	}
	ttl, clamped := spec.TTL(asked)
	l, err := e.Leases.Create(c.Ctx, lease.CreateRequest{
		Backend: t.Backend, Name: name, Grant: c.Grant.Name, Template: t.Name, CallID: c.ID,
		Source: t.SourceJSON, MemoryMB: *a.MemoryMB, CPUs: *a.CPUs, TTL: ttl, Quotas: c.Rules.Quotas,
	})
	if err != nil {
		return createFailure(id, err)
	}
	out := map[string]any{
		"vm": l.VM, "template": t.Name, "memory_mb": l.MemoryMB, "cpus": l.CPUs,
		"ttl_s": int64(ttl / time.Second), "lease_ends": l.Expires.UTC().Format(time.RFC3339),
	}
	text := fmt.Sprintf("%s created from %s; its lease ends %s (in %s)", l.VM, t.Name, l.Expires.UTC().Format(time.RFC3339), ttl)
	if a.Name != nil && t.Prefix() != "" {
		// The name is a suffix: say what was put before it.
		out["requested_name"], out["name_prefix"] = *a.Name, t.Prefix()
		text += fmt.Sprintf("; its name is the name %q you gave after template %s's prefix %q", *a.Name, t.Name, t.Prefix())
	}
	if clamped {
		out["ttl_clamped"] = true
		text += fmt.Sprintf("; ttl_s %d was capped by the policy", *a.TTLS)
	}
	return catalog.Success(out, text)
}

// createFailure maps a failed creation to its refusal.
func createFailure(id string, err error) catalog.Result {
	var qe *store.QuotaError
	switch {
	case errors.As(err, &qe):
		r := catalog.Failure(catalog.TagQuota, quotaMessage(qe), true)
		r.Detail = err.Error()
		return r
	case errors.Is(err, store.ErrDuplicate):
		r := catalog.Failure(catalog.TagInvalid, fmt.Sprintf("a VM named %s exists or is being made: choose another name", id), true)
		r.Detail = err.Error()
		return r
	case errors.Is(err, store.ErrUnavailable):
		r := catalog.Failure(catalog.TagBackend, "the lease store does not answer, so no VM was made; retry", true)
		r.Detail = err.Error()
		return r
	}
	return catalog.DriverFailure(err)
}

// quotaMessage says which quota is full, who holds it and what to do.
func quotaMessage(qe *store.QuotaError) string {
	q := qe.Quota
	unit := "VMs"
	if q.Weight != 1 || strings.Contains(q.Name, "memory") {
		unit = "units"
	}
	msg := fmt.Sprintf("quota %s is full: %d of %d %s held, this VM needs %d", q.Name, qe.Used, q.Max, unit, q.Weight)
	var held []string
	var first time.Time
	for _, h := range qe.Holders {
		held = append(held, h.Name)
		if h.State == store.LeaseLive && (first.IsZero() || h.Expires.Before(first)) {
			first = h.Expires
		}
	}
	if len(held) > 0 {
		msg += " (by " + strings.Join(held[:min(len(held), 8)], ", ") + ")"
	}
	msg += "; delete a VM you made with vm_delete"
	if !first.IsZero() {
		msg += " or wait for a lease to end (the first at " + first.UTC().Format(time.RFC3339) + ")"
	}
	return msg
}

func runDelete(e *catalog.Env, c *catalog.Call, _ *catalog.NoArgs) catalog.Result {
	notCreated := catalog.Failure(catalog.TagInvalid, fmt.Sprintf("%s was not created by vm_create: vm_delete deletes only the VMs vm_create made", c.VM), true)
	if e.Leases == nil {
		return notCreated
	}
	l, ok, err := e.Leases.Find(c.Ctx, c.VM)
	switch {
	case err != nil:
		r := catalog.Failure(catalog.TagBackend, "the lease store does not answer, so nothing was deleted; retry", true)
		r.Detail = err.Error()
		return r
	case !ok:
		return notCreated
	case l.Grant != c.Grant.Name:
		return catalog.Failure(catalog.TagDenied, fmt.Sprintf("%s was created by another grant: only its creator may delete it (its lease deletes it in the end)", c.VM), true)
	case l.State == store.LeaseCreating:
		return catalog.Failure(catalog.TagInvalid, fmt.Sprintf("%s is still being created: delete it once its vm_create has returned", c.VM), true)
	}
	err = e.Leases.DeleteNow(c.Ctx, l, "delete@"+c.ID)
	switch {
	case errors.Is(err, lease.ErrBusy):
		return catalog.Failure(catalog.TagInvalid, fmt.Sprintf("%s is being deleted already (its lease ended or another call deletes it)", c.VM), true)
	case err != nil:
		return catalog.DriverFailure(err)
	}
	if e.Guest != nil && e.Guest.Helpers[c.Backend] != nil {
		e.Guest.Helpers[c.Backend].Forget(c.Name) // the VM is gone: its helper check too
	}
	return catalog.Success(map[string]any{"vm": c.VM, "deleted": true}, c.VM+" deleted")
}
