package ui

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/argview"
)

// The calls page, /ui/calls: the audit log's most recent records that
// match the filters of `vmgate audit search` (the same query parameters as
// its flags, the same audit.Filter and audit.Search, so it reads the log
// as the server writes it, without any of its locks). Arguments are shown
// as the log keeps them: stdin, env values and file content only as their
// digests.

// maxCalls is how many records the page shows, the newest.
const maxCalls = 200

// defaultSince bounds the search when the query names no since at all (an
// empty since is unbounded, as for the CLI).
const defaultSince = "7d"

// callArgBytes is how much of each argument a row shows.
const callArgBytes = 300

// maxFilterLen bounds one filter's text.
const maxFilterLen = 512

// callsForm is the filters as the form shows them.
type callsForm struct {
	Grant, Tool, VM, Decision, Outcome, Session, Kind, Text, Since, Until string
}

// callRow is one record as the page shows it.
type callRow struct {
	audit.Record
	Result string // the decision or the outcome, as the CLI's RESULT column
	Fields []argview.Field
	// Redacted is false: args.html's note is about a parked call's full
	// arguments; the page's column header says these are as logged.
	Redacted bool
}

type callsPage struct {
	Now      time.Time
	CSRF     string
	Operator string
	Form     callsForm
	Rows     []callRow
	Matched  int
	Err      string
	Note     string
}

// callsFilter reads the query into a search filter.
func callsFilter(q url.Values, now time.Time) (callsForm, audit.Filter, error) {
	fm := callsForm{
		Grant: q.Get("grant"), Tool: q.Get("tool"), VM: q.Get("vm"), Decision: q.Get("decision"),
		Outcome: q.Get("outcome"), Session: q.Get("session"), Kind: q.Get("kind"), Text: q.Get("text"),
		Since: q.Get("since"), Until: q.Get("until"),
	}
	if !q.Has("since") {
		fm.Since = defaultSince
	}
	for _, v := range []string{fm.Grant, fm.Tool, fm.VM, fm.Decision, fm.Outcome, fm.Session, fm.Kind, fm.Text, fm.Since, fm.Until} {
		if len(v) > maxFilterLen {
			return fm, audit.Filter{}, fmt.Errorf("a filter is %d bytes; the limit is %d", len(v), maxFilterLen)
		}
	}
	f := audit.Filter{Grant: fm.Grant, Tool: fm.Tool, VM: fm.VM, Decision: fm.Decision, Outcome: fm.Outcome, Session: fm.Session, Text: fm.Text}
	if err := f.SetBounds("", fm.Kind, fm.Since, fm.Until, now); err != nil {
		return fm, f, err
	}
	return fm, f, nil
}

func (u *Handler) calls(w http.ResponseWriter, r *http.Request, sid string) {
	d := callsPage{Now: u.now(), CSRF: u.csrf(sid), Operator: u.cfg.OperatorName}
	fm, f, err := callsFilter(r.URL.Query(), d.Now)
	d.Form = fm
	if err != nil {
		d.Err = err.Error()
		u.render(w, http.StatusBadRequest, "calls.html", d)
		return
	}
	recs, st, err := searchLog(u.cfg.AuditPath, f, maxCalls)
	if err != nil {
		u.log.Error("ui: search audit log", "err", err)
		d.Err = err.Error()
	}
	d.Matched = st.Matched
	if st.Torn > 0 {
		d.Note = fmt.Sprintf("%d line(s) of the log are not records (torn by a crash; vmgate audit verify says more).", st.Torn)
	}
	d.Rows = make([]callRow, len(recs))
	for i := range recs {
		d.Rows[i] = rowOf(recs[i])
	}
	u.render(w, http.StatusOK, "calls.html", d)
}

// searchLog returns the last limit records of the log at path that f
// matches, newest first. No log yet is no record.
func searchLog(path string, f audit.Filter, limit int) ([]audit.Record, audit.ScanStats, error) {
	file, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, audit.ScanStats{}, nil
	}
	if err != nil {
		return nil, audit.ScanStats{}, fmt.Errorf("ui: audit log: %w", err)
	}
	defer file.Close()
	ring := make([]audit.Record, 0, limit)
	next := 0 // where the next match goes once ring is full
	st, err := audit.Search(file, f, func(m *audit.Match) error {
		if len(ring) < limit {
			ring = append(ring, m.Record)
			return nil
		}
		ring[next] = m.Record
		next = (next + 1) % limit
		return nil
	})
	if err != nil {
		return nil, st, fmt.Errorf("ui: audit log: %w", err)
	}
	out := append(ring[next:len(ring):len(ring)], ring[:next]...)
	slices.Reverse(out)
	return out, st, nil
}

// rowOf renders a record's result and arguments (argview: hidden
// characters escaped, each value cut at callArgBytes).
func rowOf(rec audit.Record) callRow {
	row := callRow{Record: rec, Result: rec.Decision}
	if rec.Kind == audit.KindOutcome {
		row.Result = rec.Outcome
		if rec.DurationMS > 0 {
			row.Result += fmt.Sprintf(" %.0fms", rec.DurationMS)
		}
	}
	if rec.Shadow {
		row.Result += " (shadow)"
	}
	if len(rec.Args) > 0 {
		if b, err := json.Marshal(rec.Args); err == nil {
			row.Fields, _ = argview.Fields(string(b), callArgBytes)
		}
	}
	row.Args = nil
	return row
}
