package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
)

// Row 13: `vmgate audit search` finds a call in a log of 100,000 records
// by each of its filters, against `grep -c` of the same value over the
// same file (what an operator did before): both are whole processes, so
// the row holds vmgate's start-up too. Each round runs every filter once
// on each side, one right after the other; a round's figure is the sum
// over the filters, and the note gives the filter whose own median ratio
// is the worst. Before it counts, each filter must find as many records
// as grep finds lines.

// searchRecords is the size of the row's log.
const searchRecords = 100_000

// searchStart is the time of the log's first record; records are 6 s
// apart, about a week in all.
var searchStart = time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)

// searchCase is one filter and the value grep looks for.
type searchCase struct {
	name  string
	args  []string // vmgate audit search flags
	grepF string   // grep -F pattern
}

func searchCases() []searchCase {
	at := searchStart.Add(60_000 * 6 * time.Second) // a record at :00 of its minute
	at = at.Add(20 * time.Second)
	return []searchCase{
		{"call", []string{"--call", "BENCH-0000077777"}, `"call_id":"BENCH-0000077777"`},
		{"grant", []string{"--grant", "night-shift"}, `"grant":"night-shift"`},
		{"tool", []string{"--tool", "snapshot_revert"}, `"tool":"snapshot_revert"`},
		{"vm", []string{"--vm", "pve/9001"}, `"vm":"pve/9001"`},
		{"decision", []string{"--decision", "approval_denied"}, `"decision":"approval_denied"`},
		{"outcome", []string{"--outcome", "timed_out"}, `"outcome":"timed_out"`},
		{"session", []string{"--session", "5e551011beef"}, `"session":"5e551011beef"`},
		{"text", []string{"--text", "rm -rf /srv/cache"}, `rm -rf /srv/cache`},
		{"time", []string{"--since", at.Format(time.RFC3339), "--until", at.Add(10 * time.Second).Format(time.RFC3339)},
			`"time":"` + at.Format("2006-01-02T15:04:05")[:len("2006-01-02T15:04:0")]}, // the ten seconds from at
	}
}

// writeBenchLog writes the row's log: a mixed load of ten grants on
// twenty VMs, and a few rare records (one in 25,000) for each case.
func writeBenchLog(path string) error {
	l, err := audit.Open(path, audit.Options{Fsync: audit.FsyncInterval, Interval: time.Hour})
	if err != nil {
		return err
	}
	tools := [...]string{"list_vms", "vm_status", "vm_agent_exec", "vm_file_read", "kill_process", "list_processes", "vm_agent_exec_status", "create_session"}
	for i := range searchRecords {
		vm := fmt.Sprintf("lab/vm%02d", i%20)
		r := audit.Record{Time: searchStart.Add(time.Duration(i) * 6 * time.Second), CallID: fmt.Sprintf("BENCH-%010d", i),
			Grant: fmt.Sprintf("ci-%d", i%10), Transport: "http", Tool: tools[i%len(tools)], VM: vm}
		switch {
		case i%2 == 0:
			r.Kind, r.Decision, r.Rule = audit.KindDecision, "allow", "/tools/"+r.Tool
			r.Args = map[string]any{"vm": vm, "command": []any{"make", "-C", "/src", fmt.Sprintf("test-%d", i%97)}, "session": fmt.Sprintf("%012x", i%4096)}
		default:
			r.Kind, r.Outcome, r.DurationMS = audit.KindOutcome, "ok", float64(i%900)/10
		}
		if i%25_000 == 77_777%25_000 {
			r.Grant, r.Tool, r.VM = "night-shift", "snapshot_revert", "pve/9001"
			r.Kind, r.Decision, r.Outcome = audit.KindDecision, "approval_denied", ""
			r.Args = map[string]any{"vm": "pve/9001", "command": []any{"sh", "-c", "rm -rf /srv/cache"}, "session": "5e551011beef"}
		}
		if i%25_000 == 3 {
			r.Kind, r.Decision, r.Outcome, r.Args = audit.KindOutcome, "", "timed_out", nil
		}
		if _, err := l.AppendWritten(context.Background(), r); err != nil {
			l.Close()
			return err
		}
	}
	return l.Close()
}

// timed runs a command and returns its wall time in ms and its output.
func timed(ctx context.Context, name string, args ...string) (float64, string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err := cmd.Run()
	ms := float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		return 0, "", fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, errOut.String())
	}
	return ms, strings.TrimSpace(out.String()), nil
}

// searchRow measures row 13.
func searchRow(ctx context.Context, vmgate string, warmup, pairs int) *Row {
	r := &Row{ID: "13", Unit: "ms",
		What: "audit search on a 100,000-record log, each filter once (call, grant, tool, VM, decision, outcome, session, text, time): vmgate audit search --count / grep -c of the same value"}
	dir, err := os.MkdirTemp("", "vmgate-bench-search-")
	if err != nil {
		r.Err = err
		return r
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "audit.log")
	if err := writeBenchLog(path); err != nil {
		r.Err = fmt.Errorf("bench: writing the log: %w", err)
		return r
	}
	cases := searchCases()
	perCase := make([][2][]float64, len(cases))
	r.Err = Rounds(ctx, warmup, pairs, func(ctx context.Context, _ int, counts bool) error {
		var a, b float64
		for i, c := range cases {
			ta, n, err := timed(ctx, vmgate, append([]string{"audit", "search", path, "--count"}, c.args...)...)
			if err != nil {
				return err
			}
			tb, m, err := timed(ctx, "grep", "-c", "-F", "--", c.grepF, path)
			if err != nil {
				return err
			}
			if n != m || n == "0" {
				return fmt.Errorf("bench: %s: vmgate found %s records, grep %s lines; want the same, at least one", c.name, n, m)
			}
			a, b = a+ta, b+tb
			if counts {
				perCase[i][0], perCase[i][1] = append(perCase[i][0], ta), append(perCase[i][1], tb)
			}
		}
		if !counts {
			return nil
		}
		return r.Add(a, b)
	})
	worst, at := 0.0, ""
	for i, c := range cases {
		if len(perCase[i][0]) == 0 {
			continue
		}
		ma, _ := medianSpread(perCase[i][0])
		mb, _ := medianSpread(perCase[i][1])
		if q := ma / mb; q > worst && !math.IsInf(q, 0) {
			worst, at = q, c.name
		}
	}
	if at != "" {
		r.Note = fmt.Sprintf("worst filter %s: %s; goal ≤ 3", at, formatRatio(worst))
	}
	return r
}
