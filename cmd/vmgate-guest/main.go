// Command vmgate-guest is vmgate's in-guest helper: the host runs it through
// the guest agent's exec channel (arguments as flags, a run request as JSON on
// stdin) and reads exactly one JSON reply from its stdout. See guest/agent.
//
//	vmgate-guest version --json
//	vmgate-guest ps [--session ID]
//	vmgate-guest run < request.json
//	vmgate-guest kill --pid P [--signal TERM] [--started-at MS]
//	vmgate-guest session create --id ID [--ttl-s N] [--idle-s N] [--memory-mb N] [--pids N] [--cpu-percent N] [--sandbox JSON]
//	vmgate-guest session list | destroy --id ID | reap
//	vmgate-guest metrics [--sample-ms N]
//	vmgate-guest file stat --path P [--follow-symlinks] [--write]
//	vmgate-guest file read --path P [--max-bytes N] [--raw]
//	vmgate-guest file write --path P --size N [--mode M] [--create-mode M] [--special-bits] [--from STAGED] < data
//	vmgate-guest file stage
//
// Build it static: CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags='-s -w'.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/vmgate/vmgate/guest/agent"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == agent.SandboxCommand {
		os.Exit(agent.SandboxMain(args[1:]))
	}
	if len(args) > 0 && args[0] == agent.ShimCommand {
		err := agent.RlimitExec(args[1:])
		fmt.Fprintln(os.Stderr, "vmgate-guest:", err)
		os.Exit(127)
	}
	a, err := agent.New(agent.DefaultConfig())
	if err != nil {
		fmt.Fprintln(os.Stderr, "vmgate-guest:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	code := a.Main(ctx, args, os.Stdin, os.Stdout)
	stop()
	os.Exit(code)
}
