package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/mcpcall"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/mcphttp"
	"github.com/vmgate/vmgate/server/operator"
)

// approvalServer is a server whose policy parks every vm_agent_exec, with
// its operator socket; call parks one exec and returns its approval id.
func approvalServer(t *testing.T) (sock string, call func(args string) string) {
	t.Helper()
	eng, err := policy.Parse("p.json", []byte(`{"version":"1","default":"allow","tools":{"vm_agent_exec":{"action":"approve"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vmgate-approvals-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	log, err := audit.Open(filepath.Join(dir, "audit.log"), audit.Options{Fsync: audit.FsyncInterval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	sum := sha256.Sum256([]byte("agent-token"))
	srv, err := server.New(server.Config{
		Grants:   []server.Grant{{Name: "agent", TokenSHA256: hex.EncodeToString(sum[:]), Policy: eng}},
		Backends: []server.Backend{{Name: "lab", Driver: &hypervisortest.Fake{}}},
		Store:    memory.New(), Audit: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(mcphttp.New(srv, mcphttp.Options{}))
	t.Cleanup(ts.Close)
	o, err := operator.Listen(srv, filepath.Join(dir, operator.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- o.Serve(context.Background()) }()
	t.Cleanup(func() { o.Close(); <-done; srv.Close() })
	return o.Path(), func(args string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := mcpcall.Call(ctx, mcpcall.Options{URL: ts.URL + "/mcp", Token: "agent-token"}, "vm_agent_exec", []byte(args))
		if err != nil || !strings.HasPrefix(res.Text, server.TagApproval) {
			t.Fatalf("vm_agent_exec(%s) = %+v, %v; want %s", args, res, err, server.TagApproval)
		}
		sc, _ := res.StructuredContent.(map[string]any)
		id, _ := sc["approval_id"].(string)
		return id
	}
}

// The operator sees every argument the call will run with: stdin as text
// with its hidden characters escaped and each line marked, env values,
// binary as a hex dump; a long stdin cut in the list, whole in show.
func TestApprovalsListShowsTheArguments(t *testing.T) {
	sock, call := approvalServer(t)
	id := call(`{"vm":"lab/vm1","command":["sh"],"stdin":"echo innocent\n\u001b[1A\u001b[2Krm -rf /tmp/important\n","env":{"MODE":"$(reboot)"}}`)
	long := strings.Repeat("A", 3000) + "TAIL-MARKER"
	longID := call(`{"vm":"lab/vm1","command":["cat"],"stdin":"` + long + `"}`)
	binID := call(`{"vm":"lab/vm1","command":["cat"],"stdin":"\u0000\u0001\u0002\u0003ELF"}`)
	o := approvalsOptions{socket: sock}
	var out bytes.Buffer
	if err := runApprovalsList(context.Background(), &out, o); err != nil {
		t.Fatalf("approvals list: %v", err)
	}
	got := out.String()
	for _, want := range []string{
		id + "  pending  grant agent  tool vm_agent_exec  vm lab/vm1",
		`    command: ["sh"]`,
		"      | echo innocent\n",
		`      | \x1b[1A\x1b[2Krm -rf /tmp/important` + "\n",
		`2 hidden characters shown as \x.. or \u{..}`,
		"    env.MODE (text, 9 bytes): $(reboot)\n",
		longID + "  pending",
		"3011 bytes, first 1024 shown",
		"… 1987 more bytes",
		"see all of them: vmgate approvals show " + longID,
		binID + "  pending",
		"binary, hex dump",
		"| 00000000  00 01 02 03 45 4c 46",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("approvals list lacks %q:\n%s", want, got)
		}
	}
	if strings.ContainsRune(got, 0x1b) || strings.Contains(got, "TAIL-MARKER") {
		t.Errorf("approvals list printed a raw ESC or more than the preview:\n%s", got)
	}
	out.Reset()
	if err := runApprovalsShow(context.Background(), &out, o, longID); err != nil {
		t.Fatalf("approvals show: %v", err)
	}
	if !strings.Contains(out.String(), "TAIL-MARKER") || strings.Contains(out.String(), "more bytes") {
		t.Errorf("approvals show %s does not show all of stdin:\n%.400s", longID, out.String())
	}
	out.Reset()
	o.json = true
	if err := runApprovalsList(context.Background(), &out, o); err != nil {
		t.Fatalf("approvals list --json: %v", err)
	}
	var list []server.ApprovalView
	if err := json.Unmarshal(out.Bytes(), &list); err != nil || len(list) != 3 {
		t.Fatalf("approvals list --json = %v, %s; want 3 approvals", err, out.String())
	}
	if list[0].FullArgs != "" || strings.Contains(out.String(), "full_args") {
		t.Errorf("approvals list --json carries the raw full arguments; want only the rendered ones")
	}
	if err := runApprovalsShow(context.Background(), &out, approvalsOptions{socket: sock}, "NOPE"); err == nil || !strings.Contains(err.Error(), "unknown approval") {
		t.Errorf("approvals show NOPE = %v; want unknown approval", err)
	}
}
