package server

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
	"github.com/vmgate/vmgate/server/lease"
)

// VMs on demand: vm_create and vm_delete. The life of a created VM (its
// lease, its quotas, the reaper) is vmleases.go's; this file is the tools'
// side: the template an agent names, what it may choose, and the refusals.

// maxTTLS bounds ttl_s in the catalogue; the policy's lease block caps it
// further (policy.LeaseSpec).
const maxTTLS = 7 * 24 * 3600

func createTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_create", title: "Create a VM", destructive: true,
		desc: "Create a VM from a template and return its id once its guest agent answers. " +
			"The VM is leased: it is deleted when its lease (ttl_s, capped by policy) ends. Quotas bound how many VMs and how much memory you hold.",
		fields: []field{
			{name: "template", kind: kindString, desc: "Template name (the server's config lists them; vmgate's default is \"lab\").", required: true, maxLen: 64},
			{name: "name", kind: kindString, desc: "Suffix of the VM's name after the template's prefix: lowercase letters, digits and '-'. Default: random.", maxLen: 64},
			{name: "memory_mb", kind: kindInteger, desc: "Memory in MiB, within the template's bounds. Default: the template's.", min: 1, max: hypervisor.MaxCreateMemoryMB},
			{name: "cpus", kind: kindInteger, desc: "Virtual CPUs, within the template's bounds. Default: the template's.", min: 1, max: hypervisor.MaxCreateCPUs},
			{name: "ttl_s", kind: kindInteger, desc: "Lease in seconds; the VM is deleted when it ends. Default and cap: the policy's.", min: 1, max: maxTTLS},
		},
		output: []map[string]any{oObject(map[string]any{
			"vm": oString, "template": oString, "memory_mb": oNonNeg, "cpus": oNonNeg, "ttl_s": oNonNeg, "lease_ends": oTime, "ttl_clamped": oBoolean,
		}, "vm", "template", "memory_mb", "cpus", "ttl_s", "lease_ends")},
	}, (*Server).runCreate)
}

func deleteTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_delete", title: "Delete a VM", destructive: true,
		desc:   "Stop and delete a VM that vm_create made (with its disks); VMs vmgate did not create are never deleted.",
		fields: []field{vmField(true)},
		output: []map[string]any{oObject(map[string]any{"vm": oString, "deleted": oBoolean}, "vm", "deleted")},
	}, (*Server).runDelete)
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

// completer is an optional capability of an argument struct: complete
// checks the arguments against the server's own state (what the catalogue
// cannot know) and fills in defaults, in the struct and in valid (what the
// policy decides on and the audit log records), before the policy decides.
// An error is the argument's refusal.
type completer interface {
	complete(s *Server, valid map[string]any) error
}

var _ completer = (*createArgs)(nil)

// complete checks the template and the sizes asked for, and fills in the
// template's defaults: a memory quota then weighs the memory the VM gets.
func (a *createArgs) complete(s *Server, valid map[string]any) error {
	t, ok := s.templates[a.Template]
	if !ok {
		return fmt.Errorf("template: no template %q (the server has %s)", truncate(a.Template, 64), s.templateNames())
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
func (a *createArgs) deadline(Limits) time.Duration { return lease.CreateDeadline }

// templateNames lists the templates for a refusal.
func (s *Server) templateNames() string {
	if len(s.templates) == 0 {
		return "no templates"
	}
	names := make([]string, 0, len(s.templates))
	for n := range s.templates {
		names = append(names, n)
	}
	slices.Sort(names)
	return "templates " + strings.Join(names, ", ")
}

// randomSuffix is the name suffix of a VM whose call gave none.
func randomSuffix() string { return strings.ToLower(rand.Text()[:8]) }

func (s *Server) runCreate(c *call, a *createArgs) result {
	if s.leases == nil {
		return failure(TagBackend, "this server keeps no leases (its store has none), so it cannot create VMs", true)
	}
	t := s.templates[a.Template] // complete found it
	suffix := ""
	if a.Name != nil {
		suffix = *a.Name
	}
	name, err := t.VMName(suffix, randomSuffix())
	if err != nil {
		return failure(TagInvalid, err.Error(), true)
	}
	id := t.Backend + "/" + name
	if !c.grant.vmVisible(id) {
		return failure(TagDenied, fmt.Sprintf("this grant could not use %s (its vms patterns do not cover it), so it is not created", id), true)
	}
	spec := policy.DefaultLease
	if c.lease != nil {
		spec = *c.lease
	}
	var asked time.Duration
	if a.TTLS != nil {
		asked = time.Duration(*a.TTLS) * time.Second
	}
	ttl, clamped := spec.TTL(asked)
	l, err := s.leases.Create(c.ctx, lease.CreateRequest{
		Backend: t.Backend, Name: name, Grant: c.grant.Name, Template: t.Name, CallID: c.id,
		Source: t.SourceJSON, MemoryMB: *a.MemoryMB, CPUs: *a.CPUs, TTL: ttl, Quotas: c.quotas,
	})
	if err != nil {
		return createFailure(id, err)
	}
	out := map[string]any{
		"vm": l.VM, "template": t.Name, "memory_mb": l.MemoryMB, "cpus": l.CPUs,
		"ttl_s": int64(ttl / time.Second), "lease_ends": l.Expires.UTC().Format(time.RFC3339),
	}
	text := fmt.Sprintf("%s created from %s; its lease ends %s (in %s)", l.VM, t.Name, l.Expires.UTC().Format(time.RFC3339), ttl)
	if clamped {
		out["ttl_clamped"] = true
		text += fmt.Sprintf("; ttl_s %d was capped by the policy", *a.TTLS)
	}
	return success(out, text)
}

// createFailure maps a failed creation to its refusal.
func createFailure(id string, err error) result {
	var qe *store.QuotaError
	switch {
	case errors.As(err, &qe):
		r := failure(TagQuota, quotaMessage(qe), true)
		r.detail = err.Error()
		return r
	case errors.Is(err, store.ErrDuplicate):
		r := failure(TagInvalid, fmt.Sprintf("a VM named %s exists or is being made: choose another name", id), true)
		r.detail = err.Error()
		return r
	case errors.Is(err, store.ErrUnavailable):
		r := failure(TagBackend, "the lease store does not answer, so no VM was made; retry", true)
		r.detail = err.Error()
		return r
	}
	return driverFailure(err)
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

func (s *Server) runDelete(c *call, _ *noArgs) result {
	notCreated := failure(TagInvalid, fmt.Sprintf("%s was not created by vm_create: vm_delete deletes only the VMs vm_create made", c.vm), true)
	if s.leases == nil {
		return notCreated
	}
	l, ok, err := s.leases.Find(c.ctx, c.vm)
	switch {
	case err != nil:
		r := failure(TagBackend, "the lease store does not answer, so nothing was deleted; retry", true)
		r.detail = err.Error()
		return r
	case !ok:
		return notCreated
	case l.Grant != c.grant.Name:
		return failure(TagDenied, fmt.Sprintf("%s was created by another grant: only its creator may delete it (its lease deletes it in the end)", c.vm), true)
	case l.State == store.LeaseCreating:
		return failure(TagInvalid, fmt.Sprintf("%s is still being created: delete it once its vm_create has returned", c.vm), true)
	}
	err = s.leases.DeleteNow(c.ctx, l, "delete@"+c.id)
	switch {
	case errors.Is(err, lease.ErrBusy):
		return failure(TagInvalid, fmt.Sprintf("%s is being deleted already (its lease ended or another call deletes it)", c.vm), true)
	case err != nil:
		return driverFailure(err)
	}
	return success(map[string]any{"vm": c.vm, "deleted": true}, c.vm+" deleted")
}
