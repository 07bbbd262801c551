package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/libvirttest"
)

var vmTemplate = libvirttest.Name("vmgate-tmpl")

// templateDomain defines a shut-off template with a qcow2 disk for t, and
// undefines it when t ends.
func templateDomain(t *testing.T, env *libvirttest.Daemons) string {
	t.Helper()
	img := labtest.Image(t)
	ctx, cancel := context.WithTimeout(context.Background(), libvirttest.BootTimeout)
	defer cancel()
	spec := libvirttest.Spec{Name: vmTemplate, Persistent: true, DefineOnly: true, Disk: true, NIC: true, Metadata: "lab", MetadataURI: testNS}
	if _, err := env.Boot(ctx, spec, img.Kernel, img.Initrd); err != nil {
		t.Fatalf("define the template: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Remove(vmTemplate); err != nil {
			t.Errorf("remove the template: %v", err)
		}
	})
	return filepath.Join(env.Dir, "domains", vmTemplate)
}

// overlays lists the transient overlay files next to the template's image.
func overlays(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.Contains(e.Name(), "TRANSIENT") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestCreateDelete: clones of a shut-off template run side by side on
// overlays of its image (what one writes the other does not see), are
// visible through the driver's metadata filter, are deleted only with
// their mark, and leave no domain and no overlay behind.
func TestCreateDelete(t *testing.T) {
	env, d := envDriver(t, Config{MetadataURI: testNS})
	dir := templateDomain(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*libvirttest.BootTimeout)
	defer cancel()
	src := json.RawMessage(`{"domain":"` + vmTemplate + `"}`)
	c1, c2, c3 := libvirttest.Name("vmgate-c1"), libvirttest.Name("vmgate-c2"), libvirttest.Name("vmgate-c3")
	marks := map[string]string{c1: "LMARKONE0123456", c2: "LMARKTWO0123456"}
	for name, mark := range marks {
		made, err := d.CreateVM(ctx, hypervisor.CreateRequest{Name: name, Source: src, MemoryMB: 192, CPUs: 1, Mark: mark})
		if err != nil {
			t.Fatalf("CreateVM(%s) = %v", name, err)
		}
		t.Cleanup(func() { d.DeleteVM(context.Background(), hypervisor.DeleteRequest{Name: name, Mark: mark}) })
		if made.Name != name {
			t.Errorf("CreateVM(%s) name = %q", name, made.Name)
		}
	}
	if got := overlays(t, dir); len(got) != 2 {
		t.Errorf("overlays next to the template's image = %v; want one per clone", got)
	}
	// Each clone has a disk of its own on the shared image.
	run := func(vm string, argv ...string) string {
		res, err := hypervisor.Run(ctx, d, vm, hypervisor.ExecRequest{Argv: argv})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Run(%s, %v) = %+v, %v", vm, argv, res, err)
		}
		return string(res.Stdout)
	}
	run(c1, "/bin/sh", "-c", "echo one > /data/who && sync")
	if out := run(c2, "/bin/sh", "-c", "cat /data/who 2>/dev/null; echo end"); out != "end\n" {
		t.Errorf("c2 sees %q of c1's disk; want nothing", out)
	}
	vms, err := d.ListVMs(ctx)
	if err != nil || !slices.ContainsFunc(vms, func(v hypervisor.VM) bool { return v.Name == c1 && v.State == hypervisor.StateRunning }) {
		t.Errorf("ListVMs with the metadata filter = %+v, %v; want the clones listed", vms, err)
	}
	// Refusals.
	if _, err := d.CreateVM(ctx, hypervisor.CreateRequest{Name: c1, Source: src, Mark: "LMARKTHREE01234"}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("CreateVM(existing name) = %v; want ErrInvalidArgument", err)
	}
	if _, err := d.CreateVM(ctx, hypervisor.CreateRequest{Name: c3, Source: json.RawMessage(`{"domain":"` + vmT1 + `"}`), Mark: "LMARKTHREE01234"}); !errors.Is(err, hypervisor.ErrInvalidArgument) || !strings.Contains(err.Error(), "shut it off") {
		t.Errorf("CreateVM(from a running domain) = %v; want ErrInvalidArgument saying to shut it off", err)
	}
	if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: vmT1, Mark: "LMARKONE0123456"}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(a domain vmgate did not create) = %v; want ErrNotCreated", err)
	}
	if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: c1, Mark: "LMARKTWO0123456"}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(c1 with c2's mark) = %v; want ErrNotCreated", err)
	}
	if st, err := d.Status(ctx, vmT1); err != nil || st.State != hypervisor.StateRunning {
		t.Errorf("Status(%s) after refused deletes = %+v, %v; want running", vmT1, st, err)
	}
	for name, mark := range marks {
		if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: name, Mark: mark}); err != nil {
			t.Fatalf("DeleteVM(%s) = %v", name, err)
		}
		if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: name, Mark: mark}); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("DeleteVM(%s) twice = %v; want ErrUnknownVM", name, err)
		}
	}
	if got := overlays(t, dir); len(got) != 0 {
		t.Errorf("overlays after the clones were deleted = %v; want none", got)
	}
	vms, err = d.ListVMs(ctx)
	if err != nil || slices.ContainsFunc(vms, func(v hypervisor.VM) bool { return v.Name == c1 || v.Name == c2 }) {
		t.Errorf("ListVMs after the deletes = %+v, %v; want no clone, defined or running", vms, err)
	}
}
