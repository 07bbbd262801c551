package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
)

// cpuProfileEnv names a file that receives a CPU profile of `vmgate serve`
// from start to exit, like the hidden --cpuprofile flag (which wins): for
// measuring the server under a benchmark that starts it (docs/performance.md).
// A "%p" in the path becomes the process id, so several servers started
// with one environment write one profile each.
const cpuProfileEnv = "VMGATE_CPUPROFILE"

// startCPUProfile starts a CPU profile written to path ("" falls back to
// $VMGATE_CPUPROFILE; both empty: no profile). The returned stop ends the
// profile and closes the file; it is never nil.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		path = os.Getenv(cpuProfileEnv)
	}
	if path == "" {
		return func() error { return nil }, nil
	}
	path = strings.ReplaceAll(path, "%p", strconv.Itoa(os.Getpid()))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("serve: cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("serve: cpu profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("serve: cpu profile: %w", err)
		}
		return nil
	}, nil
}
