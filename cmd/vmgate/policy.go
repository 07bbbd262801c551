package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server/tools"
)

func init() { commands = append(commands, newPolicyCmd) }

func newPolicyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "policy",
		Short: "Check, test, explain, suggest and compare policy documents",
	}
	c.AddCommand(newPolicyCheckCmd(), newPolicyTestCmd(), newPolicyExplainCmd(), newPolicySuggestCmd(), newPolicyDiffCmd())
	return c
}

// readPolicyFile reads a policy document without reading more than the
// parser accepts, so a huge file fails at once with the parser's message.
func readPolicyFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, policy.MaxDocumentSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > policy.MaxDocumentSize {
		size := "more than " + strconv.Itoa(policy.MaxDocumentSize)
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			size = strconv.FormatInt(fi.Size(), 10)
		}
		return nil, policy.Errors{{File: name, Line: 1, Col: 1,
			Msg: fmt.Sprintf("document is %s bytes; the limit is %d", size, policy.MaxDocumentSize)}}
	}
	return data, nil
}

func loadPolicy(name string) (*policy.Engine, error) {
	data, err := readPolicyFile(name)
	if err != nil {
		return nil, err
	}
	return policy.Parse(name, data)
}

func newPolicyCheckCmd() *cobra.Command {
	var strict bool
	c := &cobra.Command{
		Use:   "check [--strict] FILE…",
		Short: "Parse policy documents and report every problem as file:line:col: path: message",
		Long: `check parses each policy document and reports every error as
file:line:col: json.path: message. A tool name that is no tool of this
server (a typo such as "vm_agent_exce") is a warning, since its rule never
applies; with --strict it is an error.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			bad := 0
			for _, name := range files {
				if !checkPolicyFile(cmd, name, strict) {
					bad++
				}
			}
			if bad > 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("policy check: %d of %d files have errors", bad, len(files))}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&strict, "strict", false, "treat tool names that are no tool of this server as errors")
	return c
}

// checkPolicyFile reports one document's errors and warnings and whether
// it passed.
func checkPolicyFile(cmd *cobra.Command, name string, strict bool) bool {
	e, err := loadPolicy(name)
	if err != nil {
		var errs policy.Errors
		if errors.As(err, &errs) {
			for _, pe := range errs {
				fmt.Fprintln(cmd.ErrOrStderr(), pe)
			}
		} else {
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", name, err)
		}
		return false
	}
	unknown := e.UnknownTools(tools.Names())
	kind := "warning"
	if strict {
		kind = "error"
	}
	for _, w := range unknown {
		pe := *w
		pe.Msg = kind + ": " + pe.Msg
		fmt.Fprintln(cmd.ErrOrStderr(), &pe)
	}
	if strict && len(unknown) > 0 {
		return false
	}
	note := ""
	if len(unknown) > 0 {
		note = fmt.Sprintf(", %d warning", len(unknown))
		if len(unknown) > 1 {
			note += "s"
		}
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (%d tools%s, sha256 %s)\n", name, len(e.Tools()), note, e.Fingerprint())
	return true
}

// testCase is one entry of a `policy test` cases file (a JSON array).
type testCase struct {
	Name    string         `json:"name"`
	Grant   string         `json:"grant"` // default "local"
	Tool    string         `json:"tool"`
	VM      string         `json:"vm"`      // default: args.vm when it is a string
	Session string         `json:"session"` // default: args.session when it is a string
	Args    map[string]any `json:"args"`
	// At is the virtual clock offset from the start ("59s"); offsets never
	// go backwards. Repeat runs the call that many times, Every apart.
	At         string `json:"at"`
	Repeat     int    `json:"repeat"`
	Every      string `json:"every"`
	Expect     string `json:"expect"` // allow, deny, approve or rate_limited
	ExpectRule string `json:"expect_rule"`
}

func readCases(name string) ([]testCase, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var cases []testCase
	if err := dec.Decode(&cases); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: data after the list of cases", name)
	}
	if len(cases) == 0 {
		return nil, fmt.Errorf("%s: no cases", name)
	}
	return cases, nil
}

// testCall is one call of the run, with its clock offset.
type testCall struct {
	idx   int // index of the case
	label string
	at    time.Duration
	call  policy.Call
	tc    *testCase
}

// expandCases validates the cases and turns them into calls in clock order.
func expandCases(cases []testCase) ([]testCall, error) {
	var out []testCall
	var last time.Duration
	for i := range cases {
		tc := &cases[i]
		where := fmt.Sprintf("case %d", i+1)
		if tc.Name != "" {
			where += fmt.Sprintf(" (%s)", tc.Name)
		}
		switch tc.Expect {
		case "allow", "deny", "approve", "rate_limited":
		default:
			return nil, fmt.Errorf("%s: expect is %q; want allow, deny, approve or rate_limited", where, tc.Expect)
		}
		if tc.Tool == "" {
			return nil, fmt.Errorf("%s: tool is missing", where)
		}
		var at, every time.Duration
		var err error
		if tc.At != "" {
			if at, err = time.ParseDuration(tc.At); err != nil || at < 0 {
				return nil, fmt.Errorf("%s: at %q is not a duration ≥ 0", where, tc.At)
			}
		} else {
			at = last
		}
		if at < last {
			return nil, fmt.Errorf("%s: at %s is before the previous call (%s); the clock only moves forward", where, at, last)
		}
		if tc.Every != "" {
			if every, err = time.ParseDuration(tc.Every); err != nil || every < 0 {
				return nil, fmt.Errorf("%s: every %q is not a duration ≥ 0", where, tc.Every)
			}
		}
		n := tc.Repeat
		if n == 0 {
			n = 1
		}
		if n < 0 || n > 1_000_000 {
			return nil, fmt.Errorf("%s: repeat %d is out of range (1 to 1000000)", where, n)
		}
		call := policy.Call{Grant: tc.Grant, Tool: tc.Tool, VM: tc.VM, Session: tc.Session, Args: tools.ArgsWithDefaults(tc.Tool, tc.Args), Transport: "stdio"}
		if call.Grant == "" {
			call.Grant = "local"
		}
		if s, ok := tc.Args["vm"].(string); ok && call.VM == "" {
			call.VM = s
		}
		if s, ok := tc.Args["session"].(string); ok && call.Session == "" {
			call.Session = s
		}
		for k := range n {
			label := where
			if n > 1 {
				label += fmt.Sprintf(" #%d", k+1)
			}
			last = at + time.Duration(k)*every
			out = append(out, testCall{idx: i, label: label, at: last, call: call, tc: tc})
		}
	}
	return out, nil
}

func newPolicyTestCmd() *cobra.Command {
	var rf replayFlags
	c := &cobra.Command{
		Use:   "test POLICY CASES | test --replay audit.log POLICY",
		Short: "Run a cases file, or an audit log's calls, against a policy with a memory store and a virtual clock",
		Long: `Run the calls of CASES (a JSON array) in order against POLICY, reserving counters
in a memory store on a virtual clock. Each case:
  {"name": "…", "grant": "local", "tool": "kill_process", "vm": "lab/vm1", "session": "…",
   "args": {…}, "at": "59s", "repeat": 10, "every": "1s",
   "expect": "allow|deny|approve|rate_limited", "expect_rule": "/tools/kill_process/limits/0"}
Stops with exit status 1 at the first call whose decision differs from expect.

With --replay audit.log, the calls the log records are decided again with
POLICY, each at its recorded time (counters reserved on that clock, refunds
replayed), and every call whose decision would change is listed: what was
recorded (and whether the call went through) against what POLICY decides.
Calls refused before any policy decided are not replayed. Exit status 1 when
POLICY would refuse (or park for an approval) a call that went through.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if rf.log != "" {
				return cobra.ExactArgs(1)(cmd, args)
			}
			return cobra.ExactArgs(2)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if rf.log != "" {
				return runReplay(cmd, args[0], rf)
			}
			eng, err := loadPolicy(args[0])
			if err != nil {
				return fmt.Errorf("policy test: %w", err)
			}
			cases, err := readCases(args[1])
			if err != nil {
				return fmt.Errorf("policy test: %w", err)
			}
			calls, err := expandCases(cases)
			if err != nil {
				return fmt.Errorf("policy test: %s: %w", args[1], err)
			}
			return runCases(cmd, eng, memory.New(), calls)
		},
	}
	rf.add(c)
	return c
}

// start is the virtual clock's origin; any fixed instant would do.
var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func runCases(cmd *cobra.Command, eng *policy.Engine, counters store.Counters, calls []testCall) error {
	out := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	for i, tc := range calls {
		d := eng.Decide(tc.call)
		if d.Verdict == policy.Allow && len(d.Counters) > 0 {
			err := counters.ReserveAll(cmd.Context(), "call-"+strconv.Itoa(i), start.Add(tc.at), d.Counters)
			var le *store.LimitedError
			switch {
			case errors.As(err, &le):
				d = d.Limited(le.Counter, le.RetryAfter)
			case err != nil:
				out.Flush()
				return fmt.Errorf("policy test: %s: store: %w", tc.label, err)
			}
		}
		got := d.Verdict.String()
		if got != tc.tc.Expect || (tc.tc.ExpectRule != "" && d.Rule != tc.tc.ExpectRule) {
			out.Flush()
			w := cmd.ErrOrStderr()
			fmt.Fprintf(w, "FAIL %s at t=%s: %s %s\n", tc.label, tc.at, tc.call.Grant, tc.call.Tool)
			fmt.Fprintf(w, "  verdict: want %-12s got %s\n", tc.tc.Expect, got)
			if tc.tc.ExpectRule != "" || d.Rule != "" {
				fmt.Fprintf(w, "  rule:    want %-12s got %s\n", orDash(tc.tc.ExpectRule), orDash(d.Rule))
			}
			fmt.Fprintf(w, "  reason:  %s\n", describeReason(d))
			return &exitError{code: 1, msg: fmt.Sprintf("policy test: %s failed (%d of %d calls passed)", tc.label, i, len(calls))}
		}
		shadow := ""
		if d.Shadow {
			shadow = " (shadow)"
		}
		fmt.Fprintf(out, "ok\t%s\tt=%s\t%s%s\t%s\n", tc.label, tc.at, got, shadow, orDash(d.Rule))
	}
	out.Flush()
	fmt.Fprintf(cmd.OutOrStdout(), "PASS: %d calls\n", len(calls))
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func describeReason(d policy.Decision) string {
	r := orDash(d.Reason)
	if d.Verdict == policy.RateLimited {
		r += fmt.Sprintf(" (retry in %s)", d.RetryAfter)
	}
	return r
}

func newPolicyExplainCmd() *cobra.Command {
	var file, tool, argsJSON, grant, vm, session string
	c := &cobra.Command{
		Use:   "explain --policy FILE --tool TOOL [--args JSON] [--grant G] [--vm V] [--session S]",
		Short: "Show how a policy decides one call, step by step",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			eng, err := loadPolicy(file)
			if err != nil {
				return fmt.Errorf("policy explain: %w", err)
			}
			args, err := decodeArgs(argsJSON)
			if err != nil {
				return fmt.Errorf("policy explain: --args: %w", err)
			}
			call := policy.Call{Grant: grant, Tool: tool, VM: vm, Session: session, Args: tools.ArgsWithDefaults(tool, args), Transport: "stdio"}
			if s, ok := args["vm"].(string); ok && call.VM == "" {
				call.VM = s
			}
			if s, ok := args["session"].(string); ok && call.Session == "" {
				call.Session = s
			}
			d, steps := eng.Explain(call)
			printExplain(cmd.OutOrStdout(), eng, call, d, steps)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&file, "policy", "", "policy document (required)")
	f.StringVar(&tool, "tool", "", "tool name (required)")
	f.StringVar(&argsJSON, "args", "{}", "tool arguments as a JSON object")
	f.StringVar(&grant, "grant", "local", "grant (identity) making the call")
	f.StringVar(&vm, "vm", "", "VM id (default: args.vm)")
	f.StringVar(&session, "session", "", "session id (default: args.session)")
	_ = c.MarkFlagRequired("policy")
	_ = c.MarkFlagRequired("tool")
	return c
}

func decodeArgs(s string) (map[string]any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("data after the JSON object")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want a JSON object, got %s", strings.TrimSpace(s))
	}
	return m, nil
}

func printExplain(w io.Writer, eng *policy.Engine, call policy.Call, d policy.Decision, steps []policy.Step) {
	fmt.Fprintf(w, "policy:   %s (sha256 %s)\n", eng.Name(), eng.Fingerprint())
	fmt.Fprintf(w, "call:     grant=%s tool=%s vm=%s session=%s\n", call.Grant, call.Tool, orDash(call.VM), orDash(call.Session))
	verdict := d.Verdict.String()
	if d.Shadow {
		verdict += " (shadow mode: enforcement would do this; the call is allowed)"
	}
	fmt.Fprintf(w, "decision: %s\n", verdict)
	fmt.Fprintf(w, "rule:     %s\n", orDash(d.Rule))
	fmt.Fprintf(w, "reason:   %s\n", orDash(d.Reason))
	if d.Approval != nil {
		fmt.Fprintf(w, "approval: channel %s, ttl %s\n", d.Approval.Channel, d.Approval.TTL)
	}
	if len(d.Counters) > 0 {
		fmt.Fprintln(w, "counters: (each reserved before dispatch, all or none)")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, c := range d.Counters {
			fmt.Fprintf(tw, "  %s\tmax %d per %s\tkey %s\t%s\n", c.Name, c.Max, c.Window, c.Key, c.Rule)
		}
		tw.Flush()
	}
	fmt.Fprintln(w, "trace:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range steps {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", s.Name, s.Result, orDash(s.Rule), s.Detail)
	}
	tw.Flush()
}
