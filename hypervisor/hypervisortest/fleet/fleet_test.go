package fleet

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
)

func TestFleetSettings(t *testing.T) {
	for _, tt := range []struct {
		s     Settings
		field string // "" when valid
	}{
		{Settings{}, ""},
		{Settings{VMs: 1000, Prefix: "web-"}, ""},
		{Settings{VMs: MaxVMs}, ""},
		{Settings{Prefix: "abcdefghijklmnopqrstuvwxyz"}, ""}, // 26 + "100000" = 32
		{Settings{VMs: -1}, "vms"},
		{Settings{VMs: MaxVMs + 1}, "vms"},
		{Settings{Prefix: "Web"}, "prefix"},
		{Settings{Prefix: "-x"}, "prefix"},
		{Settings{Prefix: "a/b"}, "prefix"},
		{Settings{Prefix: "abcdefghijklmnopqrstuvwxyz01"}, "prefix"}, // 28 + "100000" > 32
	} {
		err := tt.s.Validate()
		var fe *registry.FieldError
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("Validate(%+v) = %v; want nil", tt.s, err)
		case tt.field != "" && (!errors.As(err, &fe) || fe.Field != tt.field):
			t.Errorf("Validate(%+v) = %v; want a FieldError of %q", tt.s, err, tt.field)
		}
		if _, err := New(context.Background(), &tt.s); (err != nil) != (tt.field != "") {
			t.Errorf("New(%+v) error %v; want an error: %v", tt.s, err, tt.field != "")
		}
	}
}

func TestFleetVMName(t *testing.T) {
	for _, tt := range []struct {
		prefix string
		i      int
		want   string
	}{{"", 1, "vm00001"}, {"web-", 250, "web-00250"}, {"x", 100000, "x100000"}} {
		if got := VMName(tt.prefix, tt.i); got != tt.want {
			t.Errorf("VMName(%q, %d) = %q; want %q", tt.prefix, tt.i, got, tt.want)
		}
	}
}

func TestFleet(t *testing.T) {
	ctx := context.Background()
	f, err := New(ctx, &Settings{VMs: 3})
	if err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		vms, err := f.ListVMs(ctx)
		if err != nil {
			t.Fatalf("ListVMs() = %v", err)
		}
		var out []string
		for _, vm := range vms {
			out = append(out, vm.Name+":"+string(vm.State))
		}
		return out
	}
	if got, want := names(), []string{"vm00001:running", "vm00002:running", "vm00003:running"}; !slices.Equal(got, want) {
		t.Errorf("ListVMs() = %v; want %v", got, want)
	}
	// A listing is the caller's: changing it changes nothing.
	vms, _ := f.ListVMs(ctx)
	vms[0].Name = "changed"
	if got := names(); got[0] != "vm00001:running" {
		t.Errorf("ListVMs() after the caller changed its copy = %v", got)
	}

	if err := f.Power(ctx, "vm00002", hypervisor.PowerStop); err != nil {
		t.Fatalf("Power(stop) = %v", err)
	}
	if st, err := f.Status(ctx, "vm00002"); err != nil || st.State != hypervisor.StateStopped || st.AgentConnected {
		t.Errorf("Status(vm00002) after stop = %+v, %v; want stopped, no agent", st, err)
	}
	const mark = "Lfleet-mark-1"
	if got, err := f.CreateVM(ctx, hypervisor.CreateRequest{Name: "a-new", Mark: mark}); err != nil || got.Name != "a-new" {
		t.Fatalf("CreateVM(a-new) = %+v, %v", got, err)
	}
	if got, want := names(), []string{"a-new:running", "vm00001:running", "vm00002:stopped", "vm00003:running"}; !slices.Equal(got, want) {
		t.Errorf("ListVMs() after CreateVM = %v; want %v (sorted)", got, want)
	}

	for _, tt := range []struct {
		name string
		err  error
		want error
	}{
		{"create twice", errOf(f.CreateVM(ctx, hypervisor.CreateRequest{Name: "a-new", Mark: mark})), hypervisor.ErrInvalidArgument},
		{"create with a source", errOf(f.CreateVM(ctx, hypervisor.CreateRequest{Name: "b", Mark: mark, Source: []byte(`{"disk":1}`)})), hypervisor.ErrInvalidArgument},
		{"create without a mark", errOf(f.CreateVM(ctx, hypervisor.CreateRequest{Name: "b"})), hypervisor.ErrInvalidArgument},
		{"delete another mark", f.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "a-new", Mark: "Lsomeone-else"}), hypervisor.ErrNotCreated},
		{"delete a VM it started with", f.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "vm00001", Mark: mark}), hypervisor.ErrNotCreated},
		{"delete unknown", f.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "nope", Mark: mark}), hypervisor.ErrUnknownVM},
		{"status unknown", errOf(f.Status(ctx, "nope")), hypervisor.ErrUnknownVM},
		{"power unknown", f.Power(ctx, "nope", hypervisor.PowerStart), hypervisor.ErrUnknownVM},
		{"power bad action", f.Power(ctx, "vm00001", "explode"), hypervisor.ErrInvalidArgument},
		{"exec", errOf(f.ExecStart(ctx, "vm00001", hypervisor.ExecRequest{Argv: []string{"true"}})), hypervisor.ErrNotSupported},
		{"file read", errOf(f.FileRead(ctx, "vm00001", "/etc/hostname", 10)), hypervisor.ErrNotSupported},
	} {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: error %v; want %v", tt.name, tt.err, tt.want)
		}
	}
	if err := f.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "a-new", Mark: mark}); err != nil {
		t.Fatalf("DeleteVM(a-new, its mark) = %v", err)
	}
	if f.Len() != 3 {
		t.Errorf("Len() after DeleteVM = %d; want 3", f.Len())
	}
	if got := hypervisor.CapabilitiesOf(f); !got.Create || got.Snapshots {
		t.Errorf("CapabilitiesOf(fleet) = %+v; want create only", got)
	}
}

// errOf is the error of a call with two results.
func errOf[T any](_ T, err error) error { return err }
