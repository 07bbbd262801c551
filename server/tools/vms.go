package tools

import (
	"fmt"
	"sort"
	"strings"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/lease"
)

// The VM inventory: list_vms and vm_status, straight to the driver.

func listVMsTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "list_vms", Title: "List VMs", ReadOnly: true, Idempotent: true,
		Desc: "List the VMs you can use, with their power state; a VM vm_create made shows the grant that created it and when its lease ends. Use the returned ids as the vm argument of the other tools.",
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vms": catalog.OArray(catalog.OObject(map[string]any{"id": catalog.OString(), "state": catalog.OString(), "info": catalog.OString(), "agent": catalog.OBoolean(),
				"created": catalog.OObject(map[string]any{"created_by": catalog.OString(), "template": catalog.OString(), "lease_ends": catalog.OTime(), "lease_state": catalog.OString()}, "created_by", "template", "lease_state"),
			}, "id", "state")),
			"errors":       catalog.OArray(catalog.OObject(map[string]any{"backend": catalog.OString(), "error": catalog.OString()}, "backend", "error")),
			"leases_error": catalog.OString(),
		}, "vms")},
	}, runListVMs)
}

func vmStatusTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_status", Title: "VM status", ReadOnly: true, Idempotent: true,
		Desc:   "Report a VM's power state and whether its guest agent answers (needed by exec, file and process tools).",
		Fields: []catalog.Field{catalog.VMField(true)},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vm": catalog.OString(), "state": catalog.OString(), "agent_connected": catalog.OBoolean(), "agent_version": catalog.OString(), "detail": catalog.OString(),
		}, "vm", "state", "agent_connected")},
	}, runStatus)
}

type vmEntry struct {
	ID    string           `json:"id"`
	State hypervisor.State `json:"state"`
	Info  string           `json:"info,omitempty"`
	Agent bool             `json:"agent,omitempty"`
	// Created is set for a VM vm_create made.
	Created *lease.Info `json:"created,omitempty"`
}

func runListVMs(e *catalog.Env, c *catalog.Call, _ *catalog.NoArgs) catalog.Result {
	names := make([]string, 0, len(e.Backends))
	for n := range e.Backends {
		names = append(names, n)
	}
	sort.Strings(names)
	vms := []vmEntry{}
	var errs []map[string]string
	var details []string
	leases, leaseErr := e.Leases.ByVM(c.Ctx)
	if leaseErr != nil {
		details = append(details, "leases: "+leaseErr.Error())
	}
	for _, b := range names {
		list, err := e.Backends[b].ListVMs(c.Ctx)
		if err != nil {
			errs = append(errs, map[string]string{"backend": b, "error": catalog.DriverFailure(err).Text})
			details = append(details, b+": "+err.Error())
			continue
		}
		for _, vm := range list {
			id := b + "/" + vm.Name
			if !catalog.ValidVMID(id) {
				e.Log.Warn("server: list_vms leaves out a VM whose name vmgate refuses", "backend", b, "name", catalog.Truncate(vm.Name, 128))
				continue
			}
			li, show := listed(e, c.Grant, b, id, leases, leaseErr)
			if show {
				vms = append(vms, vmEntry{ID: id, State: vm.State, Info: vm.Info, Agent: vm.Agent, Created: li})
			}
		}
	}
	if len(errs) > 0 && len(errs) == len(names) {
		r := catalog.Failure(catalog.TagBackend, "no backend answered", false)
		r.Detail = strings.Join(details, "; ")
		return r
	}
	out := map[string]any{"vms": vms}
	const leasesDown = "the lease store does not answer, so created VMs are not marked (and, until it does, VMs of backends that make VMs may be left out)"
	if leaseErr != nil {
		out["leases_error"] = leasesDown
	}
	if errs != nil {
		out["errors"] = errs
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d VM(s)", len(vms))
	for _, vm := range vms {
		fmt.Fprintf(&b, "\n%s %s", vm.ID, vm.State)
		if li := vm.Created; li != nil {
			fmt.Fprintf(&b, " (created by %s from %s", li.CreatedBy, li.Template)
			if li.LeaseEnds != "" {
				fmt.Fprintf(&b, ", lease ends %s", li.LeaseEnds)
			}
			b.WriteString(")")
		}
	}
	for _, e := range errs {
		fmt.Fprintf(&b, "\nbackend %s: %s", e["backend"], e["error"])
	}
	if leaseErr != nil {
		b.WriteString("\n" + leasesDown)
	}
	r := catalog.Success(out, b.String())
	r.Detail = strings.Join(details, "; ")
	return r
}

// listed says whether list_vms shows grant g the VM id of backend, and
// its lease when vm_create made it: a VM its vms globs cover, unless
// another grant created it (lease/owners.go).
func listed(e *catalog.Env, g catalog.Grant, backend, id string, leases map[string]lease.Info, leaseErr error) (*lease.Info, bool) {
	if !g.Sees(id) {
		return nil, false
	}
	if e.Leases == nil {
		return nil, true
	}
	return e.Leases.Listed(g.Name, backend, id, leases, leaseErr)
}

func runStatus(e *catalog.Env, c *catalog.Call, _ *catalog.NoArgs) catalog.Result {
	st, err := c.Driver.Status(c.Ctx, c.Name)
	if err != nil {
		return catalog.DriverFailure(err)
	}
	out := map[string]any{
		"vm": c.VM, "state": st.State, "agent_connected": st.AgentConnected,
		"agent_version": st.AgentVersion, "detail": st.Detail,
	}
	agent := "agent not answering"
	if st.AgentConnected {
		agent = "agent connected"
	}
	return catalog.Success(out, fmt.Sprintf("%s: %s, %s", c.VM, st.State, agent))
}
