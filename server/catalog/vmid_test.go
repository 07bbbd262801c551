package catalog

import (
	"strings"
	"testing"
)

func TestValidVMID(t *testing.T) {
	for _, tt := range []struct {
		id   string
		want bool
	}{
		{"lab/vm1", true}, {"pve/101", true}, {"vbox/Ubuntu 22.04 (64-bit)", true}, {"virt/a_b-c.d+e@f:g", true},
		{"lab/*", false}, {"lab/", false}, {"lab/-a", false}, {"lab/.a", false}, {"lab/ a", false}, {"lab/a ", false}, {"lab/a.", true}, {"lab/a.b.c", true},
		{"lab/a\x00", false}, {"lab/a;b", false}, {"lab/a$b", false}, {"lab/a\\b", false}, {"lab/..", false}, {"/vm1", false}, {"vm1", false},
		{"lab/" + strings.Repeat("a", 255), true}, {"lab/" + strings.Repeat("a", 256), false}, {"lab/a..b", false}, {"lab/a\x7f", false}, {"lab/é", false}, {"Lab/vm1", false}, {"lab/a/b", false},
	} {
		if got := ValidVMID(tt.id); got != tt.want {
			t.Errorf("ValidVMID(%q) = %v; want %v", tt.id, got, tt.want)
		}
	}
}
