package proxmox

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pveemu"
	"github.com/vmgate/vmgate/internal/testload"
)

// createPrivs are what creation needs on top of driverPrivs.
var createPrivs = []string{"VM.Clone", "VM.Allocate", "VM.Config.Memory", "VM.Config.CPU"}

// stoppedLabMachine is an emulator clone's QEMU: a lab VM booted once (so
// its disk and argv exist) and stopped, which the clone's start launches.
func stoppedLabMachine(t *testing.T) func(context.Context, int, string) (pveemu.Machine, error) {
	return func(_ context.Context, vmid int, _ string) (pveemu.Machine, error) {
		v := labtest.Start(t, lab.Spec{Name: "pveclone-" + strconv.Itoa(vmid)})
		if err := syscall.Kill(v.PID, syscall.SIGKILL); err != nil {
			return nil, err
		}
		<-v.Done()
		return pveemu.NewLabMachine(v), nil
	}
}

// TestCreateDelete: a clone of a template gets the next vmid, the name
// asked for and the mark, is sized, started and answers; it is destroyed
// only with its mark, also when only the name asked for is known.
func TestCreateDelete(t *testing.T) {
	labtest.RequireQEMU(t)
	v := pveemu.PVE92()
	e := pveemu.Start(t, pveemu.Options{Version: v, Nodes: []string{"pve"}, NewMachine: stoppedLabMachine(t)})
	if err := e.AddToken(pveemu.Token{ID: emuTokenID, Secret: emuSecret,
		ACL: []pveemu.ACL{{Path: "/vms", Privs: append(driverPrivs(v), createPrivs...), Propagate: true}}}); err != nil {
		t.Fatal(err)
	}
	if err := e.AddVM(pveemu.VMSpec{VMID: 9000, Node: "pve", Name: "tmpl", Template: true, MemoryMB: 512, Cores: 2}); err != nil {
		t.Fatal(err)
	}
	ca, secret := e.ClientFiles(t, emuSecret)
	d := newDriver(t, Config{URL: e.URL(), TokenID: emuTokenID, TokenSecretFile: secret, CAFile: ca})
	ctx, cancel := testload.WithTimeout(context.Background(), 2*labtest.BootTimeout)
	defer cancel()
	const mark = "LMARK0123456789"
	made, err := d.CreateVM(ctx, hypervisor.CreateRequest{Name: "small-a", Source: json.RawMessage(`{"vmid":9000}`), MemoryMB: 256, CPUs: 1, Mark: mark})
	if err != nil {
		t.Fatalf("CreateVM = %v", err)
	}
	if made.Name != "100" {
		t.Errorf("CreateVM name = %q; want 100, the first free vmid", made.Name)
	}
	res, err := hypervisor.Run(ctx, d, made.Name, hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
	if err != nil || !res.Exited || res.ExitCode != 0 {
		t.Errorf("Run(/bin/true) on the clone = %+v, %v", res, err)
	}
	var conf struct {
		Memory      string `json:"memory"`
		Cores       int    `json:"cores"`
		Name        string `json:"name"`
		Description string `json:"description"`
	}
	if err := d.api.do(ctx, "GET", "/nodes/pve/qemu/100/config", nil, nil, &conf); err != nil {
		t.Fatal(err)
	}
	if conf.Memory != "256" || conf.Cores != 1 || conf.Name != "small-a" || !hasMark(conf.Description, mark) {
		t.Errorf("the clone's config = %+v; want 256 MiB, 1 core, small-a, marked", conf)
	}
	// Refusals change nothing.
	if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "100", Mark: "LOTHER012345678"}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(wrong mark) = %v; want ErrNotCreated", err)
	}
	if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "9000", Mark: mark}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(the template) = %v; want ErrNotCreated", err)
	}
	if _, err := d.CreateVM(ctx, hypervisor.CreateRequest{Name: "b", Source: json.RawMessage(`{"vmid":4242}`), Mark: mark}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("CreateVM(no such template) = %v; want ErrInvalidArgument", err)
	}
	// Deleted by the name asked for, as after a crash before the vmid was
	// recorded. Proxmox names a VM in /cluster/resources only from
	// pvestatd's next sample (pve-manager API2Tools.pm extract_vm_stats,
	// at most 10 s), so until then the name is unknown: wait for it.
	for wait := time.Now().Add(testload.Scale(time.Minute)); ; {
		err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "small-a", Mark: mark})
		if err == nil {
			break
		}
		if !errors.Is(err, hypervisor.ErrUnknownVM) || time.Now().After(wait) {
			t.Fatalf("DeleteVM(by name) = %v", err)
		}
		time.Sleep(200 * time.Millisecond) // poll interval
	}
	vms, err := d.ListVMs(ctx)
	if err != nil || slices.ContainsFunc(vms, func(v hypervisor.VM) bool { return v.Name == "100" }) {
		t.Errorf("ListVMs after delete = %+v, %v; want no 100", vms, err)
	}
	if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "100", Mark: mark}); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("DeleteVM twice = %v; want ErrUnknownVM", err)
	}
}
