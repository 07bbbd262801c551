package catalog

import "testing"

func TestValidVMID(t *testing.T) {
	for _, tt := range []struct {
		id   string
		want bool
	}{
		{"lab/vm1", true}, {"pve/101", true}, {"vbox/Ubuntu 22.04 (64-bit)", true}, {"virt/a_b-c.d+e@f:g", true},
		{"lab/*", false}, {"lab/a..b", false}, {"lab/a\x7f", false}, {"lab/é", false}, {"Lab/vm1", false}, {"lab/a/b", false},
	} {
		if got := ValidVMID(tt.id); got != tt.want {
			t.Errorf("ValidVMID(%q) = %v; want %v", tt.id, got, tt.want)
		}
	}
}
