package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest/fleet"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/jsonrpc"
)

// oddFleet is a fleet whose list also holds VMs with the names extra
// (vmgate refuses some of them).
type oddFleet struct {
	*fleet.Fleet
	extra []hypervisor.VM
}

func (o oddFleet) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	l, err := o.Fleet.ListVMs(ctx)
	return append(l, o.extra...), err
}

// fleetEnv is an Env over backends "a" (30 VMs, vm00001…, and three
// whose names vmgate refuses), "b" (20, every even one stopped) and "c"
// (down), without leases.
func fleetEnv(t *testing.T) *catalog.Env {
	t.Helper()
	a, err := fleet.New(context.Background(), &fleet.Settings{VMs: 30})
	if err != nil {
		t.Fatal(err)
	}
	b, err := fleet.New(context.Background(), &fleet.Settings{VMs: 20, Prefix: "web-"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 20; i += 2 {
		if err := b.Power(context.Background(), fleet.VMName("web-", i), hypervisor.PowerStop); err != nil {
			t.Fatal(err)
		}
	}
	odd := []hypervisor.VM{{Name: "bad;name", State: hypervisor.StateRunning}, {Name: "..", State: hypervisor.StateRunning}, {Name: "-x", State: hypervisor.StateRunning}}
	return &catalog.Env{Log: slog.New(slog.DiscardHandler), Backends: map[string]hypervisor.Driver{
		"a": oddFleet{a, odd}, "b": b, "c": downDriver{b},
	}}
}

// downDriver is a backend whose ListVMs fails.
type downDriver struct{ hypervisor.Driver }

func (downDriver) ListVMs(context.Context) ([]hypervisor.VM, error) {
	return nil, fmt.Errorf("fleet: %w: connection refused", hypervisor.ErrBackend)
}

// listPage is list_vms's answer as a client reads it.
type listPage struct {
	VMs []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	} `json:"vms"`
	Total  int               `json:"total"`
	Next   string            `json:"next_cursor"`
	Errors []json.RawMessage `json:"errors"`
}

// runList runs list_vms with args as the gate does (validate, decode,
// checks, run) for grant; a refusal before the run is err.
func runList(t *testing.T, e *catalog.Env, g catalog.Grant, args string) (listPage, catalog.Result, error) {
	t.Helper()
	spec := listVMsTool()
	raw, err := jsonrpc.Decode([]byte(args))
	if err != nil {
		t.Fatal(err)
	}
	valid, err := spec.Validate(raw.(map[string]any))
	if err != nil {
		return listPage{}, catalog.Result{}, err
	}
	typed, err := spec.Decode(valid)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Check(e, typed, valid); err != nil {
		return listPage{}, catalog.Result{}, err
	}
	r := spec.Run(e, &catalog.Call{Ctx: context.Background(), Grant: g, Tool: "list_vms", Args: typed})
	var p listPage
	if r.Tag == "" {
		b, err := json.Marshal(r.Structured)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
	}
	return p, r, nil
}

// TestListVMsPages: pages of every size walk the whole fleet once, in id
// order, with the total on every page; filters and the grant's globs cut
// the total; VMs whose names vmgate refuses are neither listed nor
// counted; a backend that is down is named on every page.
func TestListVMsPages(t *testing.T) {
	e := fleetEnv(t)
	all := catalog.Grant{Name: "g"}
	for _, tc := range []struct {
		name  string
		grant catalog.Grant
		args  string // without limit and cursor
		want  int
	}{
		{"everything", all, ``, 50},
		{"name glob", all, `,"name":"web-0000?"`, 9},
		{"name glob on the id", all, `,"name":"a/vm0001?"`, 10},
		{"state", all, `,"state":"stopped"`, 10},
		{"backend", all, `,"backend":"b"`, 20},
		{"backend and state", all, `,"backend":"b","state":"running"`, 10},
		{"grant globs", catalog.Grant{Name: "g", VMs: []string{"b/*", "a/vm0000?"}}, ``, 29},
		{"no match", all, `,"name":"nothing*"`, 0},
	} {
		for _, limit := range []int{1, 7, 50, 1000} {
			var ids []string
			cursor := ""
			for pages := 0; ; pages++ {
				args := fmt.Sprintf(`{"limit":%d%s}`, limit, tc.args)
				if cursor != "" {
					args = fmt.Sprintf(`{"limit":%d,"cursor":%q%s}`, limit, cursor, tc.args)
				}
				p, r, err := runList(t, e, tc.grant, args)
				if err != nil || r.Tag != "" {
					t.Fatalf("%s: list_vms(%s) = %v, %q", tc.name, args, err, r.Text)
				}
				if p.Total != tc.want || len(p.VMs) > limit || len(p.Errors) != 1 {
					t.Fatalf("%s: list_vms(%s) = %d VMs of %d, errors %d; want at most %d of %d, backend c's error", tc.name, args, len(p.VMs), p.Total, len(p.Errors), limit, tc.want)
				}
				if !strings.HasPrefix(r.Text, fmt.Sprintf("%d of %d VM(s)", len(p.VMs), tc.want)) {
					t.Errorf("%s: text %q; want it to start with %q", tc.name, r.Text, fmt.Sprintf("%d of %d VM(s)", len(p.VMs), tc.want))
				}
				for _, v := range p.VMs {
					ids = append(ids, v.ID)
				}
				if cursor = p.Next; cursor == "" || pages > 100 {
					break
				}
			}
			if len(ids) != tc.want || !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
				t.Errorf("%s, limit %d: pages listed %d VMs (sorted %v); want each of %d once, in order", tc.name, limit, len(ids), slices.IsSorted(ids), tc.want)
			}
			for _, id := range ids {
				if !catalog.ValidVMID(id) || !tc.grant.Sees(id) {
					t.Errorf("%s: listed %q, which vmgate refuses or the grant does not see", tc.name, id)
				}
			}
		}
	}
}

// TestListVMsDefaultPage: without a limit, a page of defaultPage.
func TestListVMsDefaultPage(t *testing.T) {
	f, err := fleet.New(context.Background(), &fleet.Settings{VMs: defaultPage + 5})
	if err != nil {
		t.Fatal(err)
	}
	e := &catalog.Env{Log: slog.New(slog.DiscardHandler), Backends: map[string]hypervisor.Driver{"a": f}}
	p, _, err := runList(t, e, catalog.Grant{Name: "g"}, `{}`)
	if err != nil || len(p.VMs) != defaultPage || p.Total != defaultPage+5 || p.Next == "" {
		t.Errorf("list_vms({}) = %d VMs of %d, next %q, %v; want %d of %d and a next cursor", len(p.VMs), p.Total, p.Next, err, defaultPage, defaultPage+5)
	}
}

// TestListVMsRefusals: a bad page request is refused before anything is
// listed, saying what to send.
func TestListVMsRefusals(t *testing.T) {
	e := fleetEnv(t)
	for _, tc := range []struct{ args, want string }{
		{`{"limit":0}`, "limit"},
		{`{"limit":1001}`, "limit"},
		{`{"cursor":"abc"}`, "not a cursor of this server"},
		{`{"cursor":"c1.!!"}`, "damaged"},
		{`{"cursor":"c1.bm9zbGFzaA"}`, "does not name a VM"},
		{`{"name":"a**"}`, `"**" is not supported`},
		{`{"name":"[a"}`, "syntax error"},
		{`{"state":"sleeping"}`, "state"},
		{`{"backend":"nope"}`, `backend "nope": there is no such backend (there are: a, b, c)`},
		{`{"limit":"5"}`, "limit"},
	} {
		_, r, err := runList(t, e, catalog.Grant{Name: "g"}, tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "list query") {
			t.Errorf("list_vms(%s) = %v, %q; want a refusal saying %q", tc.args, err, r.Text, tc.want)
		}
	}
}
