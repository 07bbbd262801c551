package hostguard

import "testing"

func TestAllowed(t *testing.T) {
	allowed := []string{"vmgate.lab", "gw.example:8707"}
	tests := []struct {
		host          string
		want, address bool
	}{
		{"localhost", true, true},
		{"LOCALHOST:8707", true, true},
		{"127.0.0.1:8707", true, true},
		{"127.1.2.3", true, true},
		{"[::1]:8707", true, true},
		{"vmgate.lab:9999", true, true},
		{"VMGATE.lab", true, true},
		{"gw.example:8707", true, true},
		{"gw.example:9000", false, false},
		{"attacker.example", false, false},
		{"localhost.attacker.example", false, false},
		{"127.0.0.1.nip.io", false, false},
		{"192.0.2.7:9100", false, true},
		{"[2001:db8::1]:9100", false, true},
		{"", false, false},
	}
	for _, tt := range tests {
		if got := Allowed(tt.host, allowed); got != tt.want {
			t.Errorf("Allowed(%q) = %v; want %v", tt.host, got, tt.want)
		}
		if got := AllowedOrAddress(tt.host, allowed); got != tt.address {
			t.Errorf("AllowedOrAddress(%q) = %v; want %v", tt.host, got, tt.address)
		}
	}
}
