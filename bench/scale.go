package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store/bolt"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/stdio"
)

// manyVMs is a fake driver with n running VMs vm001…; listing them is a
// slice copy, no I/O.
func manyVMs(n int) *hypervisortest.Fake {
	vms := make([]hypervisor.VM, n)
	for i := range vms {
		vms[i] = hypervisor.VM{Name: fmt.Sprintf("vm%03d", i+1), State: hypervisor.StateRunning, Info: "fake VM", Agent: true}
	}
	return &hypervisortest.Fake{
		ListVMsFunc: func(context.Context) ([]hypervisor.VM, error) {
			return append([]hypervisor.VM(nil), vms...), nil
		},
	}
}

// vmEntry is list_vms' entry for one VM, as the server returns it.
type vmEntry struct {
	ID    string           `json:"id"`
	State hypervisor.State `json:"state"`
	Info  string           `json:"info,omitempty"`
	Agent bool             `json:"agent"`
}

// bareListVMs is a minimal mcp-go server with list_vms over drv, returning
// what the gated server returns, with no gate, store or audit.
func bareListVMs(drv hypervisor.Driver) *mcpserver.MCPServer {
	s := mcpserver.NewMCPServer("bare", "1", mcpserver.WithToolCapabilities(false))
	tool := mcp.NewTool("list_vms", mcp.WithDescription("List the VMs."), mcp.WithReadOnlyHintAnnotation(true))
	s.AddTool(tool, func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		list, err := drv.ListVMs(ctx)
		if err != nil {
			return nil, err
		}
		vms := make([]vmEntry, 0, len(list))
		var b strings.Builder
		fmt.Fprintf(&b, "%d of %d VM(s)", len(list), len(list)) // list_vms's text for a page that holds every VM
		for _, vm := range list {
			e := vmEntry{ID: "lab/" + vm.Name, State: vm.State, Info: vm.Info, Agent: vm.Agent}
			vms = append(vms, e)
			fmt.Fprintf(&b, "\n%s %s", e.ID, e.State)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent(b.String())},
			StructuredContent: map[string]any{"vms": vms, "total": len(list)}}, nil
	})
	return s
}

// gatedListVMs is the real server over drv as backend "lab", with the
// store and the audit log serve uses (counters in memory, approvals in
// bbolt; audit fsync always) in dir.
func gatedListVMs(dir string, drv hypervisor.Driver) (*server.Server, func(), error) {
	eng, err := policy.Parse("scale.json", []byte(`{"version":"1","default":"deny",
		"all_tools":{"limits":[{"counter":"all_calls","window":"minute","max":1000000000,"scope":"grant"}]},
		"tools":{"list_vms":{}}}`))
	if err != nil {
		return nil, nil, err
	}
	bs, err := bolt.Open(filepath.Join(dir, "store.db"), bolt.Options{})
	if err != nil {
		return nil, nil, err
	}
	st, err := memory.NewSplit(bs)
	if err != nil {
		bs.Close()
		return nil, nil, err
	}
	log, err := audit.Open(filepath.Join(dir, "audit.log"), audit.Options{Fsync: audit.FsyncAlways, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	s, err := server.New(server.Config{
		Grants:   []server.Grant{{Name: "local", Policy: eng}},
		Backends: []server.Backend{{Name: "lab", Driver: drv}},
		Store:    st, Audit: log,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Close()
		st.Close()
		return nil, nil, err
	}
	return s, func() { s.Close(); log.Close(); st.Close() }, nil
}

// pipeServer serves one stdio MCP session over OS pipes in a goroutine and
// returns a client for it and a stop function that waits for the server.
func pipeServer(ctx context.Context, serve func(ctx context.Context, in io.Reader, out io.Writer) error) (*mcpClient, func() error, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		err := serve(sctx, inR, outW)
		outW.Close()
		done <- err
	}()
	stop := func() error {
		inW.Close()
		cancel()
		err := <-done
		inR.Close()
		outR.Close()
		if err != nil && sctx.Err() == nil {
			return err
		}
		return nil
	}
	c, err := newMCPClient(ctx, inW, outR)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return c, stop, nil
}

// p50Calls makes n sequential calls of tool and returns their median
// latency in µs. check validates each result.
func p50Calls(ctx context.Context, c *mcpClient, n int, tool, args string, check func(toolResult) error) (float64, error) {
	lat := make([]float64, 0, n)
	for range n {
		t0 := time.Now()
		res, err := c.callTool(ctx, tool, args)
		took := time.Since(t0)
		if err != nil {
			return 0, err
		}
		if check != nil {
			if err := check(res); err != nil {
				return 0, err
			}
		}
		lat = append(lat, float64(took.Nanoseconds())/1e3)
	}
	m, _ := medianSpread(lat)
	return m, nil
}

// countVMs fails unless a list_vms result lists want VMs.
func countVMs(want int) func(toolResult) error {
	return func(r toolResult) error {
		var out struct {
			VMs []vmEntry `json:"vms"`
		}
		if err := json.Unmarshal(r.StructuredContent, &out); err != nil {
			return fmt.Errorf("list_vms: %w", err)
		}
		if len(out.VMs) != want {
			return fmt.Errorf("list_vms listed %d VMs; want %d", len(out.VMs), want)
		}
		return nil
	}
}

// listVMsRow is list_vms with 500 VMs through the whole gate against the
// bare server listing the same 500 VMs, over stdio pipes in process.
func listVMsRow(ctx context.Context, warmup, pairs int) *Row {
	const nVMs, calls = 500, 100
	r := &Row{ID: "6a", Unit: "µs", What: fmt.Sprintf("scale: p50 of list_vms with %d VMs (fake driver), stdio, vmgate gate / bare mcp-go", nVMs)}
	dir, err := os.MkdirTemp("", "vmgate-bench-scale-")
	if err != nil {
		r.Err = err
		return r
	}
	defer os.RemoveAll(dir)
	drv := manyVMs(nVMs)
	s, closeGated, err := gatedListVMs(dir, drv)
	if err != nil {
		r.Err = fmt.Errorf("scale: gated server: %w", err)
		return r
	}
	defer closeGated()
	gated, stopGated, err := pipeServer(ctx, func(ctx context.Context, in io.Reader, out io.Writer) error {
		return stdio.Serve(ctx, s, "local", in, out)
	})
	if err != nil {
		r.Err = fmt.Errorf("scale: gated server: %w", err)
		return r
	}
	defer stopGated()
	bareSrv := bareListVMs(drv)
	bare, stopBare, err := pipeServer(ctx, func(ctx context.Context, in io.Reader, out io.Writer) error {
		return mcpserver.NewStdioServer(bareSrv).Listen(ctx, in, out)
	})
	if err != nil {
		r.Err = fmt.Errorf("scale: bare server: %w", err)
		return r
	}
	defer stopBare()
	// All 500 in one page (list_vms's default page is 100); the bare
	// server lists everything whatever it is asked.
	check, args := countVMs(nVMs), fmt.Sprintf(`{"limit":%d}`, nVMs)
	r.Err = Interleave(ctx, r, warmup, pairs,
		func(ctx context.Context) (float64, error) {
			return p50Calls(ctx, gated, calls, "list_vms", args, check)
		},
		func(ctx context.Context) (float64, error) { return p50Calls(ctx, bare, calls, "list_vms", args, check) })
	return r
}
