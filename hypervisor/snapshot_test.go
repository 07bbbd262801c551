package hypervisor

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateSnapshotName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"before-exec", true},
		{"s1", true},
		{"Snap_2026-12-01", true},
		{"a" + strings.Repeat("b", 39), true}, // 40
		{"", false},
		{"a", false}, // Proxmox wants at least 2
		{"a" + strings.Repeat("b", 40), false},
		{"1", false},    // QEMU would take it for a snapshot id
		{"1abc", false}, // a letter first
		{"-x", false},
		{"_x", false},
		{"a.b", false}, // Proxmox refuses dots
		{"a b", false},
		{"a/b", false},
		{"../etc", false},
		{"a\x00b", false},
		{"a\nb", false},
		{"snäp", false},
		{"current", false},
		{"Current", false},
		{"PENDING", false},
		{"currently", true},
		{"x'; rm -rf /", false},
		{"<snap/>", false},
		{strings.Repeat("a", 1<<20), false},
	}
	for _, tt := range tests {
		err := ValidateSnapshotName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateSnapshotName(%.50q) = %v; want ok %v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ValidateSnapshotName(%.50q) = %v; want it to wrap ErrInvalidArgument", tt.name, err)
		}
		if err != nil && len(err.Error()) > 300 {
			t.Errorf("ValidateSnapshotName(%d bytes) error is %d bytes; want a short message", len(tt.name), len(err.Error()))
		}
	}
}

func TestValidateSnapshotRequest(t *testing.T) {
	tests := []struct {
		desc string
		ok   bool
	}{
		{"", true},
		{"before the upgrade\n\tsecond line", true},
		{"ünïcödé ✓", true},
		{strings.Repeat("x", MaxSnapshotDescription), true},
		{strings.Repeat("x", MaxSnapshotDescription+1), false},
		{"bell\a", false},
		{"esc\x1b[31m", false},
		{"nul\x00", false},
		{"cr\r", false},
		{"bad \xff utf8", false},
		{"del\x7f", false},
	}
	for _, tt := range tests {
		req := SnapshotRequest{Name: "ok-name", Description: tt.desc}
		err := ValidateSnapshotRequest(req)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateSnapshotRequest(description %.40q) = %v; want ok %v", tt.desc, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ValidateSnapshotRequest(description %.40q) = %v; want ErrInvalidArgument", tt.desc, err)
		}
	}
	if err := ValidateSnapshotRequest(SnapshotRequest{Name: "1"}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("ValidateSnapshotRequest(name %q) = %v; want ErrInvalidArgument", "1", err)
	}
}

func TestCheckSnapshotMode(t *testing.T) {
	tests := []struct {
		modes  SnapshotModes
		memory bool
		want   error
	}{
		{SnapshotModes{Memory: true}, true, nil},
		{SnapshotModes{Memory: true}, false, ErrSnapshotDiskOnly},
		{SnapshotModes{DiskOnly: true}, true, ErrSnapshotMemory},
		{SnapshotModes{DiskOnly: true}, false, nil},
		{SnapshotModes{Memory: true, DiskOnly: true}, false, nil},
		{SnapshotModes{}, true, ErrSnapshotMemory},
	}
	for _, tt := range tests {
		err := CheckSnapshotMode(tt.modes, SnapshotRequest{Name: "s1", Memory: tt.memory})
		if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("CheckSnapshotMode(%+v, memory %v) = %v; want %v", tt.modes, tt.memory, err, tt.want)
		}
		if err != nil && !errors.Is(err, ErrNotSupported) {
			t.Errorf("CheckSnapshotMode(%+v, memory %v) = %v; want it to wrap ErrNotSupported", tt.modes, tt.memory, err)
		}
	}
}
