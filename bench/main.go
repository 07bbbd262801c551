// Command vmgate-bench measures vmgate against its baselines and prints
// one table: every row is a ratio of two medians measured in the same run,
// A B A B … over several rounds after a warm-up, so the load of a shared
// machine hits both sides alike.
//
// It is its own Go module so that the product never carries what only the
// comparison needs (OPA). It measures vmgate through its public packages
// (policy, policy/audit, policy/store/..., server, hypervisor, guest/qga),
// through the vmgate binary (lab VMs, `vmgate serve` with its plugins) and,
// for what needs the main module's unexported code, through that module's
// own benchmarks run as test binaries. scripts/bench.sh builds all of them
// and runs this command:
//
//	vmgate-bench -vmgate BIN/vmgate -tests BIN -src ROOT [-pairs 6] [-only gate,decide]
//
// The rows:
//
//	1a, 1b  exec latency on a lab VM: vm_agent_exec against raw guest-exec,
//	        polled back to back and once a second
//	1c      the same raw agent client polling as the drivers do (qga.Exec)
//	        against back to back: how much of 1a is the pacing
//	1d      raw execs on the baselines' second guest agent against the
//	        driver's agent: the two agents are alike (about 1)
//	2a, 2b  gate cost: the whole gate against a bare mcp-go server, stdio
//	        sequential (p50) and HTTP with 32 clients (calls/s)
//	2c–2h   the shipped binary: `vmgate serve` (driver plugin, fsync always;
//	        a rate-limited call and one with no counter; and --in-process
//	        with fsync interval) against a bare mcp-go stdio server process,
//	        sequential (p50) and 8 in flight (calls/s)
//	3       decision: policy.Engine.Decide against OPA
//	4       plugin boundary: a no-op driver call through a plugin process
//	        (its call socket) against in process
//	5       audit: appends/s at 64 writers, group commit against one fsync per record
//	6a, 6b  scale: list_vms of 500 VMs; exec throughput of 4 lab VMs against 1
//	6c, 6d  fleet: list_vms's first page of 100 of 1,000 VMs over 4 backends
//	        (external fleet plugins) against a bare server answering the
//	        same page; RSS of serve and its plugins with 1,000 VMs and
//	        leases against 10 (fleet.go)
//	7       memory: RSS of vmgate serve and its plugins after the load against idle
//	8–8e    resident helper: exec in a sandboxed session, a one-shot
//	        sandboxed exec and create_session against plain vm_agent_exec;
//	        a running command's output seen through vm_agent_exec_status;
//	        the Proxmox/VirtualBox roads, per command against the resident
//	        helper (resident.go)
//	10      VMs on demand: vm_create to the first exec on the lab template against
//	        lab.Create to the first raw guest-exec
//	11      screen: vm_screenshot through vmgate serve against a raw QMP
//	        screendump
//	12a–12c files at the guestctl level: a 64 MiB file read and written in
//	        16 MiB ranges, a 2,000-file tar extracted, against the guest
//	        agent's raw file loops and tar through guest-exec (files.go)
//	13      audit search: vmgate audit search on a 100,000-record log, by each
//	        filter, against grep -c of the same value
//
// The table goes to standard output, progress to standard error. The exit
// status is 1 when any row failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// groups are the names -only accepts, in the order they run.
var groups = []string{"decide", "scale", "audit", "search", "plugin", "gate", "shipped", "fleet", "lab", "resident", "snapshot", "create", "screen", "files"}

// options are the command's flags, validated.
type options struct {
	vmgate, tests, src string
	plugins            string
	pairs, warmup      int
	only               []string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("vmgate-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var only string
	fs.StringVar(&o.vmgate, "vmgate", "", "the vmgate binary (lab rows)")
	fs.StringVar(&o.tests, "tests", "", "directory with server.test, audit.test, pluginhost.test and guestctl.test (go test -c)")
	fs.StringVar(&o.src, "src", "", "root of the vmgate main module (the test binaries run in their package directories)")
	fs.StringVar(&o.plugins, "plugins", "", "directory with vmgate-plugin-fleet (bench/fleetplugin; fleet rows)")
	fs.IntVar(&o.pairs, "pairs", 6, "rounds that count, each one A and one B (at least 5)")
	fs.IntVar(&o.warmup, "warmup", 1, "rounds run first and thrown away")
	fs.StringVar(&only, "only", strings.Join(groups, ","), "comma-separated groups to run: "+strings.Join(groups, ", "))
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}
	if o.pairs < 5 || o.pairs > 1000 {
		return o, fmt.Errorf("bench: -pairs %d: want 5 to 1000", o.pairs)
	}
	if o.warmup < 1 || o.warmup > 100 {
		return o, fmt.Errorf("bench: -warmup %d: want 1 to 100", o.warmup)
	}
	for _, g := range strings.Split(only, ",") {
		g = strings.TrimSpace(g)
		if !slices.Contains(groups, g) {
			return o, fmt.Errorf("bench: -only: unknown group %q (want %s)", g, strings.Join(groups, ", "))
		}
		if !slices.Contains(o.only, g) {
			o.only = append(o.only, g)
		}
	}
	needs := func(flagName, value string, gs ...string) error {
		for _, g := range gs {
			if slices.Contains(o.only, g) && value == "" {
				return fmt.Errorf("bench: group %s needs -%s", g, flagName)
			}
		}
		return nil
	}
	return o, errors.Join(needs("vmgate", o.vmgate, "search", "lab", "resident", "shipped", "fleet", "snapshot", "create", "screen", "files"),
		needs("tests", o.tests, "audit", "plugin", "gate", "resident"), needs("src", o.src, "audit", "plugin", "gate", "resident"),
		needs("plugins", o.plugins, "fleet"))
}

// machine describes where the table was measured.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d CPUs (%s), %s/%s, Linux %s, %s", runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH, kernel, runtime.Version())
}

func main() {
	if ok, err := runBare(os.Args); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	m := mainTests{Bins: o.tests, Src: o.src}
	var rows []*Row
	for _, g := range groups {
		if !slices.Contains(o.only, g) {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s …\n", g)
		settle()
		t0 := time.Now()
		switch g {
		case "decide":
			rows = append(rows, decideRow(ctx, o.warmup, o.pairs))
		case "scale":
			rows = append(rows, listVMsRow(ctx, o.warmup, o.pairs))
		case "audit":
			rows = append(rows, auditRow(ctx, m, o.warmup, o.pairs))
		case "search":
			rows = append(rows, searchRow(ctx, o.vmgate, o.warmup, o.pairs))
		case "plugin":
			rows = append(rows, pluginRow(ctx, m, o.warmup, o.pairs))
		case "gate":
			rows = append(rows, gateRows(ctx, m, o.warmup, o.pairs)...)
		case "shipped":
			rows = append(rows, shippedRows(ctx, o.vmgate, o.warmup, o.pairs)...)
		case "fleet":
			rows = append(rows, fleetRows(ctx, o.vmgate, o.plugins, o.warmup, o.pairs)...)
		case "lab":
			rows = append(rows, labRows(ctx, o.vmgate, o.warmup, o.pairs)...)
		case "resident":
			rows = append(rows, residentRows(ctx, o.vmgate, m, o.warmup, o.pairs)...)
		case "snapshot":
			rows = append(rows, snapshotRows(ctx, o.vmgate, o.warmup, o.pairs)...)
		case "files":
			rows = append(rows, fileRows(ctx, o.vmgate, o.warmup, o.pairs)...)
		case "create":
			rows = append(rows, createRow(ctx, o.vmgate, o.warmup, o.pairs))
		case "screen":
			rows = append(rows, screenRow(ctx, o.vmgate, o.warmup, o.pairs))
		}
		fmt.Fprintf(os.Stderr, "bench: %s took %v\n", g, time.Since(t0).Round(time.Second))
	}
	slices.SortStableFunc(rows, func(a, b *Row) int { return strings.Compare(a.ID, b.ID) })
	header := fmt.Sprintf("vmgate bench, %s; %d pairs (A B A B …) after %d warm-up; ±: half the range of a side's figures; took %v",
		machine(), o.pairs, o.warmup, time.Since(start).Round(time.Second))
	if err := WriteTable(os.Stdout, header, rows); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, r := range rows {
		if r.Err != nil {
			os.Exit(1)
		}
	}
}

// runBare serves a bare baseline when args (this binary run again by a
// row) ask for one: bareStdioArg LABDIR or bareFleetArg VMS. ok says
// whether they did; the server's error ends it.
func runBare(args []string) (ok bool, err error) {
	if len(args) != 3 {
		return false, nil
	}
	switch args[1] {
	case bareStdioArg:
		return true, serveBare(args[2])
	case bareFleetArg:
		return true, serveBareFleet(args[2])
	}
	return false, nil
}

// settle writes back what is dirty in the page cache before a group runs:
// the binaries scripts/bench.sh just built (about 150 MiB), another
// group's files. The kernel writes such data back about 30 s after it was
// written, in the middle of a later group, whose fsyncs (rows 2c–2h, 5)
// would then wait behind it. In four whole runs on the lab machine it
// moved no row beyond the runs' own spread; it keeps the rows from
// depending on what ran before them.
func settle() { syscall.Sync() }
