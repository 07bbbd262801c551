//go:build linux

package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// shimCommand is the hidden subcommand that applies a marker-tracked
// session's rlimits to itself and then execs the real command, so the
// limits hold from the command's first instruction.
const shimCommand = "__rlimit"

// ShimCommand is the argv[1] that selects RlimitExec in cmd/vmgate-guest.
const ShimCommand = shimCommand

// RlimitExec runs `__rlimit --as BYTES --nproc N -- argv...`: it sets
// RLIMIT_AS and RLIMIT_NPROC (0 leaves one unset) and replaces itself with
// argv. It returns only on failure; after the address-space limit is set,
// reporting that failure may itself find no memory, and the runtime's own
// message is then what stderr shows (the command did not run either way).
// RLIMIT_NPROC does not bind root, so in a guest without cgroup v2 a root
// session's pids limit is advisory.
func RlimitExec(args []string) error {
	fs := flag.NewFlagSet(shimCommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	as := fs.Uint64("as", 0, "RLIMIT_AS bytes")
	nproc := fs.Uint64("nproc", 0, "RLIMIT_NPROC")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("rlimit shim: %w", err)
	}
	argv := fs.Args()
	if len(argv) == 0 || argv[0] == "" {
		return errors.New("rlimit shim: no command")
	}
	// Everything that allocates comes before the limits: under RLIMIT_AS
	// the Go runtime may find no room to map more memory.
	runtime.MemProfileRate = 0
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("rlimit shim: %w", err)
	}
	limits := []rlimitSetting{{unix.RLIMIT_NPROC, *nproc}, {unix.RLIMIT_AS, *as}}
	return fmt.Errorf("rlimit shim: %w", limitedExec(path, argv, limits))
}
