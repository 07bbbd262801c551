package config

import (
	"regexp"
	"strings"
	"testing"
)

// TestValidBackendName holds the one rule for a backend name against the
// pattern the config documents.
func TestValidBackendName(t *testing.T) {
	re := regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	for _, s := range []string{
		"lab", "pve", "a", "0", "lab-2", "a-", strings.Repeat("a", 32),
		"", "-lab", "Lab", "lab_2", "lab/x", "lab.x", "läb", strings.Repeat("a", 33), "lab 2",
	} {
		if got, want := ValidBackendName(s), re.MatchString(s); got != want {
			t.Errorf("ValidBackendName(%q) = %v; want %v", s, got, want)
		}
	}
}
