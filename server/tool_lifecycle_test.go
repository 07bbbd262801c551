package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/audit/audittest"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/lease"
	"github.com/vmgate/vmgate/server/mcptest"
)

// lifecyclePolicy lets a grant hold 2 VMs and 1024 MiB, leases of 10 min
// by default and 1 h at most.
const lifecyclePolicy = `{"version":"1","default":"allow","tools":{"vm_create":{
  "limits":[
    {"counter":"vms","kind":"quota","max":2,"scope":"grant"},
    {"counter":"vm_memory","kind":"quota","max":1024,"scope":"grant","weight":"args.memory_mb"}],
  "lease":{"default_ttl":"10m","max_ttl":"1h"}}}}`

func i64(v int64) *int64 { return &v }

// labTemplate is a template on backend "lab": 256 MiB (128 to 1024), 1 CPU
// (at most 2), VMs named lab-<suffix>.
func labTemplate() config.Template {
	return config.Template{Name: "lab", Backend: "lab", SourceJSON: json.RawMessage(`{}`),
		MemoryMB: config.Range{Default: i64(256), Min: i64(128), Max: i64(1024)},
		CPUs:     config.Range{Default: i64(1), Min: i64(1), Max: i64(2)}}
}

// teamTemplate is labTemplate shared with every grant, its VMs named team-<suffix>.
func teamTemplate() config.Template {
	t := labTemplate()
	prefix := "team-"
	t.Name, t.NamePrefix, t.Shared = "team", &prefix, true
	return t
}

// lifecycle is a server whose backend "lab" makes VMs (a fakeCreator) and
// lists vm1 (not created by vmgate) beside them, with grants "local" and
// "other" that both see every VM.
type lifecycle struct {
	*fixture
	fake    *hypervisortest.Creator
	creates atomic.Int64
	leases  *memory.Store
	policy  string
}

func newLifecycle(t *testing.T) *lifecycle {
	t.Helper()
	return newLifecycleWith(t, lifecyclePolicy)
}

func newLifecycleWith(t *testing.T, pol string) *lifecycle {
	t.Helper()
	lc := &lifecycle{fake: &hypervisortest.Creator{}, leases: memory.New(), policy: pol}
	f := &fixture{calls: new(atomic.Int64), now: new(atomic.Int64), rec: &audittest.Recorder{}, store: lc.leases}
	f.now.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	lc.fixture = f
	lc.fixture.s = lc.server(t)
	return lc
}

// server builds a Server over lc's store and VMs (a restart builds another).
func (lc *lifecycle) server(t *testing.T) *Server {
	t.Helper()
	eng, err := policy.Parse("test.json", []byte(lc.policy))
	if err != nil {
		t.Fatal(err)
	}
	drv := &hypervisortest.Fake{
		ListVMsFunc: func(ctx context.Context) ([]hypervisor.VM, error) {
			vms := []hypervisor.VM{{Name: "vm1", State: hypervisor.StateRunning}}
			for _, n := range lc.fake.Names() {
				vms = append(vms, hypervisor.VM{Name: n, State: hypervisor.StateRunning, Agent: true})
			}
			return vms, nil
		},
		CreateVMFunc: func(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
			lc.creates.Add(1)
			return lc.fake.CreateVM(ctx, req)
		},
		DeleteVMFunc: lc.fake.DeleteVM,
		StatusFunc: func(ctx context.Context, vm string) (hypervisor.Status, error) {
			if vm != "vm1" && !slices.Contains(lc.fake.Names(), vm) {
				return hypervisor.Status{}, fmt.Errorf("fake: %w: %s", hypervisor.ErrUnknownVM, vm)
			}
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning}, nil
		},
	}
	s, err := New(Config{
		Grants:    []Grant{{Name: "local", Policy: eng}, {Name: "other", Policy: eng}},
		Backends:  []Backend{{Name: "lab", Driver: drv}},
		Store:     lc.leases,
		Audit:     lc.rec,
		Now:       func() time.Time { return time.Unix(0, lc.now.Load()) },
		Templates: []config.Template{labTemplate(), teamTemplate()},
		// The test reaps explicitly (reapNow); the background pass runs
		// once at start.
		LeaseReapEvery: time.Hour,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func (lc *lifecycle) reapNow(t *testing.T) lease.Report {
	t.Helper()
	return lc.s.leases.Reap(context.Background())
}

func (lc *lifecycle) leaseCount(t *testing.T) int {
	t.Helper()
	list, err := lc.leases.ListLeases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// TestVMCreateQuotaDelete: two VMs are made, a third is refused by the
// quota without reaching the driver, list_vms marks the created VMs, and
// vm_delete deletes one, giving its unit back.
func TestVMCreateQuotaDelete(t *testing.T) {
	lc := newLifecycle(t)
	for _, name := range []string{"a", "b"} {
		r := lc.call(t, "vm_create", `{"template":"lab","name":"`+name+`"}`)
		if r.Result == nil || r.Result.IsError {
			t.Fatalf("vm_create(%s) = %q; want success", name, r.Text())
		}
		sc := r.Result.StructuredContent
		if sc["vm"] != "lab/lab-"+name || sc["memory_mb"] != float64(256) || sc["cpus"] != float64(1) || sc["ttl_s"] != float64(600) {
			t.Errorf("vm_create(%s) = %v; want lab/lab-%s, 256 MiB, 1 CPU, ttl 600 s", name, sc, name)
		}
	}
	r := lc.call(t, "vm_create", `{"template":"lab","name":"c"}`)
	if !mcptest.HasTag(r, TagQuota) || !strings.Contains(r.Text(), "quota vms is full: 2 of 2") || !strings.Contains(r.Text(), "lab/lab-a") || !strings.Contains(r.Text(), "vm_delete") {
		t.Errorf("third vm_create = %q; want %s naming the quota, its holders and vm_delete", r.Text(), TagQuota)
	}
	if n := lc.creates.Load(); n != 2 {
		t.Errorf("CreateVM calls = %d; want 2 (the refused third never reaches the driver)", n)
	}
	list := lc.call(t, "list_vms", `{}`)
	vms, _ := list.Result.StructuredContent["vms"].([]any)
	var created []string
	for _, v := range vms {
		e := v.(map[string]any)
		if c, ok := e["created"].(map[string]any); ok {
			if c["created_by"] != "local" || c["template"] != "lab" || c["lease_ends"] != "2030-01-02T03:14:05Z" {
				t.Errorf("list_vms %s created = %v; want by local from lab, lease ends 03:14:05", e["id"], c)
			}
			created = append(created, e["id"].(string))
		}
	}
	if !slices.Equal(created, []string{"lab/lab-a", "lab/lab-b"}) || !strings.Contains(list.Text(), "lab/lab-a running (created by local from lab, lease ends 2030-01-02T03:14:05Z)") {
		t.Errorf("list_vms created = %v, text %q; want lab-a and lab-b marked, vm1 not", created, list.Text())
	}
	if d := lc.call(t, "vm_delete", `{"vm":"lab/lab-a"}`); d.Result == nil || d.Result.IsError {
		t.Fatalf("vm_delete(lab/lab-a) = %q; want success", d.Text())
	}
	if got := lc.fake.Names(); !slices.Equal(got, []string{"lab-b"}) {
		t.Errorf("VMs after vm_delete = %v; want [lab-b]", got)
	}
	if r := lc.call(t, "vm_create", `{"template":"lab","name":"c","memory_mb":512}`); r.Result == nil || r.Result.IsError {
		t.Errorf("vm_create after a delete = %q; want success (the unit came back)", r.Text())
	}
	// The memory quota: 256 + 512 held, 512 more does not fit 1024. (The
	// VM count would refuse it too; it is checked in policy order.)
	if r := lc.call(t, "vm_create", `{"template":"lab","memory_mb":512}`); !mcptest.HasTag(r, TagQuota) {
		t.Errorf("vm_create over both quotas = %q; want %s", r.Text(), TagQuota)
	}
	outcomes := map[string]int{}
	for _, rec := range lc.rec.Records() {
		if rec.Kind == audit.KindOutcome && (rec.Tool == "vm_create" || rec.Tool == "vm_delete") {
			outcomes[rec.Tool+" "+rec.Outcome]++
		}
	}
	want := map[string]int{"vm_create ok": 3, "vm_create quota_exceeded": 2, "vm_delete ok": 1}
	for k, n := range want {
		if outcomes[k] != n {
			t.Errorf("audit outcomes = %v; want %v", outcomes, want)
			break
		}
	}
}

// TestVMCreateRefusals: arguments the template or the catalogue refuse
// end the call before any lease or driver call.
func TestVMCreateRefusals(t *testing.T) {
	lc := newLifecycle(t)
	for _, tc := range []struct{ args, want string }{
		{`{"template":"nope"}`, `template: no template "nope" (the server has templates lab, team)`},
		{`{"template":"../lab"}`, `no template "../lab"`},
		{`{}`, `template`},
		{`{"template":"lab","memory_mb":4096}`, "memory_mb: 4096 is out of this template's range 128 to 1024"},
		{`{"template":"lab","memory_mb":1099511627776}`, "memory_mb"},
		{`{"template":"lab","memory_mb":0}`, "memory_mb"},
		{`{"template":"lab","cpus":3}`, "cpus: 3 is out of this template's range 1 to 2"},
		{`{"template":"lab","ttl_s":-5}`, "ttl_s"},
		{`{"template":"lab","ttl_s":0}`, "ttl_s"},
		{`{"template":"lab","ttl_s":1.5}`, "ttl_s"},
		{`{"template":"lab","name":"../x"}`, `name "../x": want [a-z0-9][a-z0-9-]*`},
		{`{"template":"lab","name":"Web"}`, `want [a-z0-9][a-z0-9-]*`},
		{`{"template":"lab","name":""}`, `want [a-z0-9][a-z0-9-]*`},
		{`{"template":"lab","name":"` + strings.Repeat("a", 29) + `"}`, "would be 33 characters"},
		{`{"template":"lab","source":{"disk":"/etc/shadow"}}`, `source`},
		{`{"template":"lab","mark":"Lforged00"}`, `mark`},
	} {
		r := lc.call(t, "vm_create", tc.args)
		if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), tc.want) {
			t.Errorf("vm_create(%s) = %q; want %s containing %q", tc.args, r.Text(), TagInvalid, tc.want)
		}
	}
	if n, l := lc.creates.Load(), lc.leaseCount(t); n != 0 || l != 0 {
		t.Errorf("after refusals: %d CreateVM calls, %d leases; want none", n, l)
	}
}

// TestVMDeleteRefusals: vm_delete never reaches the driver for a VM
// vmgate did not create, nor for another grant's.
func TestVMDeleteRefusals(t *testing.T) {
	lc := newLifecycle(t)
	if r := lc.call(t, "vm_create", `{"template":"lab","name":"mine"}`); r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_create = %q", r.Text())
	}
	for _, tc := range []struct{ grant, args, tag, want string }{
		{"local", `{"vm":"lab/vm1"}`, TagInvalid, "lab/vm1 was not created by vm_create"},
		{"local", `{"vm":"lab/lab-gone"}`, TagInvalid, "was not created by vm_create"},
		{"other", `{"vm":"lab/lab-mine"}`, TagUnknownVM, `no VM "lab/lab-mine"`},
		{"local", `{"vm":"nope/lab-mine"}`, TagUnknownVM, "no VM"},
		{"local", `{"vm":"lab/../lab-mine"}`, TagUnknownVM, "no VM"},
		{"local", `{"vm":"lab/lab-mine","force":true}`, TagInvalid, "force"},
	} {
		r := lc.sendAs(t, tc.grant, mcptest.ToolCall(1, "vm_delete", tc.args))
		if !mcptest.HasTag(r, tc.tag) || !strings.Contains(r.Text(), tc.want) {
			t.Errorf("vm_delete(%s) as %s = %q; want %s containing %q", tc.args, tc.grant, r.Text(), tc.tag, tc.want)
		}
	}
	deletes := len(lc.fake.Deletes())
	if got := lc.fake.Names(); deletes != 0 || !slices.Equal(got, []string{"lab-mine"}) {
		t.Errorf("after refusals: %d DeleteVM calls, VMs %v; want none, [lab-mine]", deletes, got)
	}
}

// TestVMLeaseEnds: a lease asked for past the policy's cap is capped; when
// it ends the reaper deletes the VM, also the reaper of a server started
// afterwards over the same store (a restart).
func TestVMLeaseEnds(t *testing.T) {
	lc := newLifecycle(t)
	r := lc.call(t, "vm_create", `{"template":"lab","name":"short","ttl_s":60}`)
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["ttl_s"] != float64(60) {
		t.Fatalf("vm_create(ttl 60) = %q", r.Text())
	}
	r = lc.call(t, "vm_create", `{"template":"lab","name":"long","ttl_s":86400}`)
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["ttl_s"] != float64(3600) || r.Result.StructuredContent["ttl_clamped"] != true ||
		!strings.Contains(r.Text(), "ttl_s 86400 was capped by the policy") {
		t.Fatalf("vm_create(ttl 86400) = %q, %v; want a lease of 3600 s, said to be capped", r.Text(), r.Result.StructuredContent)
	}
	lc.advance(59 * time.Second)
	if rep := lc.reapNow(t); len(rep.Deleted) != 0 {
		t.Errorf("reap before the end = %+v; want nothing", rep)
	}
	lc.advance(time.Second)
	if rep := lc.reapNow(t); !slices.Equal(rep.Deleted, []string{"lab/lab-short"}) || len(rep.Errors) != 0 {
		t.Errorf("reap at the end = %+v; want lab/lab-short deleted", rep)
	}
	// A restart: the first server is gone, another opens the same store.
	lc.s.Close()
	lc.advance(time.Hour)
	lc.s = lc.server(t)
	if rep := lc.reapNow(t); len(rep.Errors) != 0 {
		t.Errorf("reap after the restart = %+v", rep)
	}
	if got, n := lc.fake.Names(), lc.leaseCount(t); len(got) != 0 || n != 0 {
		t.Errorf("after the leases ended: VMs %v, %d leases; want none", got, n)
	}
}

// TestVMCreateDriverFailure: a creation the driver fails leaves no lease:
// the quota unit comes back.
func TestVMCreateDriverFailure(t *testing.T) {
	lc := newLifecycle(t)
	lc.fake.CreateFunc = func(req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
		return hypervisor.CreatedVM{}, errors.New("fake: disk full")
	}
	for range 3 {
		if r := lc.call(t, "vm_create", `{"template":"lab"}`); !mcptest.HasTag(r, TagBackend) {
			t.Fatalf("vm_create with a failing driver = %q; want %s", r.Text(), TagBackend)
		}
	}
	if n := lc.leaseCount(t); n != 0 {
		t.Errorf("leases after failed creations = %d; want 0 (a third would have hit the quota otherwise)", n)
	}
}

// TestVMCreateApproval: a policy that wants vm_create approved parks it
// without making anything; the approved identical call (the template's
// defaults filled in the same way) makes the VM, once.
func TestVMCreateApproval(t *testing.T) {
	lc := newLifecycleWith(t, `{"version":"1","default":"allow","tools":{"vm_create":{"action":"approve","approval":{"channel":"operator","ttl":"10m"}}}}`)
	const args = `{"template":"lab","name":"ok"}`
	r := lc.call(t, "vm_create", args)
	id, _ := r.Result.StructuredContent["approval_id"].(string)
	if !mcptest.HasTag(r, TagApproval) || id == "" || lc.creates.Load() != 0 {
		t.Fatalf("vm_create under approval = %q (%d creates); want %s with an id and nothing made", r.Text(), lc.creates.Load(), TagApproval)
	}
	if _, err := lc.leases.DecideApproval(context.Background(), id, true, "op", "", time.Unix(0, lc.now.Load())); err != nil {
		t.Fatal(err)
	}
	if r := lc.call(t, "vm_create", args); r.Result == nil || r.Result.IsError || r.Result.StructuredContent["vm"] != "lab/lab-ok" {
		t.Fatalf("approved vm_create = %q; want lab/lab-ok made", r.Text())
	}
	if r := lc.call(t, "vm_create", args); !mcptest.HasTag(r, TagApproval) || lc.creates.Load() != 1 {
		t.Errorf("vm_create again = %q (%d creates); want a new approval and one VM only", r.Text(), lc.creates.Load())
	}
}

// TestVMDeleteAfterABackendRefusal: a backend that refuses a deletion
// (Proxmox with protection on) leaves the VM's lease live, not deleting:
// once the cause is gone, the next vm_delete deletes the VM.
func TestVMDeleteAfterABackendRefusal(t *testing.T) {
	lc := newLifecycle(t)
	if r := lc.call(t, "vm_create", `{"template":"lab","name":"kept"}`); r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_create = %q", r.Text())
	}
	var refusals atomic.Int64
	lc.fake.DeleteFunc = func(req hypervisor.DeleteRequest) error {
		if refusals.Add(1) == 1 {
			return fmt.Errorf("%w: can't remove VM 100 - protection mode enabled", hypervisor.ErrBackend)
		}
		lc.fake.Remove(req.Name)
		return nil
	}
	r := lc.call(t, "vm_delete", `{"vm":"lab/lab-kept"}`)
	if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), "protection mode enabled") {
		t.Fatalf("vm_delete refused by the backend = %q; want %s with the backend's reason", r.Text(), TagBackend)
	}
	list, err := lc.leases.ListLeases(context.Background())
	if err != nil || len(list) != 1 || list[0].State != store.LeaseLive || list[0].Holder != "" ||
		!list[0].Expires.Equal(time.Date(2030, 1, 2, 3, 14, 5, 0, time.UTC)) {
		t.Fatalf("lease after the refusal = %+v, %v; want it live again with its expiry", list, err)
	}
	// Protection off: the next vm_delete deletes it at once.
	if r := lc.call(t, "vm_delete", `{"vm":"lab/lab-kept"}`); r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_delete after the cause is gone = %q; want success", r.Text())
	}
	if got, n := lc.fake.Names(), lc.leaseCount(t); len(got) != 0 || n != 0 {
		t.Errorf("after the second vm_delete: VMs %v, %d leases; want none", got, n)
	}
	if n := refusals.Load(); n != 2 {
		t.Errorf("DeleteVM calls = %d; want 2", n)
	}
}

// sendWith sends raw as grant to s, a server of lc's other than lc.s (a
// restart, a replica).
func (lc *lifecycle) sendWith(t *testing.T, s *Server, grant, raw string) mcptest.Reply {
	t.Helper()
	old := lc.fixture.s
	lc.fixture.s = s
	defer func() { lc.fixture.s = old }()
	return lc.sendAs(t, grant, raw)
}

// TestCreatedVMExistsOnlyForItsCreator: a VM one grant made with
// vm_create is "unknown VM" to every other grant on every tool, with the
// very answer a VM that never existed gets, and absent from its list_vms;
// also after a restart, and when another replica made it. A shared
// template's VMs are seen by every grant (and deleted only by their
// creator).
func TestCreatedVMExistsOnlyForItsCreator(t *testing.T) {
	lc := newLifecycle(t)
	for _, c := range []struct{ grant, args string }{{"local", `{"template":"lab","name":"mine"}`}, {"other", `{"template":"team","name":"ours"}`}} {
		if r := lc.sendAs(t, c.grant, mcptest.ToolCall(1, "vm_create", c.args)); r.Result == nil || r.Result.IsError {
			t.Fatalf("%s's vm_create(%s) = %q", c.grant, c.args, r.Text())
		}
	}
	// A second replica over the same store makes one more: this server's
	// index has not seen it.
	replica := lc.server(t)
	if r := lc.sendWith(t, replica, "local", mcptest.ToolCall(1, "vm_create", `{"template":"lab","name":"elsewhere"}`)); r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_create on the replica = %q", r.Text())
	}
	listed := func(s *Server, grant string) []string {
		r := lc.sendWith(t, s, grant, mcptest.ToolCall(1, "list_vms", `{}`))
		var ids []string
		for _, v := range r.Result.StructuredContent["vms"].([]any) {
			ids = append(ids, v.(map[string]any)["id"].(string))
		}
		slices.Sort(ids)
		return ids
	}
	never := lc.sendAs(t, "other", mcptest.ToolCall(1, "vm_status", `{"vm":"lab/lab-never"}`)).Text()
	if want := TagUnknownVM + " " + catalog.UnknownVMText("lab/lab-never"); never != want {
		t.Fatalf("vm_status of a VM that never existed = %q; want %q", never, want)
	}
	restarted := lc.server(t)
	for name, s := range map[string]*Server{"server": lc.s, "restarted": restarted} {
		if got, want := listed(s, "other"), []string{"lab/team-ours", "lab/vm1"}; !slices.Equal(got, want) {
			t.Errorf("%s: other's list_vms = %v; want %v (local's own VMs left out, the shared one in)", name, got, want)
		}
		if got, want := listed(s, "local"), []string{"lab/lab-elsewhere", "lab/lab-mine", "lab/team-ours", "lab/vm1"}; !slices.Equal(got, want) {
			t.Errorf("%s: local's list_vms = %v; want %v", name, got, want)
		}
		for _, vm := range []string{"lab/lab-mine", "lab/lab-elsewhere"} {
			for _, tc := range []struct{ tool, args string }{
				{"vm_status", `{"vm":"VM"}`},
				{"vm_agent_exec", `{"vm":"VM","command":["id"]}`},
				{"vm_file_read", `{"vm":"VM","path":"/etc/hostname"}`},
				{"list_processes", `{"vm":"VM"}`},
				{"create_session", `{"vm":"VM"}`},
				{"snapshot_create", `{"vm":"VM","name":"s1"}`},
				{"vm_power", `{"vm":"VM","action":"stop"}`},
				{"vm_delete", `{"vm":"VM"}`},
			} {
				args := strings.ReplaceAll(tc.args, "VM", vm)
				want := strings.ReplaceAll(never, "lab/lab-never", vm)
				if got := lc.sendWith(t, s, "other", mcptest.ToolCall(1, tc.tool, args)).Text(); got != want {
					t.Errorf("%s: other's %s(%s) = %q; want %q", name, tc.tool, args, got, want)
				}
			}
		}
		// The shared VM: local uses it, but only other, who made it, deletes it.
		if r := lc.sendWith(t, s, "local", mcptest.ToolCall(1, "vm_status", `{"vm":"lab/team-ours"}`)); mcptest.HasTag(r, TagUnknownVM) {
			t.Errorf("%s: local's vm_status of other's shared VM = %q; want it known", name, r.Text())
		}
		if r := lc.sendWith(t, s, "local", mcptest.ToolCall(1, "vm_delete", `{"vm":"lab/team-ours"}`)); !mcptest.HasTag(r, TagDenied) || !strings.Contains(r.Text(), "created by another grant") {
			t.Errorf("%s: local's vm_delete of other's shared VM = %q; want %s ... created by another grant", name, r.Text(), TagDenied)
		}
	}
	for _, c := range []struct{ grant, vm string }{{"local", "lab/lab-mine"}, {"other", "lab/team-ours"}} {
		if r := lc.sendAs(t, c.grant, mcptest.ToolCall(1, "vm_delete", `{"vm":"`+c.vm+`"}`)); r.Result == nil || r.Result.IsError {
			t.Errorf("the creator's vm_delete(%s) = %q; want success", c.vm, r.Text())
		}
	}
	for _, rec := range lc.rec.Records() {
		if rec.Grant == "other" && rec.Kind == audit.KindDecision && (rec.VM == "lab/lab-mine" || rec.VM == "lab/lab-elsewhere") && rec.Decision != decisionUnknownVM {
			t.Errorf("other's %s of %s was decided %q; want %q before anything ran", rec.Tool, rec.VM, rec.Decision, decisionUnknownVM)
		}
	}
}

// TestVMCreateSaysItsName: a name given to vm_create is a suffix after the
// template's prefix, and the result says so: the VM's id, the name asked
// for and the prefix put before it.
func TestVMCreateSaysItsName(t *testing.T) {
	lc := newLifecycle(t)
	r := lc.call(t, "vm_create", `{"template":"lab","name":"w1"}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_create(w1) = %q; want success", r.Text())
	}
	sc := r.Result.StructuredContent
	if sc["vm"] != "lab/lab-w1" || sc["requested_name"] != "w1" || sc["name_prefix"] != "lab-" {
		t.Errorf("vm_create(w1) = %v; want vm lab/lab-w1, requested_name w1, name_prefix lab-", sc)
	}
	for _, want := range []string{`name "w1"`, `prefix "lab-"`, "lab/lab-w1"} {
		if !strings.Contains(r.Text(), want) {
			t.Errorf("vm_create(w1) text = %q; want it to say %q", r.Text(), want)
		}
	}
}
