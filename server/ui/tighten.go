package ui

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/diff"
	"github.com/vmgate/vmgate/policy/suggest"
)

// The tightening page, /ui/tighten: for each grant, what `vmgate policy
// suggest` writes from its calls of a period (the last 7 days unless the
// query says since=...), and what `vmgate policy diff` says of it against
// the grant's policy in force, in the same words. It changes nothing: the
// operator puts a policy in force the way they always do.

// defaultPeriod is the tightening page's evidence when the query names no
// since.
const defaultPeriod = "7d"

// Tighten is what the tightening page needs besides the audit log: the
// grants, their policies in force and the server's catalogue (the page
// does not import the server: cmd/vmgate hands these in).
type Tighten struct {
	Grants []string
	// Policy returns a grant's policy in force now (nil: none).
	Policy func(grant string) *policy.Engine
	// Tools is the catalogue as policy/suggest takes it; Defaults fills in
	// the arguments a call left out (tools.ArgsWithDefaults).
	Tools    []suggest.Tool
	Defaults func(tool string, args map[string]any) map[string]any
	// Catalogue are the tool names policy/diff compares (tools.Names()).
	Catalogue []string
}

// grantTightening is one grant's section of the page.
type grantTightening struct {
	Grant       string
	Calls       int
	First, Last time.Time
	Document    string   // the suggested policy
	Notes       []string // what got no condition, and why
	Diff        string   // diff.Write of the policy in force against it
	Changes     int
	Err         string
}

type tightenPage struct {
	Now      time.Time
	CSRF     string
	Operator string
	Since    string
	Grant    string // the one grant asked for, or "" for all
	Grants   []string
	Off      bool
	Err      string
	Results  []grantTightening
}

func (u *Handler) tighten(w http.ResponseWriter, r *http.Request, sid string) {
	q := r.URL.Query()
	d := tightenPage{Now: u.now(), CSRF: u.csrf(sid), Operator: u.cfg.OperatorName, Since: q.Get("since"), Grant: q.Get("grant")}
	if !q.Has("since") {
		d.Since = defaultPeriod
	}
	t := u.cfg.Tighten
	if t == nil {
		d.Off = true
		u.render(w, http.StatusOK, "tighten.html", d)
		return
	}
	d.Grants = t.Grants
	since, err := audit.ParseWhen(d.Since, d.Now)
	switch {
	case len(d.Since) > maxFilterLen || err != nil:
		d.Err = fmt.Sprintf("since %q: %v", truncate(d.Since, 40), audit.ErrWhen)
	case d.Grant != "" && !slices.Contains(t.Grants, d.Grant):
		d.Err = fmt.Sprintf("no grant %q", truncate(d.Grant, 64))
	}
	if d.Err != "" {
		u.render(w, http.StatusBadRequest, "tighten.html", d)
		return
	}
	for _, g := range t.Grants {
		if d.Grant == "" || g == d.Grant {
			d.Results = append(d.Results, u.tightenGrant(t, g, since))
		}
	}
	u.render(w, http.StatusOK, "tighten.html", d)
}

// tightenGrant suggests grant's policy from its calls since since and
// compares the policy in force with it.
func (u *Handler) tightenGrant(t *Tighten, grant string, since time.Time) grantTightening {
	gt := grantTightening{Grant: grant}
	o := suggest.Options{Grant: grant, Since: since, Tools: t.Tools, Defaults: t.Defaults, Source: filepath.Base(u.cfg.AuditPath)}
	ev, err := collect(u.cfg.AuditPath, o)
	if err != nil {
		u.log.Error("ui: suggest policy", "grant", grant, "err", err)
		gt.Err = err.Error()
		return gt
	}
	gt.Calls, gt.First, gt.Last = len(ev.Calls), ev.First, ev.Last
	res, err := suggest.Suggest(ev, o)
	if errors.Is(err, suggest.ErrNoCalls) {
		gt.Err = "no call of this grant ran in the period: nothing to learn from"
		return gt
	}
	if err != nil {
		gt.Err = err.Error()
		return gt
	}
	gt.Document, gt.Notes = string(res.Document), res.Notes
	cur := t.Policy(grant)
	if cur == nil {
		gt.Err = "the grant has no policy in force to compare with"
		return gt
	}
	next, err := policy.Parse("suggested", res.Document)
	if err != nil {
		gt.Err = fmt.Sprintf("the suggested policy does not parse: %v", err)
		return gt
	}
	changes := diff.Compare(cur.Describe(), next.Describe(), t.Catalogue)
	gt.Changes = len(changes)
	var b strings.Builder
	if err := diff.Write(&b, changes); err != nil {
		gt.Err = err.Error()
		return gt
	}
	gt.Diff = b.String()
	return gt
}

// collect reads the evidence from the log at path (none yet: no call).
func collect(path string, o suggest.Options) (*suggest.Evidence, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &suggest.Evidence{Grant: o.Grant}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ui: audit log: %w", err)
	}
	defer f.Close()
	ev, err := suggest.Collect(f, o)
	if err != nil {
		return nil, fmt.Errorf("ui: %w", err)
	}
	return ev, nil
}
