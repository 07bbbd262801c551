package pluginhost

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// pluginEnvOf reads one variable of a running process's environment.
func pluginEnvOf(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := strings.CutPrefix(string(kv), key+"="); ok {
			return v
		}
	}
	return ""
}

// TestPluginSocketsArePrivate: a built-in plugin's calls go through its
// call socket, which lives with go-plugin's socket in a directory only this
// user can enter, as a socket only this user can open; the directory goes
// away with the plugin.
func TestPluginSocketsArePrivate(t *testing.T) {
	h, logs := newTestHost(t, Options{})
	s := launchSleepy(t, h, "vm1")
	if _, err := s.Status(context.Background(), "vm1"); err != nil {
		t.Fatalf("Status(vm1) = %v", err)
	}
	if l := logs.String(); !strings.Contains(l, `transport="call socket"`) {
		t.Errorf("host log does not say the plugin's calls use the call socket:\n%s", l)
	}
	dir := pluginEnvOf(t, s.PID(), "PLUGIN_UNIX_SOCKET_DIR")
	if dir == "" {
		t.Fatal("the plugin has no PLUGIN_UNIX_SOCKET_DIR")
	}
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Geteuid() {
		t.Fatalf("socket directory %s = %v, %v; want a directory of ours with mode 0700", dir, fi.Mode(), err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, e.Name())
		if info.Mode().Type() != fs.ModeSocket {
			t.Errorf("%s in the socket directory is %v; want only sockets", e.Name(), info.Mode())
		}
		if e.Name() == hypervisor.CallSocketName && info.Mode().Perm() != 0o600 {
			t.Errorf("call socket mode %v; want 0600", info.Mode().Perm())
		}
	}
	if len(names) != 2 || !strings.Contains(strings.Join(names, " "), hypervisor.CallSocketName) {
		t.Errorf("socket directory holds %q; want go-plugin's socket and %s", names, hypervisor.CallSocketName)
	}
	pid := s.PID()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if !waitGone(pid, 5*time.Second) {
		t.Fatalf("plugin %d still alive after Close", pid)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("socket directory after Close: %v; want it removed", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, hypervisor.CallSocketName)); !os.IsNotExist(err) {
		t.Errorf("call socket after Close: %v; want it removed", err)
	}
}
