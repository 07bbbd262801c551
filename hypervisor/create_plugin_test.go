package hypervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// creatorFake makes VMs named by the request, keeping their marks.
func creatorFake(seen *[]hypervisor.CreateRequest) *hypervisortest.Fake {
	marks := map[string]string{}
	return &hypervisortest.Fake{
		CreateVMFunc: func(_ context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
			*seen = append(*seen, req)
			marks["101"] = req.Mark
			return hypervisor.CreatedVM{Name: "101"}, nil
		},
		DeleteVMFunc: func(_ context.Context, req hypervisor.DeleteRequest) error {
			m, ok := marks[req.Name]
			switch {
			case !ok:
				return fmt.Errorf("fake: delete %s: %w", req.Name, hypervisor.ErrUnknownVM)
			case m != req.Mark:
				return fmt.Errorf("fake: delete %s: %w", req.Name, hypervisor.ErrNotCreated)
			}
			delete(marks, req.Name)
			return nil
		},
	}
}

func TestCreatorCrossesTheBoundary(t *testing.T) {
	ctx := context.Background()
	var seen []hypervisor.CreateRequest
	drv := connect(t, "creator", creatorFake(&seen))
	if err := drv.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if k := hypervisor.CapabilitiesOf(drv); !k.Create || k.Snapshots {
		t.Fatalf("CapabilitiesOf(plugin client) = %+v; want create only", k)
	}
	c, ok := hypervisor.AsCreator(drv)
	if !ok {
		t.Fatal("AsCreator(plugin client) = false")
	}
	req := hypervisor.CreateRequest{Name: "small-x", Source: json.RawMessage(`{"vmid":9000,"full":false}`), MemoryMB: 512, CPUs: 2, Mark: "LMARK0123456789"}
	made, err := c.CreateVM(ctx, req)
	if err != nil || made.Name != "101" {
		t.Fatalf("CreateVM = %+v, %v; want the backend's name 101", made, err)
	}
	if len(seen) != 1 || !reflect.DeepEqual(seen[0], req) {
		t.Errorf("the plugin's driver got %+v; want %+v", seen, req)
	}
	if err := c.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "101", Mark: "LOTHER0123456789"}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(wrong mark) = %v; want ErrNotCreated across the boundary", err)
	}
	if err := c.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "101", Mark: req.Mark}); err != nil {
		t.Errorf("DeleteVM = %v", err)
	}
	if err := c.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "101", Mark: req.Mark}); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("DeleteVM twice = %v; want ErrUnknownVM", err)
	}

	// A plugin without the capability: refused before any round trip.
	plain := connect(t, "plain", &hypervisortest.Fake{})
	if err := plain.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := hypervisor.AsCreator(plain); ok {
		t.Error("AsCreator(plugin without creation) = true")
	}
	if _, err := plain.(hypervisor.Creator).CreateVM(ctx, req); !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("CreateVM on a plugin without it = %v; want ErrNotSupported", err)
	}

	// Through a Deferred: not configured, then the built driver's.
	var seen2 []hypervisor.CreateRequest
	d := hypervisor.NewDeferred(func(context.Context, []byte) (hypervisor.Driver, error) { return creatorFake(&seen2), nil })
	if _, err := d.CreateVM(ctx, req); !errors.Is(err, hypervisor.ErrNotConfigured) {
		t.Errorf("Deferred CreateVM before Configure = %v; want ErrNotConfigured", err)
	}
	viaDeferred := connect(t, "deferred", d)
	if err := viaDeferred.(hypervisor.Configurer).Configure(ctx, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if made, err := viaDeferred.(hypervisor.Creator).CreateVM(ctx, req); err != nil || made.Name != "101" || len(seen2) != 1 {
		t.Errorf("CreateVM through a Deferred = %+v, %v (driver saw %d); want 101", made, err, len(seen2))
	}
}
