package server

import (
	"fmt"
	"sort"
	"strings"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/lease"
)

// The VM inventory: list_vms and vm_status, straight to the driver.

func listVMsTool() *toolSpec {
	return newTool(toolSpec{
		name: "list_vms", title: "List VMs", readOnly: true, idempotent: true,
		desc: "List the VMs you can use, with their power state; a VM vm_create made shows the grant that created it and when its lease ends. Use the returned ids as the vm argument of the other tools.",
		output: []map[string]any{oObject(map[string]any{
			"vms": oArray(oObject(map[string]any{"id": oString, "state": oString, "info": oString, "agent": oBoolean,
				"created": oObject(map[string]any{"created_by": oString, "template": oString, "lease_ends": oTime, "lease_state": oString}, "created_by", "template", "lease_state"),
			}, "id", "state")),
			"errors":       oArray(oObject(map[string]any{"backend": oString, "error": oString}, "backend", "error")),
			"leases_error": oString,
		}, "vms")},
	}, (*Server).runListVMs)
}

func vmStatusTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_status", title: "VM status", readOnly: true, idempotent: true,
		desc:   "Report a VM's power state and whether its guest agent answers (needed by exec, file and process tools).",
		fields: []field{vmField(true)},
		output: []map[string]any{oObject(map[string]any{
			"vm": oString, "state": oString, "agent_connected": oBoolean, "agent_version": oString, "detail": oString,
		}, "vm", "state", "agent_connected")},
	}, (*Server).runStatus)
}

type vmEntry struct {
	ID    string           `json:"id"`
	State hypervisor.State `json:"state"`
	Info  string           `json:"info,omitempty"`
	Agent bool             `json:"agent,omitempty"`
	// Created is set for a VM vm_create made.
	Created *lease.Info `json:"created,omitempty"`
}

func (s *Server) runListVMs(c *call, _ *noArgs) result {
	names := make([]string, 0, len(s.backends))
	for n := range s.backends {
		names = append(names, n)
	}
	sort.Strings(names)
	vms := []vmEntry{}
	var errs []map[string]string
	var details []string
	leases, leaseErr := s.leases.ByVM(c.ctx)
	if leaseErr != nil {
		details = append(details, "leases: "+leaseErr.Error())
	}
	for _, b := range names {
		list, err := s.backends[b].ListVMs(c.ctx)
		if err != nil {
			errs = append(errs, map[string]string{"backend": b, "error": driverFailure(err).text})
			details = append(details, b+": "+err.Error())
			continue
		}
		for _, vm := range list {
			id := b + "/" + vm.Name
			if !validVMID(id) {
				s.log.Warn("server: list_vms leaves out a VM whose name vmgate refuses", "backend", b, "name", truncate(vm.Name, 128))
				continue
			}
			li, show := s.listed(c.grant, b, id, leases, leaseErr)
			if show {
				vms = append(vms, vmEntry{ID: id, State: vm.State, Info: vm.Info, Agent: vm.Agent, Created: li})
			}
		}
	}
	if len(errs) > 0 && len(errs) == len(names) {
		r := failure(TagBackend, "no backend answered", false)
		r.detail = strings.Join(details, "; ")
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
	r := success(out, b.String())
	r.detail = strings.Join(details, "; ")
	return r
}

// listed says whether list_vms shows grant g the VM id of backend, and
// its lease when vm_create made it: a VM its vms globs cover, unless
// another grant created it (lease/owners.go).
func (s *Server) listed(g *Grant, backend, id string, leases map[string]lease.Info, leaseErr error) (*lease.Info, bool) {
	if !g.vmVisible(id) {
		return nil, false
	}
	if s.leases == nil {
		return nil, true
	}
	return s.leases.Listed(g.Name, backend, id, leases, leaseErr)
}

func (s *Server) runStatus(c *call, _ *noArgs) result {
	st, err := c.driver.Status(c.ctx, c.name)
	if err != nil {
		return driverFailure(err)
	}
	out := map[string]any{
		"vm": c.vm, "state": st.State, "agent_connected": st.AgentConnected,
		"agent_version": st.AgentVersion, "detail": st.Detail,
	}
	agent := "agent not answering"
	if st.AgentConnected {
		agent = "agent connected"
	}
	return success(out, fmt.Sprintf("%s: %s, %s", c.vm, st.State, agent))
}
