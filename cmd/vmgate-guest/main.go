// Command vmgate-guest is vmgate's in-guest helper. It serves the host in
// one of two ways (see guest/agent):
//
//   - resident: `vmgate-guest serve` stays running and answers every
//     command below on the virtio-serial port org.vmgate.guest.0 and on a
//     root-only unix socket, where `vmgate-guest call ARGS...` reaches it;
//   - per command: the host runs it through the guest agent's exec channel
//     (arguments as flags, a run request as JSON on stdin) and reads exactly
//     one JSON reply from its stdout.
//
// Data flags may come before a command run per command: --in P1:N1,P2:N2,...
// makes staging files of file stage (each of the size given) the command's
// data input instead of stdin; --out inline|stage|auto sends its data output
// after the reply's line, to staging files the reply lists, or inline up to
// 256 KiB and staged beyond. The resident helper reads data from the
// request's stdin and answers it inline.
//
// Its commands:
//
//	vmgate-guest serve [--detach] [--replace] [--port NAME] [--socket PATH] [--oneshot-pool N]
//	vmgate-guest call ARGS... < stdin
//	vmgate-guest install [--unit-dir DIR] [--no-start]
//	vmgate-guest version --json
//	vmgate-guest hello
//	vmgate-guest ps [--session ID]
//	vmgate-guest run < request.json
//	vmgate-guest job start < request.json       (resident only)
//	vmgate-guest job status --id ID [--stdout-since N] [--stderr-since N] [--max-bytes N] [--wait-ms N]
//	vmgate-guest job list | cancel --id ID | end-session --session ID
//	vmgate-guest kill --pid P [--signal TERM] [--started-at MS]
//	vmgate-guest session create --id ID [--ttl-s N] [--idle-s N] [--memory-mb N] [--pids N] [--cpu-percent N] [--sandbox JSON]
//	vmgate-guest session list | destroy --id ID | reap
//	vmgate-guest metrics [--sample-ms N]
//	vmgate-guest file stat --path P [--follow-symlinks] [--write]
//	vmgate-guest file read --path P [--max-bytes N] [--raw]
//	vmgate-guest [--out MODE] file read --path P [--offset N] [--length N] [--hash]
//	vmgate-guest [--in PIECES] file write --path P --size N [--mode M] [--create-mode M] [--special-bits]
//	    [--offset N | --append] [--expect-sha256 HEX] [--hash] [--from STAGED] < data
//	vmgate-guest file stage [--count N]
//	vmgate-guest file unstage --path STAGED [--path STAGED ...]
//	vmgate-guest dir list --path DIR [--depth N] [--max-entries N]
//	vmgate-guest [--out MODE] archive read --path DIR [--gzip] [--max-bytes N] [--max-entries N]
//	vmgate-guest [--in PIECES] archive write --path DIR [--max-bytes N] [--max-entries N] [--special-bits]
//	    [--devices] [--symlinks-out] [--all-or-nothing] [--dry-run] [--create] [--skip 1,4,7-9] < tar
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
	if len(args) > 0 && args[0] == agent.CallCommand {
		os.Exit(agent.CallMain(agent.DefaultConfig().Root, args[1:], os.Stdin, os.Stdout))
	}
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
	if len(args) > 0 && args[0] == agent.ServeCommand {
		os.Exit(a.ServeMain(args[1:], os.Stdout))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	code := a.Main(ctx, args, os.Stdin, os.Stdout)
	stop()
	os.Exit(code)
}
