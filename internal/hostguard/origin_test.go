package hostguard

import "testing"

func TestParseOrigin(t *testing.T) {
	tests := []struct {
		origin, host, port string
		ok, loopback       bool
	}{
		{"http://localhost:6274", "localhost", "6274", true, true},
		{"https://localhost", "localhost", "", true, true},
		{"http://127.0.0.1:8707", "127.0.0.1", "8707", true, true},
		{"http://[::1]:8707", "[::1]", "8707", true, true},
		{"http://[::1]", "[::1]", "", true, true},
		{"https://ops.example:443", "ops.example", "443", true, false},
		{"http://192.0.2.7", "192.0.2.7", "", true, false},
		{"http://[2001:db8::1]:80", "[2001:db8::1]", "80", true, false},
		{"http://127.0.0.2:80", "127.0.0.2", "80", true, false}, // only the three names the rule lists
		{"http://localhost.evil.example", "localhost.evil.example", "", true, false},
		{"http://localhost:6274/", "", "", false, false},
		{"http://LOCALHOST:6274", "", "", false, false},
		{"http://localhost:0", "", "", false, false},
		{"http://localhost:06274", "", "", false, false},
		{"http://localhost:x", "", "", false, false},
		{"http://evil@localhost", "", "", false, false},
		{"http://::1", "", "", false, false},
		{"http://[::1", "", "", false, false},
		{"http://", "", "", false, false},
		{"http://[]", "", "", false, false},
		{"ws://localhost", "", "", false, false},
		{"null", "", "", false, false},
		{"", "", "", false, false},
	}
	for _, tt := range tests {
		host, port, err := ParseOrigin(tt.origin)
		if (err == nil) != tt.ok || host != tt.host || port != tt.port {
			t.Errorf("ParseOrigin(%q) = %q, %q, %v; want %q, %q, ok %v", tt.origin, host, port, err, tt.host, tt.port, tt.ok)
		}
		if got := LoopbackOrigin(tt.origin); got != tt.loopback {
			t.Errorf("LoopbackOrigin(%q) = %v; want %v", tt.origin, got, tt.loopback)
		}
	}
}
