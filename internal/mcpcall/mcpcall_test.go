package mcpcall

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestCallRefusesBeforeConnecting: a bad tool name, arguments that are not
// one JSON object and a missing server are refused before any connection
// (no URL is dialled, no child started).
func TestCallRefusesBeforeConnecting(t *testing.T) {
	tests := []struct {
		name, tool, args string
		o                Options
		want             string
		is               error
	}{
		{"empty tool", "", "{}", Options{URL: "http://127.0.0.1:1/mcp"}, "invalid tool name", nil},
		{"tool with a space", "list vms", "{}", Options{URL: "http://127.0.0.1:1/mcp"}, "invalid tool name", nil},
		{"array arguments", "list_vms", "[]", Options{URL: "http://127.0.0.1:1/mcp"}, "", ErrArgs},
		{"duplicate keys", "list_vms", `{"vm":"a","vm":"b"}`, Options{URL: "http://127.0.0.1:1/mcp"}, "", ErrArgs},
		{"no server", "list_vms", "{}", Options{}, "no server", nil},
		{"not an http URL", "list_vms", "{}", Options{URL: "ftp://x/mcp"}, "want http(s)", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Call(context.Background(), tt.o, tt.tool, []byte(tt.args))
			if err == nil || tt.is != nil && !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Call(%q, %s) = %v; want an error with %q (is %v)", tt.tool, tt.args, err, tt.want, tt.is)
			}
		})
	}
}
