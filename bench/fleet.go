package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/hypervisor/hypervisortest/fleet"
	"github.com/vmgate/vmgate/internal/vmpage"
)

// The fleet rows run `vmgate serve` as shipped (fsync always, the
// all_calls counter of the built-in default policy) over fleetBackends
// backends whose driver is hypervisortest's Fleet served as an external
// plugin (bench/fleetplugin, vmgate-plugin-fleet in the -plugins
// directory): many VMs, no guests, every call through the real plugin
// boundary.
//
//	6c  p50 of list_vms answering the first page of fleetPage VMs out of
//	    fleetVMs, against a bare mcp-go stdio server (this binary with
//	    bareFleetArg, the same fleet drivers in process) answering the
//	    same page, calls alternating one by one: {"limit": fleetPage},
//	    checked to give fleetPage VMs and the total. The row asks the
//	    server's tools/list whether list_vms has a limit argument (a vmgate
//	    from before list_vms paged answers the whole list of fleetVMs on
//	    both sides; the row's note says which it measured).
//	6d  RSS of vmgate serve and its plugin processes with fleetVMs VMs
//	    made by vm_create (so fleetVMs leases) against fleetSmall of each,
//	    after the same load per VM (fleetLoadPasses passes of list_vms
//	    over every VM and vm_status of each) and two lease reaper passes.

const (
	fleetBackends = 4
	fleetVMs      = 1000
	fleetSmall    = 10
	fleetPage     = 100
	// fleetCalls are each side's sequential calls behind one 6c p50.
	fleetCalls = 200
	// fleetLoadPasses are 6d's passes over the fleet before measuring.
	fleetLoadPasses = 3
	// reaperEvery is vmgate serve's lease reaper period
	// (server.DefaultLeaseReapEvery); 6d waits for two passes.
	reaperEvery = 5 * time.Second
	// bareFleetArg makes this binary the bare baseline of 6c: list_vms
	// over fleetBackends fleets of the next argument's number of VMs.
	bareFleetArg = "bare-fleet"
)

// fleetPolicy allows what the fleet rows call, with the counter the
// built-in default policy puts on every call.
const fleetPolicy = `{"version":"1","default":"deny",
  "all_tools":{"limits":[{"counter":"all_calls","window":"minute","max":1000000000,"scope":"grant"}]},
  "tools":{"list_vms":{},"vm_status":{},"vm_create":{}}}`

// fleetSetup is a vmgate serve over fleetBackends fleet plugins.
type fleetSetup struct {
	perBackend int  // VMs each fleet plugin starts with
	templates  bool // a template per backend (t0 on pve0, …), for vm_create
}

// config is the vmgate.yaml of f with its state in state.
func (f fleetSetup) config(state, pluginDir, policy string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "state_dir: %s\naudit: {fsync: always}\nplugin_dir: %s\ngrants: [{name: local, policy: %s}]\nbackends:\n",
		strconv.Quote(state), strconv.Quote(pluginDir), strconv.Quote(policy))
	for i := range fleetBackends {
		fmt.Fprintf(&b, "  - {name: pve%d, driver: fleet, settings: {vms: %d}}\n", i, f.perBackend)
	}
	if f.templates {
		b.WriteString("templates:\n")
		for i := range fleetBackends {
			fmt.Fprintf(&b, "  - {name: t%d, backend: pve%d}\n", i, i)
		}
	}
	return b.String()
}

// startFleet starts `vmgate serve` on f in a new state directory under dir.
func startFleet(ctx context.Context, vmgate, pluginDir, dir string, f fleetSetup) (*stdioProc, error) {
	state, err := os.MkdirTemp(dir, "f-")
	if err != nil {
		return nil, err
	}
	pol := filepath.Join(state, "policy.json")
	if err := os.WriteFile(pol, []byte(fleetPolicy), 0o600); err != nil {
		return nil, err
	}
	cfg := filepath.Join(state, "vmgate.yaml")
	if err := os.WriteFile(cfg, []byte(f.config(state, pluginDir, pol)), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(vmgate, "serve", "--config", cfg)
	cmd.Env = append(os.Environ(), "VMGATE_STATE_DIR="+state)
	return startStdio(ctx, cmd)
}

// startBareFleet starts this binary as 6c's bare baseline with
// fleetBackends fleets of perBackend VMs.
func startBareFleet(ctx context.Context, perBackend int) (*stdioProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return startStdio(ctx, exec.Command(self, bareFleetArg, strconv.Itoa(perBackend)))
}

// serveBareFleet is the body of the bare baseline process.
func serveBareFleet(perBackend string) error {
	n, err := strconv.Atoi(perBackend)
	if err != nil {
		return fmt.Errorf("%s: VMs per backend: %w", bareFleetArg, err)
	}
	backends := make([]vmpage.Backend, fleetBackends)
	for i := range backends {
		f, err := fleet.New(context.Background(), &fleet.Settings{VMs: n})
		if err != nil {
			return err
		}
		backends[i] = vmpage.Backend{Name: "pve" + strconv.Itoa(i), Driver: f}
	}
	return mcpserver.NewStdioServer(bareFleet(backends)).Listen(context.Background(), os.Stdin, os.Stdout)
}

// bareFleet is a minimal mcp-go server with list_vms over backends, with
// no gate, store or audit: with a limit, the page vmgate answers (the
// first limit VMs by id, the total, the next cursor); without, every VM,
// as vmgate's list_vms answers today.
func bareFleet(backends []vmpage.Backend) *mcpserver.MCPServer {
	s := mcpserver.NewMCPServer("bare", "1", mcpserver.WithToolCapabilities(false))
	tool := mcp.NewTool("list_vms", mcp.WithDescription("List the VMs."), mcp.WithReadOnlyHintAnnotation(true),
		mcp.WithNumber("limit", mcp.Description("Page size.")))
	s.AddTool(tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		limit := req.GetInt("limit", 0)
		p, err := vmpage.Paginate(vmpage.Gather(ctx, backends), vmpage.Query{Limit: limit})
		if err != nil {
			return nil, err
		}
		vms := make([]vmEntry, 0, len(p.Entries))
		var b strings.Builder
		if limit > 0 {
			fmt.Fprintf(&b, "%d of %d VM(s)", len(p.Entries), p.Total)
		} else {
			fmt.Fprintf(&b, "%d VM(s)", len(p.Entries))
		}
		for _, e := range p.Entries {
			vms = append(vms, vmEntry{ID: e.ID, State: e.VM.State, Info: e.VM.Info, Agent: e.VM.Agent})
			fmt.Fprintf(&b, "\n%s %s", e.ID, e.VM.State)
		}
		out := map[string]any{"vms": vms}
		if limit > 0 {
			out["total"] = p.Total
			if p.Next != "" {
				out["next_cursor"] = p.Next
				fmt.Fprintf(&b, "\nmore: call list_vms again with cursor %s", p.Next)
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent(b.String())}, StructuredContent: out}, nil
	})
	return s
}

// listVMsPages reports whether the server's list_vms takes a limit
// argument (the page API of issue 34), from its tools/list.
func listVMsPages(ctx context.Context, c *mcpClient) (bool, error) {
	cursor := ""
	for range 100 {
		params := `{}`
		if cursor != "" {
			params = `{"cursor":` + strconv.Quote(cursor) + `}`
		}
		raw, err := c.request(ctx, "tools/list", json.RawMessage(params))
		if err != nil {
			return false, err
		}
		var res struct {
			Tools []struct {
				Name        string `json:"name"`
				InputSchema struct {
					Properties map[string]json.RawMessage `json:"properties"`
				} `json:"inputSchema"`
			} `json:"tools"`
			NextCursor string `json:"nextCursor"`
		}
		if err := json.Unmarshal(raw, &res); err != nil {
			return false, fmt.Errorf("tools/list: %w", err)
		}
		for _, t := range res.Tools {
			if t.Name == "list_vms" {
				_, ok := t.InputSchema.Properties["limit"]
				return ok, nil
			}
		}
		if cursor = res.NextCursor; cursor == "" {
			break
		}
	}
	return false, errors.New("tools/list: no list_vms")
}

// fleetAnswer is a list_vms result as the fleet rows read it.
type fleetAnswer struct {
	VMs   []vmEntry `json:"vms"`
	Total *int      `json:"total"`
	Next  string    `json:"next_cursor"`
}

func decodeFleet(r toolResult) (fleetAnswer, error) {
	var a fleetAnswer
	if err := json.Unmarshal(r.StructuredContent, &a); err != nil {
		return a, fmt.Errorf("list_vms: %w", err)
	}
	return a, nil
}

// fleetCheck checks a 6c answer: want VMs from the fleet's first (by id),
// and with paged the total of every VM.
func fleetCheck(want, total int, paged bool) func(toolResult) error {
	first := "pve0/" + fleet.VMName("", 1)
	return func(r toolResult) error {
		a, err := decodeFleet(r)
		switch {
		case err != nil:
			return err
		case len(a.VMs) != want || len(a.VMs) > 0 && a.VMs[0].ID != first:
			return fmt.Errorf("list_vms listed %d VMs; want %d from %q", len(a.VMs), want, first)
		case paged && (a.Total == nil || *a.Total != total):
			return fmt.Errorf("list_vms gave the total %v; want %d", a.Total, total)
		}
		return nil
	}
}

// fleetPageRow measures row 6c.
func fleetPageRow(ctx context.Context, vmgate, pluginDir string, warmup, pairs int) *Row {
	r := &Row{ID: "6c", Unit: "µs", What: fmt.Sprintf("fleet: p50 of list_vms, first page of %d of %d VMs over %d backends (fleet plugins), stdio: "+
		"vmgate serve as shipped / bare mcp-go answering the same page", fleetPage, fleetVMs, fleetBackends)}
	dir, err := os.MkdirTemp("", "vmgb-fleet-")
	if err != nil {
		r.Err = err
		return r
	}
	defer os.RemoveAll(dir)
	serve, err := startFleet(ctx, vmgate, pluginDir, dir, fleetSetup{perBackend: fleetVMs / fleetBackends})
	if err != nil {
		r.Err = fmt.Errorf("vmgate serve: %w", err)
		return r
	}
	defer stopLogged(serve)
	bare, err := startBareFleet(ctx, fleetVMs/fleetBackends)
	if err != nil {
		r.Err = fmt.Errorf("bare server: %w", err)
		return r
	}
	defer stopLogged(bare)
	paged, err := listVMsPages(ctx, serve.client)
	if err != nil {
		r.Err = err
		return r
	}
	args, want := `{}`, fleetVMs
	r.Note = fmt.Sprintf("list_vms has no limit yet: both answer all %d VMs", fleetVMs)
	if paged {
		args, want = fmt.Sprintf(`{"limit":%d}`, fleetPage), fleetPage
		r.Note = fmt.Sprintf("paged: limit %d", fleetPage)
	}
	check := fleetCheck(want, fleetVMs, paged)
	r.Err = Rounds(ctx, warmup, pairs, func(ctx context.Context, _ int, counts bool) error {
		a, b, err := p50Pair(ctx, serve.client, bare.client, fleetCalls, "list_vms", args, check)
		if err != nil {
			return fmt.Errorf("%w: %s%s", err, serve.stderr.String(), bare.stderr.String())
		}
		if !counts {
			return nil
		}
		return r.Add(a, b)
	})
	return r
}

// stopLogged stops p and logs what went wrong.
func stopLogged(p *stdioProc) {
	if err := p.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	}
}

// fleetMemoryRow measures row 6d: each round, a server with fleetVMs
// created VMs and one with fleetSmall, one after the other (the order
// flipping every round).
func fleetMemoryRow(ctx context.Context, vmgate, pluginDir string, warmup, pairs int) *Row {
	r := &Row{ID: "6d", Unit: "MiB", What: fmt.Sprintf("fleet: RSS of vmgate serve and its %d fleet plugins with %d VMs and %d leases (vm_create) / with %d and %d, "+
		"after %d passes of list_vms and vm_status over every VM and two lease reaper passes", fleetBackends, fleetVMs, fleetVMs, fleetSmall, fleetSmall, fleetLoadPasses)}
	dir, err := os.MkdirTemp("", "vmgb-fleet-")
	if err != nil {
		r.Err = err
		return r
	}
	defer os.RemoveAll(dir)
	var procs int
	r.Err = Rounds(ctx, warmup, pairs, func(ctx context.Context, i int, counts bool) error {
		var big, small float64
		var err error
		if i%2 == 0 {
			if big, procs, err = fleetRSS(ctx, vmgate, pluginDir, dir, fleetVMs); err == nil {
				small, _, err = fleetRSS(ctx, vmgate, pluginDir, dir, fleetSmall)
			}
		} else {
			if small, _, err = fleetRSS(ctx, vmgate, pluginDir, dir, fleetSmall); err == nil {
				big, procs, err = fleetRSS(ctx, vmgate, pluginDir, dir, fleetVMs)
			}
		}
		if err != nil || !counts {
			return err
		}
		return r.Add(big, small)
	})
	r.Note = fmt.Sprintf("processes: serve + %d plugins", procs-1)
	return r
}

// fleetRSS starts vmgate serve over empty fleets, makes n VMs with
// vm_create and runs the load (fleetLoad), waits for two lease reaper
// passes since the VMs were made and returns the RSS of serve and its
// plugins.
func fleetRSS(ctx context.Context, vmgate, pluginDir, dir string, n int) (mib float64, procs int, err error) {
	p, err := startFleet(ctx, vmgate, pluginDir, dir, fleetSetup{templates: true})
	if err != nil {
		return 0, 0, fmt.Errorf("vmgate serve: %w", err)
	}
	defer stopLogged(p)
	fail := func(err error) (float64, int, error) {
		return 0, 0, fmt.Errorf("%d VMs: %w: %s", n, err, p.stderr.String())
	}
	created, err := fleetLoad(ctx, p.client, n)
	if err != nil {
		return fail(err)
	}
	// The reaper lists every lease and rebuilds the owners' index each pass.
	if wait := 2*reaperEvery + time.Second - time.Since(created); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fail(ctx.Err())
		}
	}
	mib, procs, err = treeRSS(p.cmd.Process.Pid)
	if err != nil {
		return fail(err)
	}
	return mib, procs, nil
}

// fleetLoad makes n VMs with vm_create on a server of fleetSetup{templates:
// true} and runs fleetLoadPasses passes over them; it returns when the
// last VM was made.
func fleetLoad(ctx context.Context, c *mcpClient, n int) (created time.Time, err error) {
	paged, err := listVMsPages(ctx, c)
	if err != nil {
		return created, err
	}
	ids, err := createVMs(ctx, c, n, inFlight)
	if err != nil {
		return created, err
	}
	created = time.Now()
	for range fleetLoadPasses {
		if err := fleetPass(ctx, c, ids, paged); err != nil {
			return created, err
		}
	}
	return created, nil
}

// createVMs makes n VMs with vm_create, k at a time, spread over the
// templates, and returns their ids.
func createVMs(ctx context.Context, c *mcpClient, n, k int) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, k)
	var next sync.Mutex
	i := 0
	var wg sync.WaitGroup
	for w := range k {
		wg.Go(func() {
			for {
				next.Lock()
				j := i
				i++
				next.Unlock()
				if j >= n {
					return
				}
				res, err := c.callTool(ctx, "vm_create", fmt.Sprintf(`{"template":"t%d"}`, j%fleetBackends))
				var out struct {
					VM string `json:"vm"`
				}
				if err == nil {
					err = json.Unmarshal(res.StructuredContent, &out)
				}
				if err == nil && out.VM == "" {
					err = errors.New("vm_create named no VM")
				}
				if err != nil {
					errs[w] = fmt.Errorf("vm_create %d: %w", j, err)
					return
				}
				ids[j] = out.VM
			}
		})
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// fleetPass lists every VM (page by page when list_vms pages) and asks
// the status of each of ids; the listing must hold exactly ids.
func fleetPass(ctx context.Context, c *mcpClient, ids []string, paged bool) error {
	seen := 0
	args := `{}`
	if paged {
		args = fmt.Sprintf(`{"limit":%d}`, fleetPage)
	}
	for pages := 0; ; pages++ {
		res, err := c.callTool(ctx, "list_vms", args)
		if err != nil {
			return err
		}
		a, err := decodeFleet(res)
		if err != nil {
			return err
		}
		seen += len(a.VMs)
		if !paged || a.Next == "" || pages > len(ids) {
			break
		}
		args = fmt.Sprintf(`{"limit":%d,"cursor":%s}`, fleetPage, strconv.Quote(a.Next))
	}
	if seen != len(ids) {
		return fmt.Errorf("list_vms listed %d VMs in all; want the %d created", seen, len(ids))
	}
	for _, id := range ids {
		if _, err := c.callTool(ctx, "vm_status", `{"vm":`+strconv.Quote(id)+`}`); err != nil {
			return err
		}
	}
	return nil
}

// fleetRows measures 6c and 6d.
func fleetRows(ctx context.Context, vmgate, pluginDir string, warmup, pairs int) []*Row {
	return []*Row{fleetPageRow(ctx, vmgate, pluginDir, warmup, pairs), fleetMemoryRow(ctx, vmgate, pluginDir, warmup, pairs)}
}
