package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// TestCreateDelete: a VM made from a template answers, runs commands, is
// listed, survives the driver that made it (a new driver, as after a
// plugin or server restart, finds and deletes it), and is deleted only
// with its mark; a lab up VM is never deleted.
func TestCreateDelete(t *testing.T) {
	img := labtest.Image(t)
	state := t.TempDir()
	newDriver := func() *Driver {
		d, err := New(Config{LabDir: filepath.Join(state, "lab"), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	d := newDriver()
	ctx, cancel := context.WithTimeout(context.Background(), labtest.BootTimeout)
	defer cancel()
	src, _ := json.Marshal(TemplateSource{Image: img.Dir})
	const mark = "LEASE0123456789"
	got, err := d.CreateVM(ctx, hypervisor.CreateRequest{Name: "small-a1", Source: src, MemoryMB: 192, CPUs: 1, Mark: mark})
	if err != nil {
		t.Fatalf("CreateVM = %v", err)
	}
	t.Cleanup(func() { _ = lab.Remove(context.Background(), state, "small-a1", mark) })
	if got.Name != "small-a1" {
		t.Errorf("CreateVM name = %q; want small-a1", got.Name)
	}
	res, err := hypervisor.Run(ctx, d, "small-a1", hypervisor.ExecRequest{Argv: []string{"/bin/hostname"}})
	if err != nil || string(res.Stdout) != "small-a1\n" {
		t.Errorf("Run(hostname) = %q, %v; want small-a1", res.Stdout, err)
	}
	vms, err := d.ListVMs(ctx)
	if err != nil || !slices.ContainsFunc(vms, func(v hypervisor.VM) bool { return v.Name == "small-a1" && v.State == hypervisor.StateRunning }) {
		t.Errorf("ListVMs = %+v, %v; want small-a1 running", vms, err)
	}
	// The same name again is refused before anything is touched.
	if _, err := d.CreateVM(ctx, hypervisor.CreateRequest{Name: "small-a1", Source: src, Mark: "OTHER0123456789"}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("CreateVM(existing name) = %v; want ErrInvalidArgument", err)
	}
	// A lab up VM (no owner) and a wrong mark are refused.
	labUp := labtest.Start(t, lab.Spec{Name: "labup"})
	d2, err := New(Config{LabDir: filepath.Dir(labUp.Dir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if err := d2.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "labup", Mark: mark}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(lab up VM) = %v; want ErrNotCreated", err)
	}
	if st, err := d2.Status(ctx, "labup"); err != nil || st.State != hypervisor.StateRunning {
		t.Errorf("lab up VM after a refused delete: %+v, %v; want running", st, err)
	}
	if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "small-a1", Mark: "OTHER0123456789"}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(wrong mark) = %v; want ErrNotCreated", err)
	}
	// A new driver (the plugin restarted) deletes it.
	d.Close()
	fresh := newDriver()
	if err := fresh.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "small-a1", Mark: mark}); err != nil {
		t.Fatalf("DeleteVM = %v", err)
	}
	if _, err := os.Lstat(filepath.Join(state, "lab", "small-a1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("VM directory after DeleteVM: %v; want gone (overlay, sockets, logs)", err)
	}
	if _, err := fresh.Status(ctx, "small-a1"); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("Status after DeleteVM = %v; want ErrUnknownVM", err)
	}
	if err := fresh.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "small-a1", Mark: mark}); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("DeleteVM twice = %v; want ErrUnknownVM", err)
	}
}

// TestCreateRefusals: bad requests and sources change nothing.
func TestCreateRefusals(t *testing.T) {
	state := t.TempDir()
	d, err := New(Config{LabDir: filepath.Join(state, "lab"), VMs: []VMConfig{{Name: "fixed", QMPSocket: "q", QGASocket: "g"}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	noLab, _ := New(Config{Logger: slog.New(slog.DiscardHandler)})
	defer noLab.Close()
	ctx := context.Background()
	const mark = "LEASE0123456789"
	tests := []struct {
		name string
		d    *Driver
		req  hypervisor.CreateRequest
		want error
	}{
		{"no lab", noLab, hypervisor.CreateRequest{Name: "a", Mark: mark}, hypervisor.ErrNotSupported},
		{"configured name", d, hypervisor.CreateRequest{Name: "fixed", Mark: mark}, hypervisor.ErrInvalidArgument},
		{"unknown source field", d, hypervisor.CreateRequest{Name: "a", Mark: mark, Source: json.RawMessage(`{"imgae":"x"}`)}, hypervisor.ErrInvalidArgument},
		{"bad cmdline key", d, hypervisor.CreateRequest{Name: "a", Mark: mark, Source: json.RawMessage(`{"cmdline":{"PATH":"/x"}}`)}, hypervisor.ErrInvalidArgument},
		{"too little memory", d, hypervisor.CreateRequest{Name: "a", Mark: mark, MemoryMB: 64}, hypervisor.ErrInvalidArgument},
		{"tiny disk", d, hypervisor.CreateRequest{Name: "a", Mark: mark, Source: json.RawMessage(`{"disk_mb":1}`)}, hypervisor.ErrInvalidArgument},
		{"no image", d, hypervisor.CreateRequest{Name: "a", Mark: mark}, hypervisor.ErrBackend},
		{"image not built", d, hypervisor.CreateRequest{Name: "a", Mark: mark, Source: json.RawMessage(`{"image":"/nonexistent"}`)}, hypervisor.ErrBackend},
		{"bad mark", d, hypervisor.CreateRequest{Name: "a", Mark: "x"}, hypervisor.ErrInvalidArgument},
	}
	for _, tt := range tests {
		if _, err := tt.d.CreateVM(ctx, tt.req); !errors.Is(err, tt.want) {
			t.Errorf("CreateVM(%s) = %v; want %v", tt.name, err, tt.want)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "lab")); len(ents) != 0 {
		t.Errorf("lab directory after refusals holds %d entries; want none", len(ents))
	}
	if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "fixed", Mark: mark}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(configured VM) = %v; want ErrNotCreated", err)
	}
	if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "../etc", Mark: mark}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(../etc) = %v; want ErrNotCreated", err)
	}
}
