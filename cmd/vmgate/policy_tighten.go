package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/policy/diff"
	"github.com/vmgate/vmgate/policy/replay"
	"github.com/vmgate/vmgate/policy/suggest"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/tools"
)

// Tightening a policy from evidence: `vmgate policy suggest` (policy/suggest),
// `vmgate policy diff` (policy/diff) and `vmgate policy test --replay`
// (policy/replay).

func newPolicySuggestCmd() *cobra.Command {
	var from, grant, since, until, output, window string
	var o suggest.Options
	c := &cobra.Command{
		Use:   "suggest --from audit.log [--grant G] [--since 7d] [--until T] [--only-allowed] [-o FILE]",
		Short: "Write the tightest policy that would have allowed what a grant did, from its audit log",
		Long: `suggest reads the calls one grant made in a period from an audit log and writes
the tightest policy document that would have allowed every one of them that
ran (allowed, approved, or let through by a policy in shadow mode; with
--only-allowed, only those the policy in force allowed, so what a shadow
policy would have refused stays refused):

  - only the tools the grant used (default deny);
  - per argument, the narrowest condition covering every value seen: "in" for
    small sets, "glob" (or "regex" for a few shapes) for paths and ids whose
    numbers and random parts change from call to call, "gte"/"lte" with
    headroom for numbers; "deny_if exists" for an argument never sent. The log
    keeps stdin, env values and file content as digests: no condition on them;
  - per tool and over all tools, a rate limit at the peak seen in any window
    times the headroom;
  - a destructive tool called at most --approve-rare times behind an
    operator's approval, when the evidence covers a day or more; a tool whose
    every call needed an approval keeps needing one.

Every rule carries a "_why" comment with its evidence (the policy parser
ignores keys that start with "_"). The document goes to standard output (or
-o FILE), what got no condition and why to standard error. It passes
"vmgate policy check --strict"; check what it changes with "vmgate policy
diff" and "vmgate policy test --replay" before you put it in force.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			var err error
			if o.Since, err = parseWhen("--since", since, now); err != nil {
				return fmt.Errorf("policy suggest: %w", err)
			}
			if o.Until, err = parseWhen("--until", until, now); err != nil {
				return fmt.Errorf("policy suggest: %w", err)
			}
			if o.Window, err = parseWindowFlag(window); err != nil {
				return fmt.Errorf("policy suggest: %w", err)
			}
			if o.Headroom < 1 {
				return fmt.Errorf("policy suggest: --headroom %v: want 1 or more", o.Headroom)
			}
			o.Grant = grant
			return runPolicySuggest(cmd, from, output, o)
		},
	}
	f := c.Flags()
	f.StringVar(&from, "from", "", "the audit log to learn from (required)")
	f.StringVar(&grant, "grant", "", "the grant whose calls to learn from (needed when the log holds several)")
	f.StringVar(&since, "since", "", "from this time on: a duration before now (7d, 36h) or an RFC 3339 time")
	f.StringVar(&until, "until", "", "before this time: a duration before now or an RFC 3339 time")
	f.BoolVar(&o.OnlyAllowed, "only-allowed", false, "only the calls the policy in force allowed (leave out what a shadow policy would have refused)")
	f.Float64Var(&o.Headroom, "headroom", 2, "limits and numeric bounds: what was seen times this")
	f.StringVar(&window, "window", "minute", "the rate limits' window: second, minute, hour, day or a duration")
	f.IntVar(&o.ApproveRare, "approve-rare", 2, "put a destructive tool called at most this many times behind an approval (-1: never)")
	f.StringVarP(&output, "output", "o", "", "write the policy to FILE instead of standard output")
	_ = c.MarkFlagRequired("from")
	return c
}

func parseWindowFlag(s string) (time.Duration, error) {
	switch s {
	case "second":
		return time.Second, nil
	case "minute":
		return time.Minute, nil
	case "hour":
		return time.Hour, nil
	case "day":
		return 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > 7*24*time.Hour {
		return 0, fmt.Errorf("--window %q: want second, minute, hour, day or a duration up to 168h", s)
	}
	return d, nil
}

// offlineTools is the server's catalogue as policy/suggest takes it.
func offlineTools() []suggest.Tool {
	var out []suggest.Tool
	for _, t := range tools.Catalogue(catalog.DefaultLimits()) {
		st := suggest.Tool{Name: t.Name, Destructive: t.Destructive}
		for _, f := range t.Fields {
			st.Args = append(st.Args, f.Name)
		}
		out = append(out, st)
	}
	return out
}

func runPolicySuggest(cmd *cobra.Command, from, output string, o suggest.Options) error {
	f, err := openLog("policy suggest", from)
	if err != nil {
		return err
	}
	defer f.Close()
	o.Defaults, o.Tools, o.Source = tools.ArgsWithDefaults, offlineTools(), filepath.Base(from)
	ev, err := suggest.Collect(f, o)
	if err != nil {
		return fmt.Errorf("policy suggest: %s: %w", from, err)
	}
	res, err := suggest.Suggest(ev, o)
	if err != nil {
		return fmt.Errorf("policy suggest: %s: %w", from, err)
	}
	for _, n := range res.Notes {
		fmt.Fprintln(cmd.ErrOrStderr(), "note:", n)
	}
	if output == "" {
		_, err = cmd.OutOrStdout().Write(res.Document)
		return err
	}
	if err := os.WriteFile(output, res.Document, 0o644); err != nil {
		return fmt.Errorf("policy suggest: %w", err)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s: %d calls of grant %s\n", output, len(ev.Calls), ev.Grant)
	return nil
}

func newPolicyDiffCmd() *cobra.Command {
	var exitCode bool
	c := &cobra.Command{
		Use:   "diff OLD NEW [--exit-code]",
		Short: "Say in words which calls one policy allows and the other does not",
		Long: `diff compares two policy documents tool by tool, as the engine reads them
(comments, key order and defaults written out change nothing), and prints each
difference in words under its tool: what each decides (allowed, denied, needs
an approval, hidden), shadow mode against enforcement, conditions one has and
the other does not or with other values, limits tightened, loosened, added or
gone, and the blocks one has and the other does not. Each line is marked
"-" when NEW lets fewer calls through, "+" when it lets more, "~" otherwise.
The tools compared are the server's and every tool either document names.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			oldEng, err := loadPolicy(args[0])
			if err != nil {
				return fmt.Errorf("policy diff: %w", err)
			}
			newEng, err := loadPolicy(args[1])
			if err != nil {
				return fmt.Errorf("policy diff: %w", err)
			}
			changes := diff.Compare(oldEng.Describe(), newEng.Describe(), tools.Names())
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "OLD %s\nNEW %s\n", args[0], args[1])
			if len(changes) == 0 {
				fmt.Fprintln(out, "no difference in what they let through")
				return nil
			}
			if err := diff.Write(out, changes); err != nil {
				return err
			}
			if exitCode {
				return &exitError{code: 1, msg: fmt.Sprintf("policy diff: %d differences", len(changes))}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&exitCode, "exit-code", false, "exit with status 1 when the policies differ")
	return c
}

// replayFlags are policy test's flags for --replay.
type replayFlags struct {
	log, grant, since, until string
	json                     bool
}

func (r *replayFlags) add(c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&r.log, "replay", "", "an audit log whose calls to decide again with POLICY (then CASES is not given)")
	f.StringVar(&r.grant, "grant", "", "with --replay: only this grant's calls")
	f.StringVar(&r.since, "since", "", "with --replay: calls from this time on (7d, RFC 3339)")
	f.StringVar(&r.until, "until", "", "with --replay: calls before this time")
	f.BoolVar(&r.json, "json", false, "with --replay: print the result as JSON")
}

func runReplay(cmd *cobra.Command, policyFile string, rf replayFlags) error {
	eng, err := loadPolicy(policyFile)
	if err != nil {
		return fmt.Errorf("policy test: %w", err)
	}
	o := replay.Options{Grant: rf.grant, Defaults: tools.ArgsWithDefaults}
	now := time.Now()
	if o.Since, err = parseWhen("--since", rf.since, now); err != nil {
		return fmt.Errorf("policy test: %w", err)
	}
	if o.Until, err = parseWhen("--until", rf.until, now); err != nil {
		return fmt.Errorf("policy test: %w", err)
	}
	f, err := openLog("policy test", rf.log)
	if err != nil {
		return err
	}
	defer f.Close()
	res, err := replay.Replay(cmd.Context(), f, eng, o)
	if err != nil {
		return fmt.Errorf("policy test: %s: %w", rf.log, err)
	}
	out := cmd.OutOrStdout()
	if rf.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		printReplay(out, rf.log, policyFile, res)
	}
	if res.Stopped > 0 {
		return &exitError{code: 1, msg: fmt.Sprintf("policy test: %s would refuse %d call(s) that went through", policyFile, res.Stopped)}
	}
	return nil
}

const replayRowFormat = "%-24s  %-26s  %-12s  %-22s  %-22s  %-22s  %s\n"

func printReplay(w io.Writer, log, policyFile string, res *replay.Result) {
	if len(res.Changes) > 0 {
		fmt.Fprintf(w, replayRowFormat, "TIME", "CALL", "GRANT", "TOOL", "RECORDED", "NOW", "RULE / REASON")
	}
	for _, c := range res.Changes {
		rec, now := c.Recorded.String(), c.Candidate.String()
		if c.Recorded.Through {
			rec += ", ran"
		}
		if c.Candidate.Through {
			now += ", runs"
		}
		fmt.Fprintf(w, replayRowFormat, stamp(c.Time), cell(c.CallID, 26), cell(c.Grant, 12), cell(c.Tool, 22), rec, now, cell(orDash(c.Rule)+" "+c.Reason, 120))
	}
	fmt.Fprintf(w, "replayed %d calls of %s with %s: %d decision(s) change; %d calls that went through would be refused or parked, %d refused calls would go through\n",
		res.Replayed, log, policyFile, len(res.Changes), res.Stopped, res.Started)
	if len(res.Skipped) > 0 {
		fmt.Fprintf(w, "not replayed: %v\n", res.Skipped)
	}
}
