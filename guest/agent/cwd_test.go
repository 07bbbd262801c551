//go:build linux

package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// TestRunCwdFollowsNoSymlink: run refuses a cwd that is reached through a
// symlink (a magic link too), that is not clean, or that is no directory,
// before anything starts; a real directory is where the command runs.
func TestRunCwdFollowsNoSymlink(t *testing.T) {
	a := hostAgent(t)
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "ran")
	proc := "/proc/" + strconv.Itoa(os.Getpid())
	for _, tt := range []struct {
		cwd, code, says string
	}{
		{dir + "/link", wire.CodeRefused, dir + "/link is a symlink"},
		{dir + "/link/x", wire.CodeRefused, dir + "/link is a symlink"},
		{"/proc/self/root" + real, wire.CodeRefused, "/proc/self is a symlink"},
		{proc + "/root" + real, wire.CodeRefused, proc + "/root is a symlink"},
		{real + "/..", wire.CodeInvalid, "is not clean"},
		{"/" + real, wire.CodeInvalid, "is not clean"},
		{dir + "/file", wire.CodeInvalid, "not a directory"},
		{dir + "/none", wire.CodeNotFound, "no such file or directory"},
	} {
		_, err := a.Run(context.Background(), wire.RunRequest{Argv: []string{"touch", marker}, Cwd: tt.cwd})
		if !isCode(err, tt.code) || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("Run(cwd %q) = %v; want %s saying %q", tt.cwd, err, tt.code, tt.says)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("Run(cwd %q) was refused but the command ran", tt.cwd)
		}
	}
	res, err := a.Run(context.Background(), wire.RunRequest{Argv: []string{"pwd", "-P"}, Cwd: real})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != real+"\n" {
		t.Errorf("Run(pwd, cwd %q) = %+v, %v; want it run there", real, res, err)
	}
}
