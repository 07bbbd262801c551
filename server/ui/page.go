package ui

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
)

// maxDecisions is how many decision records the page shows.
const maxDecisions = 100

// backendTimeout bounds the page's calls to one backend.
const backendTimeout = 3 * time.Second

// VMView is one VM as the page shows it.
type VMView struct {
	ID      string
	State   hypervisor.State
	Agent   string // connected, not connected, unknown
	Version string
	Info    string
}

type pageData struct {
	Now       time.Time
	CSRF      string
	Operator  string
	Msg, Err  string
	Pending   []approvalView
	PendErr   string
	Decisions []audit.Record
	Filter    Filter
	Grants    []string
	Tools     []string
	VMIDs     []string
	AuditErr  string
	Counters  []CounterView
	VMs       []VMView
	VMErrs    []string
}

func (u *Handler) pendingList(ctx context.Context) ([]approvalView, string) {
	list, err := u.cfg.Approvals.List(ctx)
	if err != nil {
		u.log.Error("ui: list approvals", "err", err)
		return nil, "the approval store did not answer: " + err.Error()
	}
	now := u.now()
	list = slices.DeleteFunc(list, func(a store.Approval) bool {
		return a.State != store.ApprovalPending || !now.Before(a.Expires)
	})
	slices.SortFunc(list, func(a, b store.Approval) int { return a.Created.Compare(b.Created) })
	views := make([]approvalView, len(list))
	for i, a := range list {
		views[i] = viewOf(a, PreviewBytes)
	}
	return views, ""
}

func (u *Handler) page(w http.ResponseWriter, r *http.Request) {
	sid, _ := u.session(r)
	q := r.URL.Query()
	f := Filter{Grant: q.Get("grant"), Tool: q.Get("tool"), VM: q.Get("vm")}
	d := pageData{Now: u.now(), CSRF: u.csrf(sid), Operator: u.cfg.OperatorName, Msg: truncate(q.Get("msg"), 300), Err: truncate(q.Get("err"), 300), Filter: f}
	d.Pending, d.PendErr = u.pendingList(r.Context())
	if err := u.journal.refresh(); err != nil {
		u.log.Error("ui: read audit log", "err", err)
		d.AuditErr = err.Error()
	}
	d.Decisions, d.Grants, d.Tools, d.VMIDs = u.journal.decisions(f, maxDecisions)
	d.Counters = u.journal.counters(d.Now)
	d.VMs, d.VMErrs = u.vms(r.Context())
	u.render(w, http.StatusOK, "page.html", d)
}

func (u *Handler) pending(w http.ResponseWriter, r *http.Request, sid string) {
	d := pageData{Now: u.now(), CSRF: u.csrf(sid)}
	d.Pending, d.PendErr = u.pendingList(r.Context())
	u.render(w, http.StatusOK, "pending.html", d)
}

// vms lists every backend's VMs with their status, backends in parallel.
func (u *Handler) vms(ctx context.Context) ([]VMView, []string) {
	type res struct {
		vms []VMView
		err string
	}
	out := make([]res, len(u.cfg.Backends))
	var wg sync.WaitGroup
	for i, b := range u.cfg.Backends {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, backendTimeout)
			defer cancel()
			list, err := b.Driver.ListVMs(ctx)
			if err != nil {
				out[i].err = b.Name + ": " + err.Error()
				return
			}
			views := make([]VMView, len(list))
			var vwg sync.WaitGroup
			for j, vm := range list {
				views[j] = VMView{ID: b.Name + "/" + vm.Name, State: vm.State, Agent: "unknown", Info: vm.Info}
				vwg.Go(func() {
					st, err := b.Driver.Status(ctx, vm.Name)
					if err != nil {
						return
					}
					views[j].State = st.State
					views[j].Version = st.AgentVersion
					if st.AgentConnected {
						views[j].Agent = "connected"
					} else {
						views[j].Agent = "not connected"
					}
				})
			}
			vwg.Wait()
			out[i].vms = views
		})
	}
	wg.Wait()
	var vms []VMView
	var errs []string
	for _, r := range out {
		vms = append(vms, r.vms...)
		if r.err != "" {
			errs = append(errs, r.err)
		}
	}
	return vms, errs
}
