package lab

import "testing"

func TestSameQEMUArgv(t *testing.T) {
	base := []string{"/usr/bin/qemu-system-x86_64", "-name", "vmgate-lab-vm1", "-pidfile", "/s/qemu.pid"}
	tests := []struct {
		name string
		a, b []string
		want bool
	}{
		{"equal", base, base, true},
		{"relaunched with -daemonize", append(append([]string{}, base...), "-daemonize"), base, true},
		{"stored with -daemonize", base, append(append([]string{}, base...), "-daemonize"), true},
		{"other VM", base, []string{"/usr/bin/qemu-system-x86_64", "-name", "vmgate-lab-vm2", "-pidfile", "/s/qemu.pid"}, false},
		{"other program", []string{"sleep", "100"}, base, false},
		{"prefix only", base[:3], base, false},
		{"empty", nil, base, false},
	}
	for _, tt := range tests {
		if got := sameQEMUArgv(tt.a, tt.b); got != tt.want {
			t.Errorf("sameQEMUArgv(%s) = %v; want %v", tt.name, got, tt.want)
		}
	}
}
