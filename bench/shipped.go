package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/plugins/qemu"
)

// The shipped rows (2c–2h) run the real `vmgate serve` binary the way a
// user runs it, over stdio, against a bare mcp-go stdio server in a process
// of its own (this binary with the bareStdioArg argument), through the same
// client. The call is list_vms on a QEMU backend with no VMs: the request
// crosses the MCP stdio pipe and the gate (strict decoding, decision,
// reservation, audit), and the driver's answer comes back: from the QEMU
// driver in its plugin process (it reads its empty lab directory) or, for
// calls within a second of the last one that reached it, from the plugin
// host's state cache, which is what a polling agent gets too (row 4
// measures the plugin boundary itself). The bare server answers the same
// list_vms with the same (empty) list from the same QEMU driver in process
// (reading an absent lab directory too). So the ratio is what vmgate costs
// in front of a driver that answers at once.
//
// Every server starts once and keeps running; each round measures the bare
// server and one subject together, for every subject, so each pair of
// figures shares the machine's load (see measure).

// bareStdioArg makes this binary (or its test binary) the bare baseline: an
// mcp-go stdio server with list_vms over the QEMU driver, in process, whose
// lab directory is the next argument (one that does not exist: no VMs).
const bareStdioArg = "bare-stdio"

// shippedCalls are the sequential calls behind one p50; parallelCalls the
// calls behind one calls/s figure with inFlight calls in flight.
const (
	shippedCalls  = 1000
	parallelCalls = 2000
	inFlight      = 8
)

// serveBare is the body of the bare baseline process: the same driver
// vmgate serve runs, doing the same work (reading an absent lab
// directory), with no gate in front of it.
func serveBare(labDir string) error {
	drv, err := qemu.New(qemu.Config{LabDir: labDir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	return mcpserver.NewStdioServer(bareListVMs(drv)).Listen(context.Background(), os.Stdin, os.Stdout)
}

// The policies of the shipped rows. limitedPolicy puts a counter on every
// call, as the built-in default policy does (all_calls, per grant), with a
// maximum no run reaches; openPolicy allows list_vms with no counter.
const (
	limitedPolicy = `{"version":"1","default":"deny",
  "all_tools":{"limits":[{"counter":"all_calls","window":"minute","max":1000000000,"scope":"grant"}]},
  "tools":{"list_vms":{}}}`
	openPolicy = `{"version":"1","default":"deny","tools":{"list_vms":{}}}`
)

// subject is one configuration of vmgate serve the shipped rows measure.
type subject struct {
	name      string // for errors
	policy    string
	fsync     string // audit fsync setting
	inProcess bool
	seq, par  *Row
}

// stdioProc is a server process with an MCP client on its stdio.
type stdioProc struct {
	cmd    *exec.Cmd
	client *mcpClient
	stderr *tailBuffer
	waited chan error
}

// startStdio starts cmd (which must not be started) and completes the MCP
// handshake on its stdio. The process gets SIGKILL if this one dies.
func startStdio(ctx context.Context, cmd *exec.Cmd) (*stdioProc, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &stdioProc{cmd: cmd, stderr: &tailBuffer{max: 4000}, waited: make(chan error, 1)}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", cmd.Path, err)
	}
	go func() { p.waited <- cmd.Wait() }()
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p.client, err = newMCPClient(hctx, stdin, stdout)
	if err != nil {
		stdin.Close()
		p.kill()
		return nil, fmt.Errorf("%s: %w: %s", cmd.Path, err, p.stderr.String())
	}
	return p, nil
}

// kill ends the process by its pid and waits for it.
func (p *stdioProc) kill() {
	p.cmd.Process.Kill()
	<-p.waited
}

// stop closes the process's input, which ends it, and waits; one that does
// not exit within 20 s is killed by its pid and reported.
func (p *stdioProc) stop() error {
	p.client.Close()
	select {
	case err := <-p.waited:
		if err != nil {
			return fmt.Errorf("%s: %w: %s", p.cmd.Path, err, p.stderr.String())
		}
		return nil
	case <-time.After(20 * time.Second):
		p.kill()
		return fmt.Errorf("%s did not exit 20s after end of input; killed", p.cmd.Path)
	}
}

// startShipped writes a state directory with sub's config and policy under
// dir and starts `vmgate serve` on it. It returns the state directory.
func startShipped(ctx context.Context, vmgate, dir string, sub subject) (*stdioProc, string, error) {
	state, err := os.MkdirTemp(dir, "s-")
	if err != nil {
		return nil, "", err
	}
	pol := filepath.Join(state, "policy.json")
	if err := os.WriteFile(pol, []byte(sub.policy), 0o600); err != nil {
		return nil, "", err
	}
	cfg := "state_dir: " + strconv.Quote(state) + "\n" +
		"audit: {fsync: " + sub.fsync + "}\n" +
		"grants: [{name: local, policy: " + strconv.Quote(pol) + "}]\n" +
		"backends: [{name: lab, driver: qemu, settings: {lab: true}}]\n"
	cfgPath := filepath.Join(state, "vmgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, "", err
	}
	args := []string{"serve", "--config", cfgPath}
	if sub.inProcess {
		args = append(args, "--in-process")
	}
	cmd := exec.Command(vmgate, args...)
	cmd.Env = append(os.Environ(), "VMGATE_STATE_DIR="+state)
	p, err := startStdio(ctx, cmd)
	return p, state, err
}

// startBare starts this binary as the bare baseline server with the lab
// directory labDir.
func startBare(ctx context.Context, labDir string) (*stdioProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return startStdio(ctx, exec.Command(self, bareStdioArg, labDir))
}

// noVMs checks a list_vms result of the shipped rows: an empty list.
var noVMs = countVMs(0)

// callsPerSecond makes n calls of list_vms with k in flight at a time and
// returns the completed calls per second.
func callsPerSecond(ctx context.Context, c *mcpClient, n, k int) (float64, error) {
	var next sync.Mutex
	left := n
	errs := make([]error, k)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range k {
		wg.Go(func() {
			for {
				next.Lock()
				if left == 0 {
					next.Unlock()
					return
				}
				left--
				next.Unlock()
				res, err := c.callTool(ctx, "list_vms", "{}")
				if err == nil {
					err = noVMs(res)
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return perSecond(n, start, errs)
}

// perSecond is n completed operations since start, per second; any error
// in errs fails it.
func perSecond(n int, start time.Time, errs []error) (float64, error) {
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return float64(n) / took.Seconds(), nil
}

// figures are one server's figures of one round.
type figures struct {
	p50, rate float64
}

// measure is one round of figures of a subject and the bare server. The
// p50s come from calls alternating one by one between the two (the order
// flipping every pair), so both sides see the machine as it is at that
// moment, and each server is idle for one call of the other's before its
// next, as a server an agent calls now and then is; the calls/s figures
// are one burst each, in the order first says (the subject's first when
// true).
func measure(ctx context.Context, sub, bare *mcpClient, first bool) (s, b figures, err error) {
	if s.p50, b.p50, err = p50Pair(ctx, sub, bare, shippedCalls, "list_vms", "{}", noVMs); err != nil {
		return s, b, err
	}
	burst := func(c *mcpClient, r *float64) error {
		var err error
		*r, err = callsPerSecond(ctx, c, parallelCalls, inFlight)
		return err
	}
	if first {
		if err = burst(sub, &s.rate); err == nil {
			err = burst(bare, &b.rate)
		}
	} else {
		if err = burst(bare, &b.rate); err == nil {
			err = burst(sub, &s.rate)
		}
	}
	return s, b, err
}

// p50Pair makes n calls of tool on each of a and b, alternating one by one
// (a b b a a b …), and returns each side's median latency in µs. A failed
// call or check is the error of the side it was made on.
func p50Pair(ctx context.Context, a, b *mcpClient, n int, tool, args string, check func(toolResult) error) (pa, pb float64, err error) {
	lat := [2][]float64{make([]float64, 0, n), make([]float64, 0, n)}
	cs := [2]*mcpClient{a, b}
	for i := range 2 * n {
		side := (i + i/2) % 2 // 0 1 1 0 0 1 1 0 …
		t0 := time.Now()
		res, err := cs[side].callTool(ctx, tool, args)
		took := time.Since(t0)
		if err == nil && check != nil {
			err = check(res)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("%s side: %w", [2]string{"first", "second"}[side], err)
		}
		lat[side] = append(lat[side], float64(took.Nanoseconds())/1e3)
	}
	pa, _ = medianSpread(lat[0])
	pb, _ = medianSpread(lat[1])
	return pa, pb, nil
}

// shippedRows measures vmgate serve as shipped (QEMU driver as a plugin,
// fsync always; a rate-limited call and one with no counter) and in process
// with fsync interval against the bare server.
func shippedRows(ctx context.Context, vmgate string, warmup, pairs int) []*Row {
	const what = "list_vms on a QEMU backend with no VMs (repeats within 1 s answered by the plugin host's state cache), stdio, separate processes"
	subs := []subject{
		{name: "shipped", policy: limitedPolicy, fsync: "always",
			seq: &Row{ID: "2c", Unit: "µs", What: "as shipped (driver plugin, fsync always), a rate-limited call (its reservation held by an advance: one fsync per 32 calls), p50: vmgate serve / bare mcp-go; " + what},
			par: &Row{ID: "2d", Unit: "calls/s", What: fmt.Sprintf("as shipped, a rate-limited call, %d in flight: vmgate serve / bare mcp-go", inFlight)}},
		{name: "shipped, no counter", policy: openPolicy, fsync: "always",
			seq: &Row{ID: "2e", Unit: "µs", What: "as shipped, a read-only call with no counter (no fsync wait), p50: vmgate serve / bare mcp-go"},
			par: &Row{ID: "2f", Unit: "calls/s", What: fmt.Sprintf("as shipped, a read-only call with no counter, %d in flight: vmgate serve / bare mcp-go", inFlight)}},
		{name: "in process, fsync interval", policy: limitedPolicy, fsync: "interval", inProcess: true,
			seq: &Row{ID: "2g", Unit: "µs", What: "--in-process, fsync interval, a rate-limited call, p50: vmgate serve / bare mcp-go"},
			par: &Row{ID: "2h", Unit: "calls/s", What: fmt.Sprintf("--in-process, fsync interval, a rate-limited call, %d in flight: vmgate serve / bare mcp-go", inFlight)}},
	}
	var rows []*Row
	for _, s := range subs {
		rows = append(rows, s.seq, s.par)
	}
	fail := func(err error) []*Row {
		for _, r := range rows {
			if r.Err == nil {
				r.Err = err
			}
		}
		return rows
	}
	dir, err := os.MkdirTemp("", "vmgb-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	var procs []*stdioProc
	defer func() {
		for _, p := range procs {
			if err := p.stop(); err != nil {
				fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			}
		}
	}()
	bare, err := startBare(ctx, filepath.Join(dir, "no-lab"))
	if err != nil {
		return fail(fmt.Errorf("bare server: %w", err))
	}
	procs = append(procs, bare)
	subProcs := make([]*stdioProc, len(subs))
	for i, s := range subs {
		p, _, err := startShipped(ctx, vmgate, dir, s)
		if err != nil {
			return fail(fmt.Errorf("vmgate serve (%s): %w", s.name, err))
		}
		procs = append(procs, p)
		subProcs[i] = p
	}
	err = Rounds(ctx, warmup, pairs, func(ctx context.Context, round int, counts bool) error {
		for i, s := range subs {
			f, b, err := measure(ctx, subProcs[i].client, bare.client, round%2 == 0)
			if err != nil {
				return fmt.Errorf("vmgate serve (%s) against the bare server: %w: %s%s", s.name, err, subProcs[i].stderr.String(), bare.stderr.String())
			}
			if counts {
				if err := errors.Join(s.seq.Add(f.p50, b.p50), s.par.Add(f.rate, b.rate)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	return rows
}

// tailBuffer keeps the last max bytes written to it. mu guards buf.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

var _ io.Writer = (*tailBuffer)(nil)

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
