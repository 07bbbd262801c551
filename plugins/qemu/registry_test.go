package qemu

import (
	"context"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
)

// newFromJSON builds the driver the way the plugin host does: through its
// registry entry, from JSON settings.
func newFromJSON(ctx context.Context, config []byte) (hypervisor.Driver, error) {
	d, ok := registry.Lookup(Name)
	if !ok {
		panic("driver " + Name + " is not registered")
	}
	return d.New(ctx, config)
}
