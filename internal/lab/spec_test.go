package lab

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStartRejectsBadSpec(t *testing.T) {
	long := strings.Repeat("x", 120)
	tests := []struct {
		name string
		spec Spec
	}{
		{"empty name", Spec{}},
		{"upper case", Spec{Name: "VM1"}},
		{"leading dash", Spec{Name: "-vm"}},
		{"slash", Spec{Name: "a/b"}},
		{"dot dot", Spec{Name: ".."}},
		{"too long", Spec{Name: strings.Repeat("a", 33)}},
		{"memory low", Spec{Name: "a", MemoryMB: 64}},
		{"memory negative", Spec{Name: "a", MemoryMB: -1}},
		{"lower key", Spec{Name: "a", Cmdline: map[string]string{"qga_block": "x"}}},
		{"reserved key", Spec{Name: "a", Cmdline: map[string]string{"LAB_NAME": "x"}}},
		{"space in value", Spec{Name: "a", Cmdline: map[string]string{"QGA_BLOCK": "a b"}}},
		{"quote in value", Spec{Name: "a", Cmdline: map[string]string{"QGA_BLOCK": `"x`}}},
		{"newline in value", Spec{Name: "a", Cmdline: map[string]string{"X": "a\nb"}}},
		{"socket path too long", Spec{Name: "a", StateDir: "/" + long}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.spec.StateDir == "" {
				tt.spec.StateDir = dir
			}
			_, err := Start(context.Background(), tt.spec)
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("Start(%+v) = %v; want ErrInvalidSpec", tt.spec, err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("Start(%+v) created %v; want nothing", tt.spec, ents)
			}
		})
	}
}

func TestDefaultStateDir(t *testing.T) {
	home, _ := os.UserHomeDir()
	tests := []struct {
		state, xdg, want string
	}{
		{"/s", "/x", "/s"},
		{"", "/x", filepath.Join("/x", "vmgate")},
		{"", "", filepath.Join(home, ".local", "state", "vmgate")},
	}
	for _, tt := range tests {
		t.Setenv("VMGATE_STATE_DIR", tt.state)
		t.Setenv("XDG_STATE_HOME", tt.xdg)
		if got, err := DefaultStateDir(); err != nil || got != tt.want {
			t.Errorf("DefaultStateDir() with VMGATE_STATE_DIR=%q XDG_STATE_HOME=%q = %q, %v; want %q", tt.state, tt.xdg, got, err, tt.want)
		}
	}
}

func TestGetRejectsBadName(t *testing.T) {
	for _, name := range []string{"", "../x", "A", "a/b"} {
		if _, err := Get(t.TempDir(), name); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("Get(%q) = %v; want ErrInvalidSpec", name, err)
		}
	}
}
