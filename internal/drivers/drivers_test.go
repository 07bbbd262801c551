package drivers

import (
	"context"
	"testing"
)

// TestRegistry: every built-in driver is registered and refuses a bad
// config rather than starting half-configured.
func TestRegistry(t *testing.T) {
	reg := Registry()
	for _, name := range []string{"qemu", "proxmox", "virtualbox"} {
		build, ok := reg[name]
		if !ok {
			t.Errorf("Registry()[%q] missing", name)
			continue
		}
		if d, err := build(context.Background(), []byte(`{"no_such_field": true}`)); err == nil {
			t.Errorf("Registry()[%q](unknown field) = %v, nil; want an error", name, d)
		}
	}
}
