package tools

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/internal/vmpage"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/lease"
)

// The VM inventory: list_vms and vm_status, straight to the driver.

func listVMsTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "list_vms", Title: "List VMs", ReadOnly: true, Idempotent: true,
		Desc: "List the VMs you can use, with their power state, a page at a time (sorted by id; total says how many match, next_cursor fetches the next page); " +
			"a VM vm_create made shows the grant that created it and when its lease ends. Use the returned ids as the vm argument of the other tools.",
		Fields: listVMsFields(),
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vms": catalog.OArray(catalog.OObject(map[string]any{"id": catalog.OString(), "state": catalog.OString(), "info": catalog.OString(), "agent": catalog.OBoolean(),
				"created": catalog.OObject(map[string]any{"created_by": catalog.OString(), "template": catalog.OString(), "lease_ends": catalog.OTime(), "lease_state": catalog.OString()}, "created_by", "template", "lease_state"),
			}, "id", "state")),
			"total":        catalog.ONonNeg(),
			"next_cursor":  catalog.OString(),
			"errors":       catalog.OArray(catalog.OObject(map[string]any{"backend": catalog.OString(), "error": catalog.OString()}, "backend", "error")),
			"leases_error": catalog.OString(),
		}, "vms", "total")},
	}, runListVMs)
}

// defaultPage is list_vms's page size when the call gives none.
const defaultPage = 100

// listVMsFields are list_vms' arguments: the page and its filters.
func listVMsFields() []catalog.Field {
	return []catalog.Field{
		{Name: "limit", Kind: catalog.KindInteger, Desc: fmt.Sprintf("Most VMs to return (default %d).", defaultPage), Min: 1, Max: vmpage.MaxLimit, Default: int64(defaultPage)},
		{Name: "cursor", Kind: catalog.KindString, Desc: "next_cursor of the previous page, as it was; leave out for the first page.", MaxLen: 1024},
		{Name: "name", Kind: catalog.KindString, Desc: `Only VMs whose name matches this glob ("web-*"; with a '/', matched against the id: "lab/web-?").`, MaxLen: 256},
		{Name: "state", Kind: catalog.KindString, Desc: "Only VMs in this power state.", Enum: []string{"running", "paused", "stopped", "unknown"}},
		{Name: "backend", Kind: catalog.KindString, Desc: `Only this backend's VMs (the part of an id before '/').`, MaxLen: 64},
	}
}

// listVMsArgs are list_vms' arguments.
type listVMsArgs struct {
	Limit   int64  `arg:"limit"`
	Cursor  string `arg:"cursor"`
	Name    string `arg:"name"`
	State   string `arg:"state"`
	Backend string `arg:"backend"`
}

// limit is the page's size: the call's, or defaultPage.
func (a *listVMsArgs) limit() int {
	if a.Limit <= 0 {
		return defaultPage
	}
	return int(a.Limit)
}

// CheckArgs refuses a malformed glob or a cursor vmpage did not make.
func (a *listVMsArgs) CheckArgs() error {
	if err := vmpage.CheckGlob(a.Name); err != nil {
		return pageError(err)
	}
	_, err := vmpage.ParseCursor(a.Cursor)
	return pageError(err)
}

// Complete refuses a backend the server does not have.
func (a *listVMsArgs) Complete(e *catalog.Env, _ map[string]any) error {
	if a.Backend == "" {
		return nil
	}
	if _, ok := e.Backends[a.Backend]; !ok {
		return fmt.Errorf("backend %q: there is no such backend (there are: %s)", a.Backend, strings.Join(slices.Sorted(maps.Keys(e.Backends)), ", "))
	}
	return nil
}

// pageError is a vmpage refusal as the gate's [INVALID ARGUMENT] text
// says it (without vmpage's own prefix).
func pageError(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(strings.TrimPrefix(err.Error(), vmpage.ErrInvalid.Error()+": "))
}

func vmStatusTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_status", Title: "VM status", ReadOnly: true, Idempotent: true,
		Desc: "Report a VM's power state, whether its guest agent answers (needed by exec, file and process tools), " +
			"and how vmgate reaches its vmgate-guest helper (the road: its resident helper over a channel of its own or through the agent's exec, " +
			"or a helper process per command, with why).",
		Fields: []catalog.Field{catalog.VMField(true)},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vm": catalog.OString(), "state": catalog.OString(), "agent_connected": catalog.OBoolean(), "agent_version": catalog.OString(), "detail": catalog.OString(),
			"helper": catalog.OObject(map[string]any{
				"road": catalog.OString(), "via": catalog.OString(), "why": catalog.OString(), "jobs_via": catalog.OString(),
				"pid": catalog.OInteger(), "version": catalog.OString(), "running_jobs": catalog.ONonNeg(), "checked": catalog.OTime(),
			}, "road"),
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

// runListVMs answers one page: every backend listed concurrently (the
// plugin host's kept lists, not copied), the page picked in one pass that
// asks each VM's visibility (keeper), and only the page's VMs built into
// the answer with their leases.
func runListVMs(e *catalog.Env, c *catalog.Call, a *listVMsArgs) catalog.Result {
	backends := make([]vmpage.Backend, 0, len(e.Backends))
	for _, n := range slices.Sorted(maps.Keys(e.Backends)) {
		backends = append(backends, vmpage.Backend{Name: n, Driver: e.Backends[n]})
	}
	lists := vmpage.Gather(c.Ctx, backends)
	view := e.Leases.View(c.Ctx, c.Grant.Name)
	k := keeper{e: e, grant: c.Grant, view: view, okBackend: map[string]bool{}}
	page, err := vmpage.Paginate(lists, vmpage.Query{Limit: a.limit(), Cursor: a.Cursor, Name: a.Name,
		State: hypervisor.State(a.State), Backend: a.Backend, Keep: k.keep})
	if err != nil {
		return catalog.Failure(catalog.TagInvalid, pageError(err).Error(), true)
	}
	var errs []map[string]string
	var details []string
	for _, l := range lists {
		if l.Err != nil {
			errs = append(errs, map[string]string{"backend": l.Backend, "error": catalog.DriverFailure(l.Err).Text})
			details = append(details, l.Backend+": "+l.Err.Error())
		}
	}
	if len(errs) > 0 && len(errs) == len(lists) {
		r := catalog.Failure(catalog.TagBackend, "no backend answered", false)
		r.Detail = strings.Join(details, "; ")
		return r
	}
	vms := make([]vmEntry, len(page.Entries))
	for i, en := range page.Entries {
		vms[i] = vmEntry{ID: en.ID, State: en.VM.State, Info: en.VM.Info, Agent: en.VM.Agent, Created: view.Info(en.ID)}
	}
	var leaseErr error
	if view != nil {
		leaseErr = view.Err
	}
	if leaseErr != nil {
		details = append(details, "leases: "+leaseErr.Error())
	}
	r := catalog.Success(listAnswer(vms, page, errs, leaseErr), listText(vms, page, errs, leaseErr))
	r.Detail = strings.Join(details, "; ")
	return r
}

// leasesDown is what list_vms says when the lease store does not answer.
const leasesDown = "the lease store does not answer, so created VMs are not marked (and, until it does, VMs of backends that make VMs may be left out)"

// listAnswer is list_vms's structured result.
func listAnswer(vms []vmEntry, page vmpage.Page, errs []map[string]string, leaseErr error) map[string]any {
	out := map[string]any{"vms": vms, "total": page.Total}
	if page.Next != "" {
		out["next_cursor"] = page.Next
	}
	if leaseErr != nil {
		out["leases_error"] = leasesDown
	}
	if errs != nil {
		out["errors"] = errs
	}
	return out
}

// listText is list_vms's text: "N of T VM(s)", a line per VM of the page.
func listText(vms []vmEntry, page vmpage.Page, errs []map[string]string, leaseErr error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d VM(s)", len(vms), page.Total)
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
	if page.Next != "" {
		fmt.Fprintf(&b, "\nmore: call list_vms again with cursor %s", page.Next)
	}
	for _, e := range errs {
		fmt.Fprintf(&b, "\nbackend %s: %s", e["backend"], e["error"])
	}
	if leaseErr != nil {
		b.WriteString("\n" + leasesDown)
	}
	return b.String()
}

// keeper is list_vms's vmpage Keep: a VM is listed when vmgate accepts
// its id, the grant's vms globs cover it and it is not another grant's
// created VM (lease.View). It is asked about every VM of the fleet that
// passes the page's filters, so it does the least per VM: the backend's
// name is checked once, the name through a table, the globs only when the
// grant has some, the leases only on backends with created VMs or
// templates.
type keeper struct {
	e         *catalog.Env
	grant     catalog.Grant
	view      *lease.View
	okBackend map[string]bool // backend name -> config.ValidBackendName
}

func (k *keeper) keep(id, backend string, vm hypervisor.VM) bool {
	ok, seen := k.okBackend[backend]
	if !seen {
		ok = config.ValidBackendName(backend)
		k.okBackend[backend] = ok
	}
	if !ok || !catalog.ValidVMName(vm.Name) {
		k.e.Log.Warn("server: list_vms leaves out a VM whose name vmgate refuses", "backend", backend, "name", catalog.Truncate(vm.Name, 128))
		return false
	}
	if len(k.grant.VMs) > 0 && !k.grant.Sees(id) {
		return false
	}
	return k.view.Shows(backend, id)
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
	text := fmt.Sprintf("%s: %s, %s", c.VM, st.State, agent)
	if h := e.Guest.Helpers[c.Backend]; h != nil && e.Guest.Available() {
		r := h.Road(c.Name)
		out["helper"] = roadView(r)
		text += "; vmgate-guest: " + r.String()
	}
	return catalog.Success(out, text)
}

// roadView is how vmgate reaches a VM's vmgate-guest as vm_status shows it:
// as last decided (vm_status neither starts nor looks for the helper).
func roadView(r guestctl.Road) map[string]any {
	v := map[string]any{"road": r.Kind}
	if r.Kind == "" {
		v["road"], v["why"] = "undecided", "no call has needed vmgate-guest in this VM since the server started"
		return v
	}
	for k, s := range map[string]string{"via": r.Via, "why": catalog.CleanReason(catalog.Truncate(r.Why, 500)), "jobs_via": r.Jobs} {
		if s != "" {
			v[k] = s
		}
	}
	if r.Helper != nil {
		v["pid"], v["version"], v["running_jobs"] = r.Helper.PID, r.Helper.Version, r.Helper.Jobs
	}
	v["checked"] = r.Checked.UTC()
	return v
}
