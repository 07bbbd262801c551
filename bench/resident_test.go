package main

import (
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
