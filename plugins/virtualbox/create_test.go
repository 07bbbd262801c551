package virtualbox

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/internal/vboxemu"
)

const (
	uuidTmpl = "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0010"
	testMark = "lease-0123456789"
)

// template is a powered-off template machine with a snapshot "base".
func template(name, uuid string) *vboxemu.Machine {
	m := machine(name, uuid, "", "")
	m.MemoryMB, m.CPUs = 512, 1
	m.Snapshots = []*vboxemu.Snapshot{{UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0f01", Name: "base", Taken: m.StateChange, StateAtTake: "poweroff"}}
	m.CurrentSnapshot = m.Snapshots[0].UUID
	return m
}

func (e *emulator) worldNow(t testing.TB) *vboxemu.World {
	t.Helper()
	w, err := vboxemu.ReadWorld(e.world)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func machineNames(w *vboxemu.World) []string {
	var names []string
	for _, m := range w.VMs {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return names
}

// TestCreateRefusals: bad sources, hostile names, a name taken and a
// missing template or snapshot are refused with the reason and what to
// do, and leave every machine as it was; a creation whose guest never
// answers leaves no clone behind.
func TestCreateRefusals(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			live := template("live-tmpl", "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0011")
			live.Snapshots[0].UUID, live.Snapshots[0].Online, live.Snapshots[0].StateAtTake = "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0f02", true, "running"
			live.CurrentSnapshot = live.Snapshots[0].UUID
			e := newEmulator(t, v, []*vboxemu.Machine{template("tmpl", uuidTmpl), machine("taken", uuidOff, "", ""), live})
			d := e.driver(t)
			ctx := ctxT(t)
			before := machineNames(e.worldNow(t))
			tests := []struct {
				name, vm, source string
				want             error
				says             string // in the error
				noCall           bool   // refused before VBoxManage runs
				memory           int64
			}{
				{"option-like template", "c1", `{"vm":"--foo"}`, hypervisor.ErrInvalidArgument, "begins with '-'", true, 0},
				{"template -h", "c1", `{"vm":"-h"}`, hypervisor.ErrInvalidArgument, "begins with '-'", true, 0},
				{"empty template", "c1", `{}`, hypervisor.ErrInvalidArgument, "empty VM name", true, 0},
				{"unknown field", "c1", `{"vm":"tmpl","full":true}`, hypervisor.ErrInvalidArgument, "unknown field", true, 0},
				{"trailing data", "c1", `{"vm":"tmpl"} {"vm":"x"}`, hypervisor.ErrInvalidArgument, "after the object", true, 0},
				{"option-like snapshot", "c1", `{"vm":"tmpl","snapshot":"--register"}`, hypervisor.ErrInvalidArgument, "may not begin with '-'", true, 0},
				{"snapshot with a line break", "c1", `{"vm":"tmpl","snapshot":"a\nb"}`, hypervisor.ErrInvalidArgument, "line break", true, 0},
				{"linked without a snapshot", "c1", `{"vm":"tmpl","linked":true}`, hypervisor.ErrInvalidArgument, "set snapshot", true, 0},
				{"name with a path", "../c1", `{"vm":"tmpl"}`, hypervisor.ErrInvalidArgument, "VM name", true, 0},
				{"name with shell characters", "c1;reboot", `{"vm":"tmpl"}`, hypervisor.ErrInvalidArgument, "VM name", true, 0},
				{"option-like name", "-c1", `{"vm":"tmpl"}`, hypervisor.ErrInvalidArgument, "VM name", true, 0},
				{"template with shell characters", "c1", `{"vm":"tmpl; rm -rf /"}`, hypervisor.ErrInvalidArgument, `no template VM "tmpl; rm -rf /"`, false, 0},
				{"template missing", "c1", `{"vm":"nope"}`, hypervisor.ErrInvalidArgument, "no template VM", false, 0},
				{"name taken", "taken", `{"vm":"tmpl"}`, hypervisor.ErrInvalidArgument, "already registered; choose another name", false, 0},
				{"name is the template", "tmpl", `{"vm":"tmpl"}`, hypervisor.ErrInvalidArgument, "already registered", false, 0},
				{"snapshot missing", "c1", `{"vm":"tmpl","snapshot":"nope"}`, hypervisor.ErrInvalidArgument, `has no snapshot "nope"`, false, 0},
				// A clone of an online snapshot is saved: it cannot be sized
				// (the clone made is removed).
				{"sizing a saved clone", "c1", `{"vm":"live-tmpl","snapshot":"base","linked":true}`, hypervisor.ErrInvalidArgument,
					"VirtualBox cannot resize a saved machine; leave memory and CPUs unset or take the template's snapshot powered off", false, 256},
			}
			for _, tt := range tests {
				e.resetLog()
				_, err := d.CreateVM(ctx, hypervisor.CreateRequest{Name: tt.vm, Source: json.RawMessage(tt.source), Mark: testMark, MemoryMB: tt.memory})
				if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) {
					t.Errorf("CreateVM(%s) = %v; want %v saying %q", tt.name, err, tt.want, tt.says)
				}
				if calls := e.calls(t); tt.noCall && len(calls) != 0 {
					t.Errorf("CreateVM(%s) ran VBoxManage: %v", tt.name, calls)
				}
				if got := machineNames(e.worldNow(t)); !slices.Equal(got, before) {
					t.Errorf("after CreateVM(%s) the machines are %q; want %q", tt.name, got, before)
				}
			}
			// clonevm's own refusals (a name taken meanwhile, a snapshot
			// gone) are explained too.
			for _, c := range []struct {
				src  TemplateSource
				name string
				says string
			}{
				{TemplateSource{VM: "tmpl"}, "taken", `a VM named "taken" (or its settings folder) already exists; choose another name`},
				{TemplateSource{VM: "tmpl", Snapshot: "gone"}, "c3", `template VM "tmpl" has no snapshot "gone"`},
				{TemplateSource{VM: "gone"}, "c3", `template VM "gone" is not registered`},
			} {
				err := d.clone(ctx, c.src, c.name, "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0c03")
				if !errors.Is(err, hypervisor.ErrInvalidArgument) || !strings.Contains(err.Error(), c.says) {
					t.Errorf("clone(%+v, %s) = %v; want %v saying %q", c.src, c.name, err, hypervisor.ErrInvalidArgument, c.says)
				}
			}
			// The lease's UUID already registered: a clone an earlier,
			// interrupted creation for the same lease left.
			if err := d.clone(ctx, TemplateSource{VM: "tmpl"}, "c4", uuidOff); !errors.Is(err, hypervisor.ErrInvalidArgument) ||
				!strings.Contains(err.Error(), "cloned for this same lease by an earlier creation that did not finish") {
				t.Errorf("clone(tmpl, c4, a registered UUID) = %v; want %v saying the lease's earlier clone is still registered", err, hypervisor.ErrInvalidArgument)
			}
			// No guest will answer (no spare lab VM): the creation times out
			// and the clone it made is removed.
			short, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := d.CreateVM(short, hypervisor.CreateRequest{Name: "c2", Source: json.RawMessage(`{"vm":"tmpl","snapshot":"base","linked":true}`), Mark: testMark})
			if !errors.Is(err, hypervisor.ErrTimeout) {
				t.Errorf("CreateVM(no guest) = %v; want %v", err, hypervisor.ErrTimeout)
			}
			if got := machineNames(e.worldNow(t)); !slices.Equal(got, before) {
				t.Errorf("after a failed CreateVM the machines are %q; want %q (the clone removed)", got, before)
			}
		})
	}
}

// TestDeleteRefusals: only a VM carrying the mark is deleted.
func TestDeleteRefusals(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			running := machine("user-vm", uuidT1, "", "")
			running.State = "running"
			marked := machine("marked", uuidOff, "", "")
			marked.ExtraData = map[string]string{markKey: "another-lease-01"}
			// A clone for testMark whose creation stopped before setextradata.
			orphan := machine("orphan", machineUUID(testMark), "", "")
			// testMark's UUID, but marked for another lease: the mark wins.
			remarked := machine("remarked", machineUUID("lease-remarked-01"), "", "")
			remarked.ExtraData = map[string]string{markKey: "another-lease-02"}
			e := newEmulator(t, v, []*vboxemu.Machine{template("tmpl", uuidTmpl), running, marked, orphan, remarked})
			d := e.driver(t)
			ctx := ctxT(t)
			before := machineNames(e.worldNow(t))
			tests := []struct {
				vm, mark string
				want     error
			}{
				{"tmpl", testMark, hypervisor.ErrNotCreated},
				{"user-vm", testMark, hypervisor.ErrNotCreated},             // running, never created: not even stopped
				{"marked", testMark, hypervisor.ErrNotCreated},              // another lease's VM
				{"orphan", "another-lease-01", hypervisor.ErrNotCreated},    // unmarked, and not that lease's UUID
				{"remarked", "lease-remarked-01", hypervisor.ErrNotCreated}, // its UUID, but another lease's mark
				{"nope", testMark, hypervisor.ErrUnknownVM},
				{"--help", testMark, hypervisor.ErrInvalidArgument},
				{"marked", "short", hypervisor.ErrInvalidArgument},
				{"marked", "bad mark with spaces", hypervisor.ErrInvalidArgument},
			}
			for _, tt := range tests {
				if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: tt.vm, Mark: tt.mark}); !errors.Is(err, tt.want) {
					t.Errorf("DeleteVM(%q, %q) = %v; want %v", tt.vm, tt.mark, err, tt.want)
				}
			}
			w := e.worldNow(t)
			if got := machineNames(w); !slices.Equal(got, before) {
				t.Errorf("after refused deletions the machines are %q; want %q", got, before)
			}
			for _, m := range w.VMs {
				if m.Name == "user-vm" && m.State != "running" {
					t.Errorf("user-vm is %s after a refused deletion; want it still running", m.State)
				}
			}
			// The right mark deletes it.
			if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "marked", Mark: "another-lease-01"}); err != nil {
				t.Errorf("DeleteVM(marked, its mark) = %v; want nil", err)
			}
			if got := machineNames(e.worldNow(t)); slices.Contains(got, "marked") {
				t.Errorf("after DeleteVM(marked) the machines are %q", got)
			}
			// An unmarked clone goes with the lease whose UUID it has.
			if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "orphan", Mark: testMark}); err != nil {
				t.Errorf("DeleteVM(orphan, the mark its UUID comes from) = %v; want nil", err)
			}
			if got := machineNames(e.worldNow(t)); slices.Contains(got, "orphan") {
				t.Errorf("after DeleteVM(orphan) the machines are %q", got)
			}
		})
	}
}

// TestCreateDeletePlugin: through the plugin, for every release, a linked
// clone of the template's snapshot is made with the name asked for, marked,
// sized and started; it runs a command; it is deleted only with its mark,
// also while running, and a second deletion finds nothing.
func TestCreateDeletePlugin(t *testing.T) {
	spare := labtest.Start(t, lab.Spec{Name: "vboxspare"})
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			e := newEmulator(t, v, []*vboxemu.Machine{template("tmpl", uuidTmpl)}, func(w *vboxemu.World) {
				w.Spares = []vboxemu.Backing{{QGASocket: spare.QGASocket, QMPSocket: spare.QMPSocket}}
				w.VMProcessTeardownMS = 300 // the delete waits for the VM process it powered off
			})
			d := launchPlugin(t, e)
			c, ok := hypervisor.AsCreator(d)
			if !ok {
				t.Fatalf("the plugin driver has no Creator capability: %+v", hypervisor.CapabilitiesOf(d))
			}
			ctx, cancel := testload.WithTimeout(context.Background(), 2*labtest.BootTimeout)
			defer cancel()
			made, err := c.CreateVM(ctx, hypervisor.CreateRequest{Name: "small-a", Source: json.RawMessage(`{"vm":"tmpl","snapshot":"base","linked":true}`),
				MemoryMB: 256, CPUs: 2, Mark: testMark})
			if err != nil {
				t.Fatalf("CreateVM = %v", err)
			}
			if made.Name != "small-a" {
				t.Errorf("CreateVM name = %q; want small-a", made.Name)
			}
			res, err := hypervisor.Run(ctx, d, "small-a", hypervisor.ExecRequest{Argv: []string{"/bin/echo", "made"}})
			if err != nil || res.ExitCode != 0 || string(res.Stdout) != "made\n" {
				t.Errorf("Run(small-a, echo made) = %+v, %v; want exit 0 and made", res, err)
			}
			var clone *vboxemu.Machine
			for _, m := range e.worldNow(t).VMs {
				if m.Name == "small-a" {
					clone = m
				}
			}
			if clone == nil || clone.ExtraData[markKey] != testMark || clone.MemoryMB != 256 || clone.CPUs != 2 ||
				clone.LinkedFrom != "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0f01" || clone.State != "running" || clone.UUID != machineUUID(testMark) {
				t.Fatalf("the clone is %+v; want small-a running, marked %s, UUID %s, 256 MB, 2 CPUs, linked to snapshot base", clone, testMark, machineUUID(testMark))
			}
			if _, err := c.CreateVM(ctx, hypervisor.CreateRequest{Name: "small-a", Source: json.RawMessage(`{"vm":"tmpl"}`), Mark: testMark}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
				t.Errorf("CreateVM(small-a again) = %v; want %v", err, hypervisor.ErrInvalidArgument)
			}
			if err := c.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "small-a", Mark: "other-lease-0001"}); !errors.Is(err, hypervisor.ErrNotCreated) {
				t.Errorf("DeleteVM(small-a, another mark) = %v; want %v", err, hypervisor.ErrNotCreated)
			}
			if err := c.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "small-a", Mark: testMark}); err != nil {
				t.Fatalf("DeleteVM(small-a) = %v", err)
			}
			w := e.worldNow(t)
			if got := machineNames(w); !slices.Equal(got, []string{"tmpl"}) || len(w.Spares) != 1 {
				t.Errorf("after DeleteVM the machines are %q with %d spares; want only tmpl and the spare back", got, len(w.Spares))
			}
			if err := c.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "small-a", Mark: testMark}); !errors.Is(err, hypervisor.ErrUnknownVM) {
				t.Errorf("DeleteVM(small-a again) = %v; want %v", err, hypervisor.ErrUnknownVM)
			}
			var ran []string
			for _, l := range e.calls(t) {
				if len(l.Argv) > 0 && (l.Argv[0] == "clonevm" || l.Argv[0] == "unregistervm" || l.Argv[0] == "controlvm") {
					ran = append(ran, strings.Join(l.Argv, " "))
				}
			}
			t.Logf("VBoxManage calls: %q", ran)
			if len(ran) < 3 || !strings.HasPrefix(ran[0], "clonevm --name small-a --uuid ") || !strings.HasSuffix(ran[0], " --register --snapshot base --options link tmpl") {
				t.Errorf("VBoxManage calls %q; want clonevm --name small-a --uuid U --register --snapshot base --options link tmpl, then poweroff and unregistervm", ran)
			}
		})
	}
}

// TestMachineUUID: a lease's clone UUID is fixed by its mark, differs
// between marks, and is a well-formed RFC 9562 version 8 UUID.
func TestMachineUUID(t *testing.T) {
	form := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]string{}
	for _, mark := range []string{testMark, "lease-0123456788", "another-lease-01", "x.y:z-01_AB"} {
		id := machineUUID(mark)
		if !form.MatchString(id) {
			t.Errorf("machineUUID(%q) = %q; want a version 8 UUID", mark, id)
		}
		if again := machineUUID(mark); again != id {
			t.Errorf("machineUUID(%q) = %q, then %q; want the same", mark, id, again)
		}
		if other, ok := seen[id]; ok {
			t.Errorf("machineUUID(%q) = machineUUID(%q) = %q; want distinct", mark, other, id)
		}
		seen[id] = mark
	}
}

func TestCheckTemplate(t *testing.T) {
	var s Settings
	for _, tt := range []struct {
		source string
		ok     bool
	}{
		{`{"vm":"tmpl"}`, true},
		{`{"vm":"tmpl","snapshot":"base","linked":true}`, true},
		{`{"vm":"Template VM (Ubuntu)","snapshot":"clean state"}`, true},
		{`{"vm":"tmpl","linked":true}`, false},
		{`{"vm":"--foo"}`, false},
		{`{"vm":"tmpl","snapshot":"-s"}`, false},
		{`{"vm":"tmpl","vmid":100}`, false},
		{`{}`, false},
		{`[]`, false},
	} {
		err := s.CheckTemplate(json.RawMessage(tt.source))
		if (err == nil) != tt.ok || err != nil && !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("CheckTemplate(%s) = %v; want ok %v (else %v)", tt.source, err, tt.ok, hypervisor.ErrInvalidArgument)
		}
	}
}
