package lab

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestRemoveChecksOwner: without QEMU, Remove refuses what it did not
// create (a lab up VM, another owner, a symlinked owner file's target is
// not read as the mark) and removes a stopped VM it did.
func TestRemoveChecksOwner(t *testing.T) {
	state := t.TempDir()
	mkVM := func(name, owner string) string {
		dir := filepath.Join(state, "lab", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(dir, OwnerFileName), []byte(owner+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// A stopped VM: a vm.json whose pid runs no QEMU.
		b, _ := json.Marshal(VM{Name: name, PID: 999999, Argv: []string{"/nonexistent/qemu"}, Dir: dir})
		if err := os.WriteFile(filepath.Join(dir, StateFileName), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	labUp := mkVM("vm1", "")
	other := mkVM("theirs", "lease-someone-else")
	mine := mkVM("mine", "lease-0123456789")
	ctx := context.Background()
	tests := []struct {
		name, mark string
		want       error
	}{
		{"vm1", "lease-0123456789", ErrNotOwned},
		{"theirs", "lease-0123456789", ErrNotOwned},
		{"mine", "", ErrNotOwned},
		{"mine", "lease-other-00000", ErrNotOwned},
		{"absent", "lease-0123456789", ErrNotFound},
		{"../mine", "lease-0123456789", ErrInvalidSpec},
		{"Mine", "lease-0123456789", ErrInvalidSpec},
	}
	for _, tt := range tests {
		if err := Remove(ctx, state, tt.name, tt.mark); !errors.Is(err, tt.want) {
			t.Errorf("Remove(%q, %q) = %v; want %v", tt.name, tt.mark, err, tt.want)
		}
	}
	for _, dir := range []string{labUp, other, mine} {
		if _, err := os.Stat(filepath.Join(dir, StateFileName)); err != nil {
			t.Errorf("%s after refused removals: %v; want it kept", dir, err)
		}
	}
	if err := Remove(ctx, state, "mine", "lease-0123456789"); err != nil {
		t.Fatalf("Remove(mine) = %v", err)
	}
	if _, err := os.Lstat(mine); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory after Remove: %v; want it gone", err)
	}
}

func TestCreateRefusesBeforeAnySideEffect(t *testing.T) {
	state := t.TempDir()
	existing := filepath.Join(state, "lab", "taken")
	if err := os.MkdirAll(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		spec Spec
		mark string
		want error
	}{
		{Spec{Name: "a", StateDir: state}, "short", ErrInvalidSpec},
		{Spec{Name: "a", StateDir: state}, "has space in it", ErrInvalidSpec},
		{Spec{Name: "a", StateDir: state, CPUs: MaxCPUs + 1}, "lease-0123456789", ErrInvalidSpec},
		{Spec{Name: "-a", StateDir: state}, "lease-0123456789", ErrInvalidSpec},
		{Spec{Name: "taken", StateDir: state}, "lease-0123456789", ErrExists},
	}
	for _, tt := range tests {
		if _, err := Create(context.Background(), tt.spec, tt.mark); !errors.Is(err, tt.want) {
			t.Errorf("Create(%+v, %q) = %v; want %v", tt.spec, tt.mark, err, tt.want)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(state, "lab"))
	if len(ents) != 1 {
		t.Errorf("lab directory holds %d entries after refusals; want only the existing one", len(ents))
	}
	if _, err := os.Stat(filepath.Join(existing, OwnerFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an owner file was written into an existing VM directory: %v", err)
	}
}
