package ui

import (
	"net/http"
	"time"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/argview"
)

// PreviewBytes is how much of each argument the list of pending approvals
// shows; the page of one approval (/ui/approval?id=ID) shows all of it.
const PreviewBytes = 1024

// approvalView is an approval with its call's arguments rendered for the
// operator (argview: hidden characters escaped, binary as a hex dump).
type approvalView struct {
	store.Approval
	Fields []argview.Field
	// Redacted: the full arguments are no longer kept; Fields show the
	// redacted ones.
	Redacted bool
	// Cut: some field shows less than its whole value.
	Cut bool
}

func viewOf(a store.Approval, limit int) approvalView {
	v := approvalView{Approval: a}
	v.FullArgs = ""
	v.Fields, v.Redacted = argview.Of(a.FullArgs, a.Args, limit)
	for _, f := range v.Fields {
		v.Cut = v.Cut || f.Truncated()
	}
	return v
}

type approvalPage struct {
	Now      time.Time
	CSRF     string
	Operator string
	A        approvalView
}

// approval serves the page of one approval: every argument in full, and
// the decision form while it is pending.
func (u *Handler) approval(w http.ResponseWriter, r *http.Request, sid string) {
	id := r.URL.Query().Get("id")
	if err := validDecision(id, "approve", ""); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	list, err := u.cfg.Approvals.List(r.Context())
	if err != nil {
		u.log.Error("ui: list approvals", "err", err)
		http.Error(w, "the approval store did not answer: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	for _, a := range list {
		if a.ID == id {
			u.render(w, http.StatusOK, "approval.html", approvalPage{Now: u.now(), CSRF: u.csrf(sid), Operator: u.cfg.OperatorName, A: viewOf(a, 0)})
			return
		}
	}
	http.Error(w, "no approval "+id, http.StatusNotFound)
}
