package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestStartCPUProfile: the flag's path wins over the environment's, "%p"
// becomes the pid, the profile is in the file once stop returns, and with
// neither set nothing is written.
func TestStartCPUProfile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(cpuProfileEnv, filepath.Join(dir, "env-%p.pprof"))
	for _, tt := range []struct {
		name, flag, want string
	}{
		{"flag", filepath.Join(dir, "flag.pprof"), filepath.Join(dir, "flag.pprof")},
		{"env", "", filepath.Join(dir, "env-"+strconv.Itoa(os.Getpid())+".pprof")},
	} {
		stop, err := startCPUProfile(tt.flag)
		if err != nil {
			t.Fatalf("%s: startCPUProfile(%q) = %v", tt.name, tt.flag, err)
		}
		if err := stop(); err != nil {
			t.Fatalf("%s: stop() = %v", tt.name, err)
		}
		if fi, err := os.Stat(tt.want); err != nil || fi.Size() == 0 || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: profile %s = %v, %v; want a non-empty 0600 file", tt.name, tt.want, fi, err)
		}
	}

	t.Setenv(cpuProfileEnv, "")
	before, _ := os.ReadDir(dir)
	stop, err := startCPUProfile("")
	if err != nil || stop() != nil {
		t.Fatalf("startCPUProfile with no path = %v; want no error", err)
	}
	if after, _ := os.ReadDir(dir); len(after) != len(before) {
		t.Errorf("startCPUProfile with no path wrote %d files; want none", len(after)-len(before))
	}

	if _, err := startCPUProfile(filepath.Join(dir, "missing", "x.pprof")); err == nil {
		t.Errorf("startCPUProfile(a path in a missing directory) = nil; want an error")
	}
}
