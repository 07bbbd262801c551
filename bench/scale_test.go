package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"syscall"
	"testing"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/server/stdio"
)

// TestListVMsServersAgree checks that the bare baseline of row 6a returns
// what the gated server returns, so the row compares the same work, and
// that the gated one refuses what its policy does not allow.
func TestListVMsServersAgree(t *testing.T) {
	ctx := context.Background()
	drv := manyVMs(7)
	s, closeGated, err := gatedListVMs(t.TempDir(), drv)
	if err != nil {
		t.Fatal(err)
	}
	defer closeGated()
	gated, stopGated, err := pipeServer(ctx, func(ctx context.Context, in io.Reader, out io.Writer) error {
		return stdio.Serve(ctx, s, "local", in, out)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stopGated()
	bareSrv := bareListVMs(drv)
	bare, stopBare, err := pipeServer(ctx, func(ctx context.Context, in io.Reader, out io.Writer) error {
		return mcpserver.NewStdioServer(bareSrv).Listen(ctx, in, out)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stopBare()

	var got [2]struct {
		VMs []vmEntry `json:"vms"`
	}
	var texts [2]string
	for i, c := range []*mcpClient{gated, bare} {
		res, err := c.callTool(ctx, "list_vms", "{}")
		if err != nil {
			t.Fatalf("list_vms = %v", err)
		}
		if err := json.Unmarshal(res.StructuredContent, &got[i]); err != nil {
			t.Fatal(err)
		}
		if len(res.Content) != 1 {
			t.Fatalf("list_vms content = %+v; want one text", res.Content)
		}
		texts[i] = res.Content[0].Text
	}
	if len(got[0].VMs) != 7 || got[0].VMs[0].ID != "lab/vm001" || !reflect.DeepEqual(got[0], got[1]) || texts[0] != texts[1] {
		t.Errorf("list_vms gated = %+v %q; bare = %+v %q; want the same 7 VMs", got[0], texts[0], got[1], texts[1])
	}
	if err := countVMs(7)(toolResult{StructuredContent: json.RawMessage(`{"vms":[]}`)}); err == nil {
		t.Errorf("countVMs(7) of an empty list = nil; want an error")
	}
	// Tools the policy does not list are refused: the gate is on.
	if _, err := gated.callTool(ctx, "vm_status", `{"vm":"lab/vm001"}`); err == nil || !strings.Contains(err.Error(), "[POLICY DENIED]") {
		t.Errorf("vm_status on the gated server = %v; want [POLICY DENIED]", err)
	}
	if _, err := gated.callTool(ctx, "list_vms", `{"x":1}`); err == nil {
		t.Errorf("list_vms with an unknown argument = nil; want an error")
	}
}

func TestTreeRSS(t *testing.T) {
	self, n, err := treeRSS(os.Getpid())
	if err != nil || self <= 0 || n < 1 {
		t.Fatalf("treeRSS(self) = %v MiB, %d processes, %v; want > 0, ≥ 1", self, n, err)
	}
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	withChild, n2, err := treeRSS(os.Getpid())
	if err != nil || n2 != n+1 || withChild <= 0 {
		t.Errorf("treeRSS(self) with a child = %v MiB, %d processes, %v; want %d processes", withChild, n2, err, n+1)
	}
	if _, _, err := treeRSS(1 << 30); err == nil {
		t.Errorf("treeRSS(no such pid) = nil error; want one")
	}
}
