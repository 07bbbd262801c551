package main

import (
	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/internal/pluginhost"
)

func init() { commands = append(commands, newPluginCmd) }

// newPluginCmd is how the binary runs one of its built-in drivers as a
// go-plugin process for the server. It is hidden: run by hand (without the
// server's handshake cookie) it explains that and exits 1. Its settings come
// through the Configure RPC, never through argv or the environment; stdout
// carries the handshake, logs go to stderr.
func newPluginCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "plugin NAME",
		Short:  "Serve a built-in hypervisor driver as a plugin (run by the server)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return pluginhost.ServeBuiltin(pluginhost.Registered(), args[0])
		},
	}
}
