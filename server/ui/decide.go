package ui

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode"

	"github.com/vmgate/vmgate/policy/store"
)

// The operator's decision on a pending approval (the form of the list and
// of the page of one approval).

// decide handles Approve and Deny: validate everything, then act once.
func (u *Handler) decide(w http.ResponseWriter, r *http.Request) {
	sid, ok := u.session(r)
	if !ok {
		http.Error(w, "not logged in", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	if !u.csrfOK(sid, r.PostForm.Get("csrf")) {
		http.Error(w, "invalid CSRF token; reload the page", http.StatusForbidden)
		return
	}
	id, action, reason := r.PostForm.Get("id"), r.PostForm.Get("action"), strings.TrimSpace(r.PostForm.Get("reason"))
	if err := validDecision(id, action, reason); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var (
		a   store.Approval
		err error
	)
	if action == "approve" {
		a, err = u.cfg.Approvals.Grant(r.Context(), id, u.cfg.OperatorName, reason)
	} else {
		a, err = u.cfg.Approvals.Deny(r.Context(), id, u.cfg.OperatorName, reason)
	}
	q := url.Values{}
	switch {
	case errors.Is(err, store.ErrUnknownApproval), errors.Is(err, store.ErrNotPending):
		q.Set("err", fmt.Sprintf("approval %s: %v", id, unwrapLast(err)))
	case err != nil && a.ID == "":
		u.log.Error("ui: decide approval", "id", id, "action", action, "err", err)
		q.Set("err", fmt.Sprintf("approval %s: %v", id, err))
	case err != nil:
		// Decided in the store but not audited: say so loudly.
		u.log.Error("ui: approval decided but not audited", "id", id, "err", err)
		q.Set("err", fmt.Sprintf("approval %s is %s, but the audit record failed: %v", id, a.State, err))
	default:
		u.log.Info("ui: approval decided", "id", id, "state", a.State, "operator", u.cfg.OperatorName)
		q.Set("msg", fmt.Sprintf("%s %s/%s: %s", a.Tool, a.Grant, id, a.State))
	}
	http.Redirect(w, r, Prefix+"/?"+q.Encode(), http.StatusSeeOther)
}

func unwrapLast(err error) error {
	for _, e := range []error{store.ErrUnknownApproval, store.ErrNotPending} {
		if errors.Is(err, e) {
			return e
		}
	}
	return err
}

// validDecision checks a decision form before anything happens.
func validDecision(id, action, reason string) error {
	if action != "approve" && action != "deny" {
		return fmt.Errorf("action must be approve or deny, not %q", truncate(action, 20))
	}
	if id == "" || len(id) > 128 || strings.IndexFunc(id, func(c rune) bool {
		return !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_')
	}) >= 0 {
		return errors.New("malformed approval id")
	}
	if len(reason) > MaxReasonLen {
		return fmt.Errorf("reason is %d bytes; the limit is %d", len(reason), MaxReasonLen)
	}
	if strings.IndexFunc(reason, func(c rune) bool { return unicode.IsControl(c) }) >= 0 {
		return errors.New("reason must be one line of text (no control characters)")
	}
	return nil
}
