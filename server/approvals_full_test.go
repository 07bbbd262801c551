package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/mcptest"
)

const approveExec = `{"version":"1","default":"allow","tools":{"vm_agent_exec":{"action":"approve","approval":{"ttl":"10m"}},
	"vm_file_write":{"action":"approve"}}}`

// stdinFake records the stdin of every command it starts.
func stdinFake(f *fixture, mu *sync.Mutex, ran *[]string) {
	drv := hypervisortest.Counting(f.calls)
	drv.ExecStartFunc = func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
		mu.Lock()
		*ran = append(*ran, string(req.Stdin))
		mu.Unlock()
		return hypervisor.ExecHandle{PID: 77, StartedAt: time.Unix(1, 0)}, nil
	}
	f.s.backends["lab"] = drv
}

// The blind-approval attack: the operator approves the call they saw; the
// agent retries with another stdin. That retry must park anew, and only
// the call the operator saw runs, once.
func TestApprovalBindsTheArgumentsTheOperatorSaw(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: approveExec})
	var (
		mu  sync.Mutex
		ran []string
	)
	stdinFake(f, &mu, &ran)
	seen := `{"vm":"lab/vm1","command":["sh"],"stdin":"echo innocent\n"}`
	swapped := `{"vm":"lab/vm1","command":["sh"],"stdin":"echo innocent\nrm -rf /tmp/important\n"}`
	r := f.call(t, "vm_agent_exec", seen)
	if !mcptest.HasTag(r, TagApproval) {
		t.Fatalf("first call = %q; want %s", r.Text(), TagApproval)
	}
	id, _ := r.Result.StructuredContent["approval_id"].(string)
	ap, err := f.s.Approvals().Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	// What the operator sees is what the digest binds.
	sum := sha256.Sum256([]byte(`{"tool":"vm_agent_exec","args":` + ap.FullArgs + `}`))
	if ap.Digest != hex.EncodeToString(sum[:]) || !strings.Contains(ap.FullArgs, `"stdin":"echo innocent\n"`) {
		t.Errorf("approval FullArgs %q digest %s; want the call's arguments, hashed into its digest", ap.FullArgs, ap.Digest)
	}
	v := View(ap, 0)
	var stdin string
	for _, fl := range v.Arguments {
		if fl.Name == "stdin" {
			stdin = fl.Value
		}
	}
	if stdin != "echo innocent\n" {
		t.Errorf("operator's view of stdin = %q; want the text itself", stdin)
	}
	if _, err := f.s.Approvals().Grant(context.Background(), id, "alice", "looks harmless"); err != nil {
		t.Fatal(err)
	}
	r = f.call(t, "vm_agent_exec", swapped)
	if !mcptest.HasTag(r, TagApproval) || r.Result.StructuredContent["approval_id"] == id {
		t.Fatalf("retry with another stdin = %q; want %s with a new approval id", r.Text(), TagApproval)
	}
	if len(ran) != 0 {
		t.Fatalf("commands ran before the approved call: %q", ran)
	}
	r = f.call(t, "vm_agent_exec", seen)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("the approved call = %q; want it to run", r.Text())
	}
	r = f.call(t, "vm_agent_exec", seen)
	if !mcptest.HasTag(r, TagApproval) {
		t.Errorf("the approved call again = %q; want %s (single use)", r.Text(), TagApproval)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 1 || ran[0] != "echo innocent\n" {
		t.Errorf("stdin of the commands that ran = %q; want only the approved one", ran)
	}
	// Consumed: the full arguments are gone.
	if ap, err := f.s.Approvals().Get(context.Background(), id); err != nil || ap.FullArgs != "" || ap.State != store.ApprovalConsumed {
		t.Errorf("used approval = %+v, %v; want consumed without full arguments", ap, err)
	}
}

// A grant cannot pile up approvals: beyond maxWaitingApprovals waiting,
// a new call is refused with [RATE LIMITED] and creates nothing.
func TestWaitingApprovalsAreBounded(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: approveExec})
	for i := range maxWaitingApprovals {
		r := f.call(t, "vm_agent_exec", fmt.Sprintf(`{"vm":"lab/vm1","command":["true"],"stdin":"%d"}`, i))
		if !mcptest.HasTag(r, TagApproval) {
			t.Fatalf("call %d = %q; want %s", i, r.Text(), TagApproval)
		}
	}
	r := f.call(t, "vm_agent_exec", `{"vm":"lab/vm1","command":["true"],"stdin":"one more"}`)
	if !mcptest.HasTag(r, TagRateLimited) || r.Result.StructuredContent["retry_after_s"] == nil {
		t.Fatalf("call beyond %d waiting approvals = %q; want %s with retry_after_s", maxWaitingApprovals, r.Text(), TagRateLimited)
	}
	// The identical call of a waiting one still gets its approval id.
	if r := f.call(t, "vm_agent_exec", `{"vm":"lab/vm1","command":["true"],"stdin":"0"}`); !mcptest.HasTag(r, TagApproval) {
		t.Errorf("a waiting call again = %q; want %s", r.Text(), TagApproval)
	}
	// Another grant is not held up.
	if r := f.sendAs(t, "other", mcptest.ToolCall(1, "vm_status", `{"vm":"other/vm1"}`)); r.Result == nil || r.Result.IsError {
		t.Errorf("other grant = %q; want a result", r.Text())
	}
	list, _ := f.s.Approvals().List(context.Background())
	if len(list) != maxWaitingApprovals {
		t.Errorf("%d approvals; want %d", len(list), maxWaitingApprovals)
	}
	// Once they expire, there is room again.
	f.advance(11 * time.Minute)
	if r := f.call(t, "vm_agent_exec", `{"vm":"lab/vm1","command":["true"],"stdin":"later"}`); !mcptest.HasTag(r, TagApproval) {
		t.Errorf("a call after the others expired = %q; want %s", r.Text(), TagApproval)
	}
}
