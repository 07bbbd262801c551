package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestUptime reads /proc/uptime lines as row 8d does, and refuses others.
func TestUptime(t *testing.T) {
	tests := []struct {
		line    string
		want    float64
		wantErr string
	}{
		{"1234.56 4321.00", 1234.56, ""},
		{"  7.01 1.00\n", 7.01, ""},
		{"", 0, "empty line"},
		{"started 1.0", 0, `line "started 1.0"`},
	}
	for _, tt := range tests {
		got, err := uptime(tt.line)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("uptime(%q) = %v, %v; want an error containing %q", tt.line, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("uptime(%q) = %v, %v; want %v", tt.line, got, err, tt.want)
		}
	}
}

// TestResidentRoad: rows 8–8d run only on the resident helper over the
// virtio-serial port, not through the agent's exec or per command.
func TestResidentRoad(t *testing.T) {
	tests := []struct {
		status string
		ok     bool
	}{
		{`{"helper":{"road":"resident","via":"virtio-serial","pid":412}}`, true},
		{`{"helper":{"road":"resident","via":"guest agent exec + unix socket","why":"no channel"}}`, false},
		{`{"helper":{"road":"per-command","why":"no \"resident\" helper: the port is missing"}}`, false},
		{`{"helper":{"road":"undecided"}}`, false},
		{`{"state":"running"}`, false},
	}
	for _, tt := range tests {
		if err := residentRoad("vm1", json.RawMessage(tt.status)); (err == nil) != tt.ok {
			t.Errorf("residentRoad(%s) = %v; want ok %v", tt.status, err, tt.ok)
		}
	}
}
