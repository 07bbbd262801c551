// Command vmgate is the one binary: the MCP server, its operator commands,
// the lab, and (hidden) the built-in driver plugins.
//
// Each command lives in its own file and registers its constructor in
// commands from an init function, so commands can be added independently.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// commands holds the constructors of the top-level subcommands. It is only
// appended to from init functions, before main runs.
var commands []func() *cobra.Command

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "vmgate",
		Short:         "An MCP server that lets AI agents operate VMs, with the policy built in",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, c := range commands {
		root.AddCommand(c())
	}
	return root
}

func main() {
	// Nothing vmgate makes is for other users: the state directory, its
	// disks, logs and sockets, and what QEMU, qemu-img and the plugins
	// this process starts make (they inherit the mask).
	syscall.Umask(0o077)
	// Logs go to stderr: stdout is the MCP stdio stream and the plugin handshake.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()})))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "vmgate:", err)
		var ec exitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

func logLevel() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(os.Getenv("VMGATE_LOG_LEVEL"))); err != nil {
		return slog.LevelInfo
	}
	return l
}

// exitCoder is an error that carries the process exit code
// (policy check exits 1 on a bad document, for example).
type exitCoder interface {
	error
	ExitCode() int
}

// exitError is an exitCoder with a message.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }
func (e *exitError) ExitCode() int { return e.code }
