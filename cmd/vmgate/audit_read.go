package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/policy/audit"
)

// `vmgate audit search`, `tail` and `show`: an operator finds calls in the
// audit log, live or not. They read the log as the server writes it and
// take none of its locks (policy/audit: Search, Tail).

// auditLogFlags is how a command finds the log: FILE, or --config's
// audit.path, or the log `vmgate serve` writes without a config.
type auditLogFlags struct{ config string }

func (a *auditLogFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&a.config, "config", "", "config file (vmgate.yaml) whose audit.path is the log, when FILE is not given")
}

// path is the log to read: file when given, else the config's.
func (a *auditLogFlags) path(op, file string) (string, error) {
	if file != "" {
		return file, nil
	}
	cfg, err := loadConfig(a.config)
	if err != nil {
		return "", fmt.Errorf("audit %s: %w", op, err)
	}
	return cfg.Audit.Path, nil
}

// openLog opens the log for reading, saying what is wrong in words; op
// ("audit search") starts its errors.
func openLog(op, path string) (*os.File, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: there is no audit log at %s%s", op, path, defaultLogHint())
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		f.Close()
		return nil, fmt.Errorf("%s: %s is a directory; give the log file (audit.log in it?)", op, path)
	}
	return f, nil
}

// filterFlags are the flags that build an audit.Filter.
type filterFlags struct {
	f            audit.Filter
	kind         string
	since, until string
}

func (ff *filterFlags) add(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&ff.f.CallID, "call", "", "the call id")
	fl.StringVar(&ff.f.Grant, "grant", "", "the grant that made the call")
	fl.StringVar(&ff.f.Tool, "tool", "", "the tool")
	fl.StringVar(&ff.f.VM, "vm", "", "the VM id (lab/vm1)")
	fl.StringVar(&ff.f.Decision, "decision", "", "allow, deny, approve, rate_limited, invalid, unknown_vm, error, approval_granted, approval_denied")
	fl.StringVar(&ff.f.Outcome, "outcome", "", "ok, error, timed_out, quota_exceeded, not_run, …")
	fl.StringVar(&ff.f.Session, "session", "", "the session the call ran in (its session argument)")
	fl.StringVar(&ff.f.ApprovalID, "approval", "", "the approval id")
	fl.StringVar(&ff.f.Text, "text", "", "text in an argument (not in stdin, env or file content: the log keeps only their digests)")
	fl.StringVar(&ff.kind, "kind", "", "decision, outcome, advance or advance_end")
	fl.StringVar(&ff.since, "since", "", "from this time on: a duration before now (7d, 36h, 1d12h, 90m) or an RFC 3339 time")
	fl.StringVar(&ff.until, "until", "", "before this time: a duration before now or an RFC 3339 time")
}

// filter validates the flags into a filter.
func (ff *filterFlags) filter(now time.Time) (audit.Filter, error) {
	f := ff.f
	err := f.SetBounds("--", ff.kind, ff.since, ff.until, now)
	return f, err
}

// readFlags are what search and tail share: the filters, the log, the
// output format.
type readFlags struct {
	ff     filterFlags
	lf     auditLogFlags
	output string
}

func (r *readFlags) add(c *cobra.Command) {
	r.ff.add(c)
	r.lf.add(c)
	c.Flags().StringVarP(&r.output, "output", "o", "table", "table or json (the records as stored, one per line)")
}

// resolve validates the flags and finds the log for the command op
// ("search", "tail").
func (r *readFlags) resolve(op string, args []string) (audit.Filter, string, error) {
	f, err := r.ff.filter(time.Now())
	if err != nil {
		return f, "", fmt.Errorf("audit %s: %w", op, err)
	}
	if r.output != "table" && r.output != "json" {
		return f, "", fmt.Errorf("audit %s: -o %q: want table or json", op, r.output)
	}
	path, err := r.lf.path(op, firstArg(args))
	return f, path, err
}

func newAuditSearchCmd() *cobra.Command {
	var rf readFlags
	var count bool
	c := &cobra.Command{
		Use:   "search [FILE] [--grant G] [--tool T] [--vm V] [--decision D] [--outcome O] [--session S] [--text T] [--since 7d] [--until T] [-o table|json] [--count]",
		Short: "Find records in the audit log by grant, tool, VM, decision, outcome, session, time or argument text",
		Long: `search prints the records of the audit log FILE that match every filter given,
in log order: a table (time, kind, call id, grant, tool, VM, decision or
outcome, rule and reason), the records as stored (-o json: JSON lines), or
their number (--count). A call has a decision record and, when it ran, an
outcome record with the same call id: "vmgate audit show CALL_ID" shows both.

It reads the log while the server writes it, without any of the server's
locks; a last line still being written is left out. It does not check the
hash chain: "vmgate audit verify" does.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, path, err := rf.resolve("search", args)
			if err != nil {
				return err
			}
			return runAuditSearch(cmd.OutOrStdout(), cmd.ErrOrStderr(), path, f, rf.output, count)
		},
	}
	rf.add(c)
	c.Flags().BoolVar(&count, "count", false, "print only the number of matching records")
	return c
}

func firstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

func runAuditSearch(out, errOut io.Writer, path string, f audit.Filter, output string, count bool) error {
	file, err := openLog("audit search", path)
	if err != nil {
		return err
	}
	defer file.Close()
	w := newLineWriter(out)
	if output == "table" && !count {
		writeRecordHeader(w)
	}
	st, err := audit.Search(file, f, func(m *audit.Match) error {
		switch {
		case count:
		case output == "json":
			w.Write(m.Line)
			w.WriteByte('\n')
		default:
			writeRecordRow(w, &m.Record)
		}
		return w.err
	})
	if err != nil {
		return fmt.Errorf("audit search: %s: %w", path, err)
	}
	if count {
		fmt.Fprintln(w, st.Matched)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("audit search: %w", err)
	}
	if st.Torn > 0 {
		fmt.Fprintf(errOut, "warning: %s: %d line(s) are not records (torn by a crash; vmgate audit verify says more)\n", path, st.Torn)
	}
	if st.Partial > 0 {
		fmt.Fprintf(errOut, "note: %s: the last line (%d bytes) is still being written, or was torn; left out\n", path, st.Partial)
	}
	return nil
}

// lineWriter is a buffered writer that keeps its first error.
type lineWriter struct {
	w   io.Writer
	buf []byte
	err error
}

func newLineWriter(w io.Writer) *lineWriter { return &lineWriter{w: w, buf: make([]byte, 0, 64<<10)} }

func (l *lineWriter) Write(b []byte) (int, error) {
	l.buf = append(l.buf, b...)
	if len(l.buf) >= 60<<10 {
		l.Flush()
	}
	return len(b), l.err
}

func (l *lineWriter) WriteByte(c byte) error {
	_, err := l.Write([]byte{c})
	return err
}

func (l *lineWriter) Flush() error {
	if l.err == nil && len(l.buf) > 0 {
		_, l.err = l.w.Write(l.buf)
	}
	l.buf = l.buf[:0]
	return l.err
}

const recordRowFormat = "%-24s  %-8s  %-26s  %-12s  %-22s  %-14s  %-16s  %s\n"

func writeRecordHeader(w io.Writer) {
	fmt.Fprintf(w, recordRowFormat, "TIME", "KIND", "CALL", "GRANT", "TOOL", "VM", "RESULT", "RULE / REASON")
}

// writeRecordRow prints one record as a table row: its time in UTC to the
// millisecond, the decision (with "(shadow)" for what a shadow policy
// would have done) or the outcome, the rule and the reason cut short.
func writeRecordRow(w io.Writer, r *audit.Record) {
	result := r.Decision
	if r.Kind == audit.KindOutcome {
		result = r.Outcome
		if r.DurationMS > 0 {
			result += fmt.Sprintf(" %.0fms", r.DurationMS)
		}
	}
	if r.Shadow {
		result += " (shadow)"
	}
	detail := r.Rule
	if r.Reason != "" {
		detail = strings.TrimSpace(detail + " " + r.Reason)
	}
	if r.Snapshot != "" {
		detail = strings.TrimSpace(detail + " snapshot " + r.Snapshot)
	}
	fmt.Fprintf(w, recordRowFormat, r.Time.UTC().Format("2006-01-02T15:04:05.000Z"), r.Kind, cell(r.CallID, 26), cell(r.Grant, 12),
		cell(r.Tool, 22), cell(orDash(r.VM), 14), cell(orDash(result), 16), cell(detail, 100))
}

// cell makes s printable on one line (control and format characters as
// escapes: the log holds what a client sent) and at most n runes.
func cell(s string, n int) string {
	var b strings.Builder
	i := 0
	for _, r := range s {
		if i == n {
			b.WriteString("…")
			break
		}
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteRune(r)
		}
		i++
	}
	return b.String()
}

func newAuditTailCmd() *cobra.Command {
	var rf readFlags
	var lines int
	var follow bool
	c := &cobra.Command{
		Use:   "tail [FILE] [-f] [-n N] [filters as for search] [-o table|json]",
		Short: "Print the last records of the audit log, and with -f every record as the server appends it",
		Long: `tail prints the last N records of the audit log FILE that match the filters (as
for "vmgate audit search"), and with -f goes on printing every record the
server appends, once each and in order, until interrupted.

It reads only complete lines (a record still being written is printed once
it is whole), and says so on standard error when the log holds a line that
is not a record (torn by a crash), when a seq is missing, when the server
takes back records after a write that failed part way (they were never
acknowledged), and when the file is replaced.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if lines < 0 {
				return fmt.Errorf("audit tail: -n %d: want 0 or more", lines)
			}
			f, path, err := rf.resolve("tail", args)
			if err != nil {
				return err
			}
			file, err := openLog("audit tail", path)
			if err != nil {
				return err
			}
			file.Close()
			o := audit.TailOptions{Last: lines, Follow: follow, Filter: f}
			return runAuditTail(cmd, path, o, rf.output)
		},
	}
	rf.add(c)
	c.Flags().IntVarP(&lines, "lines", "n", 10, "how many of the last matching records to print first")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing records as the server appends them")
	return c
}

func runAuditTail(cmd *cobra.Command, path string, o audit.TailOptions, output string) error {
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if output == "table" {
		writeRecordHeader(out)
	}
	err := audit.Tail(cmd.Context(), path, o, func(ev *audit.Event) error {
		switch ev.Kind {
		case audit.EventRecord:
			if output == "json" {
				_, err := fmt.Fprintf(out, "%s\n", ev.Line)
				return err
			}
			writeRecordRow(out, ev.Record)
		case audit.EventTorn:
			fmt.Fprintf(errOut, "warning: %s: offset %d: %s\n", path, ev.Offset, ev.Detail)
		case audit.EventGap:
			fmt.Fprintf(errOut, "warning: %s: offset %d: %s\n", path, ev.Offset, ev.Detail)
		case audit.EventWithdrawn:
			fmt.Fprintf(errOut, "warning: %s: %s; seqs %v (%d of them printed above)\n", path, ev.Detail, ev.Seqs, ev.Shown)
		case audit.EventReplaced:
			fmt.Fprintf(errOut, "note: %s\n", ev.Detail)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("audit tail: %w", err)
	}
	return nil
}

func newAuditShowCmd() *cobra.Command {
	var lf auditLogFlags
	var asJSON bool
	c := &cobra.Command{
		Use:   "show CALL_ID [FILE] [--json]",
		Short: "Show one call: its decision and outcome, the approval that let it through, its undo snapshot",
		Long: `show prints everything the audit log FILE says about one call: its decision
record (arguments as logged: stdin, env values and file content as digests),
its outcome record, the approval it consumed (the call that parked it and the
operator's grant), the undo snapshot the server took before it (named in the
outcome record) and an undo of it, if any.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := lf.path("show", firstArg(args[1:]))
			if err != nil {
				return err
			}
			return runAuditShow(cmd.OutOrStdout(), path, args[0], asJSON)
		},
	}
	lf.add(c)
	c.Flags().BoolVar(&asJSON, "json", false, "print the records as one JSON object")
	return c
}

// callRecords is what show found of one call.
type callRecords struct {
	CallID   string            `json:"call_id"`
	Records  []json.RawMessage `json:"records"`            // the call's own records
	Approval []json.RawMessage `json:"approval,omitempty"` // the approval's: the park, the operator's decision
	Undo     []json.RawMessage `json:"undo,omitempty"`     // an undo of the call
	recs     []audit.Record
	appr     []audit.Record
	undo     []audit.Record
}

func runAuditShow(out io.Writer, path, callID string, asJSON bool) error {
	var cr callRecords
	cr.CallID = callID
	collect := func(f audit.Filter, raw *[]json.RawMessage, recs *[]audit.Record) error {
		file, err := openLog("audit show", path)
		if err != nil {
			return err
		}
		defer file.Close()
		_, err = audit.Search(file, f, func(m *audit.Match) error {
			if f.CallID == "" && m.Record.CallID == callID {
				return nil // the call's own records name its approval too
			}
			*raw = append(*raw, json.RawMessage(string(m.Line)))
			*recs = append(*recs, m.Record)
			return nil
		})
		if err != nil {
			return fmt.Errorf("audit show: %s: %w", path, err)
		}
		return nil
	}
	if err := collect(audit.Filter{CallID: callID}, &cr.Records, &cr.recs); err != nil {
		return err
	}
	if len(cr.recs) == 0 {
		return &exitError{code: 1, msg: fmt.Sprintf("audit show: %s has no record of call %s (vmgate audit search finds calls by grant, tool, time …)", path, callID)}
	}
	if id := approvalOf(cr.recs); id != "" {
		if err := collect(audit.Filter{ApprovalID: id}, &cr.Approval, &cr.appr); err != nil {
			return err
		}
	}
	if err := collect(audit.Filter{CallID: "undo-" + callID}, &cr.Undo, &cr.undo); err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(cr)
	}
	printCall(out, &cr)
	return nil
}

// approvalOf is the operator approval the call consumed ("client" is the
// client's user, who leaves no other record).
func approvalOf(recs []audit.Record) string {
	for _, r := range recs {
		if r.Kind == audit.KindDecision && r.ApprovalID != "" && r.ApprovalID != "client" {
			return r.ApprovalID
		}
	}
	return ""
}

// printCall prints what show found, a block per record.
func printCall(w io.Writer, cr *callRecords) {
	first := cr.recs[0]
	fmt.Fprintf(w, "call %s: grant %s, tool %s, vm %s, over %s\n", cr.CallID, cell(first.Grant, 64), cell(first.Tool, 64), cell(orDash(first.VM), 128), orDash(first.Transport))
	for i := range cr.recs {
		printRecord(w, &cr.recs[i], "")
	}
	for i := range cr.appr {
		r := &cr.appr[i]
		what := "parked by call " + r.CallID
		if r.Transport == "operator" {
			what = "decided by the operator"
		}
		fmt.Fprintf(w, "approval  %s  %s  %s: %s\n", stamp(r.Time), r.ApprovalID, r.Decision, what)
		if r.Reason != "" {
			fmt.Fprintf(w, "          reason   %s\n", cell(r.Reason, 400))
		}
	}
	if len(cr.recs) == 1 && cr.recs[0].Kind == audit.KindDecision {
		fmt.Fprintln(w, "outcome   none in the log (the call was refused, is still running, or its outcome was lost in a crash)")
	}
	for i := range cr.undo {
		printRecord(w, &cr.undo[i], "undo ")
	}
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func printRecord(w io.Writer, r *audit.Record, prefix string) {
	switch r.Kind {
	case audit.KindDecision:
		shadow := ""
		if r.Shadow {
			shadow = " (shadow mode: what enforcement would have done; the call ran)"
		}
		fmt.Fprintf(w, "%-10s%s  %s%s  %s\n", prefix+"decision", stamp(r.Time), r.Decision, shadow, orDash(r.Rule))
	case audit.KindOutcome:
		fmt.Fprintf(w, "%-10s%s  %s  %.1f ms\n", prefix+"outcome", stamp(r.Time), r.Outcome, r.DurationMS)
	default:
		fmt.Fprintf(w, "%-10s%s\n", prefix+string(r.Kind), stamp(r.Time))
	}
	if r.Reason != "" {
		fmt.Fprintf(w, "          reason   %s\n", cell(r.Reason, 400))
	}
	if r.ApprovalID != "" && r.Kind == audit.KindDecision {
		fmt.Fprintf(w, "          approval %s\n", r.ApprovalID)
	}
	if len(r.Args) > 0 {
		b, _ := json.Marshal(r.Args)
		fmt.Fprintf(w, "          args     %s\n", cell(string(b), 2000))
	}
	for _, c := range r.Counters {
		fmt.Fprintf(w, "          counter  %s (at most %d per %s)\n", cell(c.Key, 200), c.Max, c.Window)
	}
	if r.Refunded {
		fmt.Fprintln(w, "          refunded (the call failed before any side effect)")
	}
	if r.Snapshot != "" {
		fmt.Fprintf(w, "          snapshot %s (undo: vmgate undo %s)\n", r.Snapshot, r.CallID)
	}
}

// parseWhen reads a time flag (audit.ParseWhen).
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	t, err := audit.ParseWhen(s, now)
	if err != nil {
		return t, fmt.Errorf("%s %q: %w", flag, s, err)
	}
	return t, nil
}
