package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/lab"
)

// The lab rows drive the vmgate binary as a user would: `vmgate lab up`
// boots the lab VMs in a temporary state directory, `vmgate serve` runs
// over stdio with its plugin processes (the QEMU driver runs in one) and
// the bench talks MCP to it. The exec baselines talk to the same guest
// directly with guest/qga, through a second guest agent (see agent2.go), so
// that gated and raw execs alternate one by one.

// labVMs is the number of lab VMs the scale row runs in parallel.
const labVMs = 4

// errQEMUMissing means lab VMs cannot run here.
var errQEMUMissing = errors.New("qemu-system-x86_64 not on PATH")

// labEnv is a set of lab VMs in their own state directory.
type labEnv struct {
	vmgate   string // the vmgate binary
	stateDir string
}

// vmgateCmd builds a vmgate command on the lab's state directory, owned by
// this process (SIGKILL when it dies).
func (l *labEnv) vmgateCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, l.vmgate, append([]string{"--state-dir", l.stateDir}, args...)...)
	cmd.Env = append(os.Environ(), "VMGATE_STATE_DIR="+l.stateDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (l *labEnv) run(ctx context.Context, args ...string) error {
	cmd := l.vmgateCmd(ctx, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("vmgate %s: %w: %s", strings.Join(args, " "), err, tail(out, 2000))
	}
	return nil
}

// startLab boots n lab VMs (extra: more flags of lab up). The caller
// must call stop, also on error.
func startLab(ctx context.Context, vmgate string, n int, extra ...string) (*labEnv, error) {
	// A short path: the sockets live under it and sun_path is 107 bytes.
	dir, err := os.MkdirTemp("", "vmgb-")
	if err != nil {
		return nil, err
	}
	l := &labEnv{vmgate: vmgate, stateDir: dir}
	if err := l.run(ctx, append([]string{"lab", "up", "--vms", strconv.Itoa(n)}, extra...)...); err != nil {
		return l, err
	}
	return l, nil
}

// stop stops every lab VM and removes the state directory.
// stopLogged stops the lab for a deferred call on a nil-safe l, saying on
// stderr when that fails (the rows are measured by then).
func (l *labEnv) stopLogged() {
	if l == nil {
		return
	}
	if err := l.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: lab down: %v\n", err)
	}
}

func (l *labEnv) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := l.run(ctx, "lab", "down")
	if rerr := os.RemoveAll(l.stateDir); err == nil {
		err = rerr
	}
	return err
}

// benchPolicy allows what the lab rows call, with a counter on exec so
// the reservation path runs as it does under a real policy.
const benchPolicy = `{"version":"1","default":"deny",
  "all_tools":{"limits":[{"counter":"all_calls","window":"minute","max":100000000,"scope":"grant"}]},
  "tools":{"list_vms":{},"vm_status":{},"create_session":{},"destroy_session":{},"vm_agent_exec_status":{},
    "vm_agent_exec":{"limits":[{"counter":"exec_per_vm","window":"minute","max":100000000,"scope":["grant","vm"]}]}}}`

// writeConfig writes vmgate.yaml and its policy: bbolt store and audit log
// with fsync always (the defaults) in the state directory, the lab VMs as
// backend "lab".
func (l *labEnv) writeConfig() (string, error) {
	pol := filepath.Join(l.stateDir, "bench-policy.json")
	if err := os.WriteFile(pol, []byte(benchPolicy), 0o600); err != nil {
		return "", err
	}
	cfg := "state_dir: " + strconv.Quote(l.stateDir) + "\n" +
		"audit: {fsync: always}\n" +
		"grants: [{name: local, policy: " + strconv.Quote(pol) + "}]\n" +
		"backends: [{name: lab, driver: qemu, settings: {lab: true}}]\n"
	p := filepath.Join(l.stateDir, "bench-vmgate.yaml")
	return p, os.WriteFile(p, []byte(cfg), 0o600)
}

// serve starts `vmgate serve --config cfg` and completes the MCP handshake.
func (l *labEnv) serve(ctx context.Context, cfg string) (*stdioProc, error) {
	// Not CommandContext: the process is stopped by closing its input, and
	// killed by pid only if it does not exit.
	cmd := exec.Command(l.vmgate, "serve", "--config", cfg)
	cmd.Env = append(os.Environ(), "VMGATE_STATE_DIR="+l.stateDir)
	return startStdio(ctx, cmd)
}

// treeRSS returns the summed resident set of pid and all its descendants
// in MiB, and how many processes that is.
func treeRSS(pid int) (mib float64, procs int, err error) {
	children := map[int][]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, err
	}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			children[pp] = append(children[pp], p)
		}
	}
	var kib int64
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		k, err := vmRSSKiB(p)
		if err != nil {
			if p == pid {
				return 0, 0, err
			}
			continue
		}
		kib += k
		procs++
		queue = append(queue, children[p]...)
	}
	return float64(kib) / 1024, procs, nil
}

func vmRSSKiB(pid int) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("rss: pid %d: odd VmRSS line %q", pid, line)
			}
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("rss: pid %d: no VmRSS", pid)
}

// execTrue runs /bin/true on vm through vm_agent_exec and returns its latency.
func execTrue(ctx context.Context, c *mcpClient, vm string) (time.Duration, error) {
	return execTrueIn(ctx, c, vm, "")
}

// execTrueIn is execTrue in session (none when "").
func execTrueIn(ctx context.Context, c *mcpClient, vm, session string) (time.Duration, error) {
	if session == "" {
		return execTrueArgs(ctx, c, vm, "")
	}
	return execTrueArgs(ctx, c, vm, `,"session":"`+session+`"`)
}

// execTrueArgs is execTrue with more arguments (JSON members, each after a
// comma).
func execTrueArgs(ctx context.Context, c *mcpClient, vm, more string) (time.Duration, error) {
	args := `{"vm":"lab/` + vm + `","command":["/bin/true"]` + more
	t0 := time.Now()
	res, err := c.callTool(ctx, "vm_agent_exec", args+"}")
	took := time.Since(t0)
	if err != nil {
		return 0, err
	}
	var out struct {
		Exited   bool `json:"exited"`
		ExitCode int  `json:"exit_code"`
	}
	if err := json.Unmarshal(res.StructuredContent, &out); err != nil {
		return 0, fmt.Errorf("vm_agent_exec: %w", err)
	}
	if !out.Exited || out.ExitCode != 0 {
		return 0, fmt.Errorf("vm_agent_exec /bin/true on %s = %s; want exited with 0", vm, res.StructuredContent)
	}
	return took, nil
}

// rawExec runs /bin/true through guest-exec and polls guest-exec-status
// every interval (0: back to back) until it exited, and returns the latency.
func rawExec(ctx context.Context, c *qga.Client, interval time.Duration) (time.Duration, error) {
	t0 := time.Now()
	pid, err := c.ExecStart(ctx, qga.ExecRequest{Path: "/bin/true"})
	if err != nil {
		return 0, fmt.Errorf("guest-exec: %w", err)
	}
	for {
		if interval > 0 {
			time.Sleep(interval)
		}
		st, err := c.ExecStatus(ctx, pid, 0)
		if err != nil {
			return 0, fmt.Errorf("guest-exec-status: %w", err)
		}
		if st.Exited {
			if st.ExitCode != 0 {
				return 0, fmt.Errorf("guest-exec /bin/true exited %d", st.ExitCode)
			}
			return time.Since(t0), nil
		}
	}
}

// pacedExec runs /bin/true through c as the drivers do (qga.Exec: a
// settling pause, then back-to-back polls) and returns its latency.
func pacedExec(ctx context.Context, c *qga.Client) (time.Duration, error) {
	t0 := time.Now()
	st, err := c.Exec(ctx, qga.ExecRequest{Path: "/bin/true"})
	if err != nil {
		return 0, fmt.Errorf("exec: %w", err)
	}
	if st.ExitCode != 0 {
		return 0, fmt.Errorf("exec /bin/true exited %d", st.ExitCode)
	}
	return time.Since(t0), nil
}

// guestTick is the lab guest's timer tick (a Debian kernel: HZ=250). A
// command's end is seen on a tick, so back-to-back execs lock onto a phase
// of the tick: one loop's execs all took about 8 ms, the next one's 11.5 ms
// on the same guest, and a path with a millisecond more before guest-exec
// (the gate) could stay in the slow phase while the raw loop found the fast
// one. Both sides of row 1a therefore pause a random part of a tick before
// each exec (not timed), so each median is over every phase.
const guestTick = 4 * time.Millisecond

// dephased is f after a random pause of less than a guest tick.
func dephased(f func() (time.Duration, error)) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		time.Sleep(rand.N(guestTick))
		return f()
	}
}

// interleaved runs each of fs n times, one of each in turn (the order
// rotating every turn, so none always follows the same one), and returns
// each one's median in ms.
func interleaved(n int, fs ...func() (time.Duration, error)) ([]float64, error) {
	v := make([][]float64, len(fs))
	for k := range n {
		for j := range fs {
			i := (k + j) % len(fs)
			d, err := fs[i]()
			if err != nil {
				return nil, err
			}
			v[i] = append(v[i], float64(d.Nanoseconds())/1e6)
		}
	}
	m := make([]float64, len(fs))
	for i := range v {
		m[i], _ = medianSpread(v[i])
	}
	return m, nil
}

// medianMs runs f n times and returns the median in ms.
func medianMs(n int, f func() (time.Duration, error)) (float64, error) {
	v := make([]float64, 0, n)
	for range n {
		d, err := f()
		if err != nil {
			return 0, err
		}
		v = append(v, float64(d.Nanoseconds())/1e6)
	}
	m, _ := medianSpread(v)
	return m, nil
}

// execRate runs perVM execs of /bin/true on each of vms in parallel and
// returns the completed execs per second.
func execRate(ctx context.Context, c *mcpClient, vms []string, perVM int) (float64, error) {
	errs := make([]error, len(vms))
	var wg sync.WaitGroup
	start := time.Now()
	for i, vm := range vms {
		wg.Go(func() {
			for range perVM {
				if _, err := execTrue(ctx, c, vm); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return perSecond(len(vms)*perVM, start, errs)
}

// failRows sets err on every row that has fewer than pairs figures.
func failRows(rows []*Row, pairs int, err error) []*Row {
	for _, r := range rows {
		if r.Err == nil && len(r.A) < pairs {
			r.Err = err
		}
	}
	return rows
}

// withoutQEMU marks rows skipped (or failed, when VMGATE_REQUIRE_VM is
// set) when lab VMs cannot run here, and reports whether it did.
func withoutQEMU(rows []*Row) bool {
	if _, err := exec.LookPath("qemu-system-x86_64"); err == nil {
		return false
	}
	for _, r := range rows {
		if os.Getenv("VMGATE_REQUIRE_VM") != "" {
			r.Err = fmt.Errorf("%w and VMGATE_REQUIRE_VM is set", errQEMUMissing)
		} else {
			r.Skip = errQEMUMissing.Error()
		}
	}
	return true
}

// labRows measures exec latency (1a to 1d), parallel exec throughput over 4
// VMs (6b) and the server's memory (7); rows 8–8e are the resident group's
// (resident.go). Without QEMU the rows are skipped,
// unless VMGATE_REQUIRE_VM is set, which makes them fail.
func labRows(ctx context.Context, vmgate string, warmup, pairs int) []*Row {
	b := &labBench{
		tight:  &Row{ID: "1a", Unit: "ms", What: "exec /bin/true latency: vm_agent_exec (MCP stdio, gate, QEMU driver plugin, QGA) / raw guest-exec polled back to back, execs alternating"},
		poll1s: &Row{ID: "1b", Unit: "ms", What: "exec /bin/true latency: vm_agent_exec (MCP stdio, gate, QEMU driver plugin, QGA) / raw guest-exec polled once a second"},
		paced:  &Row{ID: "1c", Unit: "ms", What: "exec /bin/true latency: raw guest-exec polled as vmgate polls it (qga.Exec) / polled back to back: the pacing's share of 1a"},
		alike:  &Row{ID: "1d", Unit: "ms", What: "exec /bin/true latency, raw, polled back to back: on the baselines' second guest agent / on the agent the driver uses (server stopped): should be 1"},
		par: &Row{ID: "6b", Unit: "execs/s", What: fmt.Sprintf("scale: exec throughput, %d lab VMs in parallel / 1 lab VM, through vmgate serve", labVMs),
			Note: fmt.Sprintf("%d CPUs", runtime.NumCPU())},
		mem: &Row{ID: "7", Unit: "MiB", What: "memory: RSS of vmgate serve and its plugin processes, after the load / idle"},
	}
	rows := []*Row{b.tight, b.poll1s, b.paced, b.alike, b.par, b.mem}
	fail := func(err error) []*Row { return failRows(rows, pairs, err) }
	if withoutQEMU(rows) {
		return rows
	}
	l, err := startLab(ctx, vmgate, labVMs)
	defer l.stopLogged()
	if err != nil {
		return fail(err)
	}
	b.l = l
	if b.cfg, err = l.writeConfig(); err != nil {
		return fail(err)
	}
	b.all = make([]string, labVMs)
	for i := range b.all {
		b.all[i] = "vm" + strconv.Itoa(i+1)
	}
	if b.vm1, err = lab.Get(l.stateDir, "vm1"); err != nil {
		return fail(err)
	}
	benchSock, err := addAgent(ctx, b.vm1)
	if err != nil {
		return fail(err)
	}
	b.bc = qga.New(benchSock)
	defer b.bc.Close()
	if err := Rounds(ctx, warmup, pairs, b.round); err != nil {
		return fail(err)
	}
	b.mem.Note = fmt.Sprintf("processes: serve + %d plugin", b.procs-1)
	return rows
}

// labBench is labRows' lab and rows.
type labBench struct {
	l                                     *labEnv
	cfg                                   string
	all                                   []string // the lab VMs
	vm1                                   *lab.VM
	bc                                    *qga.Client // the baselines' second agent of vm1
	tight, poll1s, paced, alike, par, mem *Row
	procs                                 int // serve's process tree
}

// labExecs is how many execs each latency of a round takes; labPerVM the
// execs per VM of a throughput.
const labExecs, labPerVM = 25, 10

// round is one round of labRows: the server's idle memory, exec latency,
// parallel throughput and memory after the load; then, the server stopped,
// the two agents side by side.
func (b *labBench) round(ctx context.Context, i int, counts bool) error {
	p, err := b.l.serve(ctx, b.cfg)
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			p.kill()
		}
	}()
	if _, err := p.client.callTool(ctx, "list_vms", "{}"); err != nil {
		return err
	}
	idle, n, err := treeRSS(p.cmd.Process.Pid)
	if err != nil {
		return err
	}
	b.procs = n
	lat, err := interleaved(labExecs,
		dephased(func() (time.Duration, error) { return execTrue(ctx, p.client, "vm1") }),
		dephased(func() (time.Duration, error) { return rawExec(ctx, b.bc, 0) }),
		dephased(func() (time.Duration, error) { return pacedExec(ctx, b.bc) }))
	if err != nil {
		return err
	}
	gated, raw, pacedRaw := lat[0], lat[1], lat[2]
	many, one, err := b.rates(ctx, p.client, i)
	if err != nil {
		return err
	}
	loaded, _, err := treeRSS(p.cmd.Process.Pid)
	if err != nil {
		return err
	}
	stopped = true
	if err := p.stop(); err != nil {
		return err
	}
	aa, slow, err := b.agents(ctx)
	if err != nil || !counts {
		return err
	}
	return errors.Join(b.tight.Add(gated, raw), b.poll1s.Add(gated, slow), b.paced.Add(pacedRaw, raw), b.alike.Add(aa[0], aa[1]),
		b.par.Add(many, one), b.mem.Add(loaded, idle))
}

// rates are the exec throughput over every lab VM and over one, measured
// in an order that alternates by round i.
func (b *labBench) rates(ctx context.Context, c *mcpClient, i int) (many, one float64, err error) {
	if i%2 == 0 {
		if many, err = execRate(ctx, c, b.all, labPerVM); err == nil {
			one, err = execRate(ctx, c, b.all[:1], labPerVM)
		}
		return many, one, err
	}
	if one, err = execRate(ctx, c, b.all[:1], labPerVM); err == nil {
		many, err = execRate(ctx, c, b.all, labPerVM)
	}
	return many, one, err
}

// agents measures the two agents of vm1 side by side, the driver's now
// free (aa), and a raw exec polled once a second (slow).
func (b *labBench) agents(ctx context.Context) (aa []float64, slow float64, err error) {
	own := qga.New(b.vm1.QGASocket)
	defer own.Close()
	aa, err = interleaved(labExecs,
		dephased(func() (time.Duration, error) { return rawExec(ctx, b.bc, 0) }),
		dephased(func() (time.Duration, error) { return rawExec(ctx, own, 0) }))
	if err != nil {
		return nil, 0, err
	}
	slow, err = medianMs(2, func() (time.Duration, error) { return rawExec(ctx, b.bc, time.Second) })
	return aa, slow, err
}
