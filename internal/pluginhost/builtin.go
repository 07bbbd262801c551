package pluginhost

import (
	"context"
	"fmt"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
)

// Builtin builds a built-in driver from its JSON configuration (empty means
// none). It must validate config before any side effect.
type Builtin func(ctx context.Context, config []byte) (hypervisor.Driver, error)

// Registry maps built-in driver names to their constructors.
type Registry map[string]Builtin

// Registered is every driver registered with hypervisor/registry: the
// drivers linked into this binary (vmgate's are blank-imported by
// cmd/vmgate). The plugin host imports none of them.
func Registered() Registry {
	reg := Registry{}
	for _, name := range registry.Names() {
		d, _ := registry.Lookup(name)
		reg[name] = d.New
	}
	return reg
}

// ServeBuiltin serves the built-in driver name from reg as a plugin on this
// process's stdio handshake (the body of `vmgate plugin NAME`). The driver is
// built when the host's Configure arrives. It returns an error at once for a
// name reg does not have; otherwise it returns when the host stops the plugin.
func ServeBuiltin(reg Registry, name string) error {
	build, ok := reg[name]
	if !ok {
		return fmt.Errorf("pluginhost: serve: %w: %q", ErrUnknownDriver, name)
	}
	hypervisor.Serve(hypervisor.NewDeferred(build))
	return nil
}
