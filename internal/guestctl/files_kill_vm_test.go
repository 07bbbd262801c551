//go:build linux

package guestctl

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/libvirttest"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/plugins/libvirt"
	"github.com/vmgate/vmgate/plugins/proxmox"
	"github.com/vmgate/vmgate/plugins/qemu"
	"github.com/vmgate/vmgate/plugins/virtualbox"
)

// A whole-file write killed half-way leaves the old file: the guest agent
// stopped while the data is staged, and the driver's plugin process killed
// between the data's two pieces.

const killDir = "/tmp/vmgate-kill"

// victimSetup makes killDir/victim with known content and returns its
// sha256sum, with the staging directory emptied.
func victimSetup(t *testing.T, ctx context.Context, h *Helper, vm string) string {
	t.Helper()
	res := sh(t, ctx, h, vm, "rm -rf "+killDir+" /var/lib/vmgate/xfer/x-*; mkdir -p "+killDir+" && printf 'the old content' > "+killDir+"/victim && chmod 0600 "+killDir+"/victim && sha256sum "+killDir+"/victim")
	if res.ExitCode != 0 {
		t.Fatalf("setup: exit %d: %s", res.ExitCode, res.Stderr)
	}
	return strings.Fields(string(res.Stdout))[0]
}

// victimIntact checks the old content and that no temporary file is left
// beside it, then empties the staging directory (what a killed transfer
// left there is vmgate-guest's own, removed after an hour).
func victimIntact(t *testing.T, ctx context.Context, h *Helper, vm, want string) {
	t.Helper()
	got := string(sh(t, ctx, h, vm, "sha256sum "+killDir+"/victim; stat -c %a "+killDir+"/victim; ls -A "+killDir+"; stat -c %a /var/lib/vmgate/xfer").Stdout)
	if exp := want + "  " + killDir + "/victim\n600\nvictim\n700\n"; got != exp {
		t.Errorf("guest after the killed write: %q; want %q (the old file, nothing beside it, the staging directory private)", got, exp)
	}
	t.Logf("left in the staging directory: %q", sh(t, ctx, h, vm, "ls -l /var/lib/vmgate/xfer").Stdout)
	sh(t, ctx, h, vm, "rm -rf "+killDir+" /var/lib/vmgate/xfer/x-*")
}

// fileSize is the size of path (0 when it cannot be read).
func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// logSince reports whether path holds want after its first off bytes.
func logSince(path string, off int64, want string) bool {
	b, err := os.ReadFile(path)
	return err == nil && int64(len(b)) > off && strings.Contains(string(b[off:]), want)
}

// waitAgent waits until vm's guest agent runs commands again.
func waitAgent(t *testing.T, ctx context.Context, d hypervisor.Driver, vm string) {
	t.Helper()
	var b hypervisor.Backoff
	for {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := hypervisor.Run(c, d, vm, hypervisor.ExecRequest{Argv: []string{"/bin/true"}, Timeout: 5 * time.Second})
		cancel()
		if err == nil && res.ExitCode == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the guest agent did not come back: %v", err)
		}
		time.Sleep(b.Next())
	}
}

// killBackend is a backend of the killed-write tests.
type killBackend struct {
	name string
	// staged is a Helper on a VM whose data is staged through the guest
	// agent's file calls (no channel to a resident helper), the VM, and the
	// guest's console log.
	staged func(t *testing.T) (h *Helper, vm, serial string)
	// plugin is how pluginhost launches the driver, and the VM.
	plugin func(t *testing.T) (pluginhost.Spec, string)
}

// killBackends: the lab VM over the QEMU driver, a libvirt domain, and
// the Proxmox and VirtualBox emulators with the lab VM "cg" behind them.
var killBackends = []killBackend{
	{"qemu", func(t *testing.T) (*Helper, string, string) {
		// "noport": no channel, so the data is staged through the agent.
		h, _ := labHelper(t, "noport")
		return h, "noport", labtest.VM(t, "noport").SerialLog
	}, func(t *testing.T) (pluginhost.Spec, string) {
		cfg, _ := json.Marshal(qemu.Settings{LabDir: filepath.Dir(labtest.VM(t, "cg").Dir)})
		return pluginhost.Spec{Driver: qemu.Name, Backend: "lab", Config: cfg}, "cg"
	}},
	{"libvirt", func(t *testing.T) (*Helper, string, string) {
		env := libvirttest.Env(t)
		d, err := libvirt.New(libvirt.Config{URI: env.URI(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		// The domain has the helper's channel: hidden, so the data is
		// staged through the agent.
		return New(noChannel{d}, &DirBinaries{Dirs: []string{guestDir}}), libvirtVM, env.Domain(libvirtVM).SerialLog
	}, func(t *testing.T) (pluginhost.Spec, string) {
		cfg, _ := json.Marshal(libvirt.Settings{URI: libvirttest.Env(t).URI()})
		return pluginhost.Spec{Driver: libvirt.Name, Backend: "libvirttest", Config: cfg}, libvirtVM
	}},
	{"proxmox", func(t *testing.T) (*Helper, string, string) {
		d, vm := pveDriver(t)
		return New(d, &DirBinaries{Dirs: []string{guestDir}}), vm, labtest.VM(t, "cg").SerialLog
	}, func(t *testing.T) (pluginhost.Spec, string) {
		s, vm := pveSettings(t)
		cfg, _ := json.Marshal(s)
		return pluginhost.Spec{Driver: proxmox.Name, Backend: "pveemu", Config: cfg}, vm
	}},
	{"virtualbox", func(t *testing.T) (*Helper, string, string) {
		d, vm := vboxDriver(t)
		return New(d, &DirBinaries{Dirs: []string{guestDir}}), vm, labtest.VM(t, "cg").SerialLog
	}, func(t *testing.T) (pluginhost.Spec, string) {
		s, vm := vboxSettings(t)
		cfg, _ := json.Marshal(s)
		return pluginhost.Spec{Driver: virtualbox.Name, Backend: "vboxemu", Config: cfg}, vm
	}},
}

// agentWatcher kills qemu-ga once the staging directory holds more than
// 2 MiB and says so on the console; it gives up once killDir is gone or
// after five minutes. It runs detached (setsid, no output), so the exec
// that starts it ends at once.
const agentWatcher = `end=$(($(cut -d. -f1 /proc/uptime) + 300)); echo "watching the staging directory" >/dev/console; ` +
	`while [ -d ` + killDir + ` ] && [ "$(cut -d. -f1 /proc/uptime)" -lt $end ]; do ` +
	`n=$(ls -l /var/lib/vmgate/xfer 2>/dev/null | awk '{ s += $5 } END { print s + 0 }'); ` +
	`if [ "$n" -gt 2097152 ]; then kill -9 $(pidof qemu-ga); echo "killed qemu-ga at $n bytes" >/dev/console; exit 0; fi; ` +
	`sleep 0.05 2>/dev/null || sleep 1; done`

// waitConsole waits until serial holds want after its first seen bytes.
func waitConsole(t *testing.T, ctx context.Context, serial string, seen int64, want string) {
	t.Helper()
	for !logSince(serial, seen, want) {
		select {
		case <-ctx.Done():
			t.Fatalf("the console did not say %q", want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestLabWriteAgentStopped kills qemu-ga (the lab guest's init restarts
// it) once the staging files of a 20 MiB write hold 2 MiB: pieces are of
// wire.SmallPieceBytes, 4 MiB, so the kill comes in the middle of the
// first (on Proxmox, among the parts its driver joins into it). The data
// is staged through the agent on every backend (with a channel, it goes
// as one call on it, not through the agent: TestLabWriteHelperKilled).
func TestLabWriteAgentStopped(t *testing.T) {
	for _, b := range killBackends {
		t.Run(b.name, func(t *testing.T) {
			h, vm, serial := b.staged(t)
			ctx := testCtx(t, 10*time.Minute)
			old := victimSetup(t, ctx, h, vm)
			seen := fileSize(serial)
			start := `setsid /bin/sh -c "$1" </dev/null >/dev/null 2>&1 &`
			if res, err := hypervisor.Run(ctx, h.d, vm, hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", start, "sh", agentWatcher}, Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
				t.Fatalf("starting the watcher: %+v, %v", res, err)
			}
			t.Cleanup(func() { // ends the watcher if the kill never came
				c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				hypervisor.Run(c, h.d, vm, hypervisor.ExecRequest{Argv: []string{"rm", "-rf", killDir}, Timeout: time.Minute})
			})
			waitConsole(t, ctx, serial, seen, "watching the staging directory")
			agentStoppedWrite(t, ctx, h, vm, serial, seen)
			waitAgent(t, ctx, h.d, vm)
			victimIntact(t, ctx, h, vm, old)
		})
	}
}

// agentStoppedWrite writes 20 MiB and wants it to fail. The write in
// flight may never hear from the killed agent again; it ends with its
// context, which ends once the watcher has said on the console that it
// killed qemu-ga (rather than at the deadline).
func agentStoppedWrite(t *testing.T, ctx context.Context, h *Helper, vm, serial string, seen int64) {
	t.Helper()
	wctx, cancel := testload.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	go func() {
		for !logSince(serial, seen, "killed qemu-ga at ") {
			select {
			case <-wctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		cancel()
	}()
	_, err := h.FileWrite(wctx, vm, killDir+"/victim", randomData(20<<20, 7), WriteOptions{CreateMode: 0o644})
	if err == nil || !logSince(serial, seen, "killed qemu-ga at ") {
		t.Fatalf("FileWrite with the guest agent killed half-way = %v (console: killed %v); want an error after the kill", err, logSince(serial, seen, "killed qemu-ga at "))
	}
	t.Logf("FileWrite with the agent killed: %v", err)
}

// stageSpy is a driver that calls onStage before each write to a
// staging file, with its number (1, 2, ...).
type stageSpy struct {
	hypervisor.Driver
	n       atomic.Int32
	onStage func(n int)
}

func (s *stageSpy) FileWrite(ctx context.Context, vm, path string, data []byte, mode uint32) error {
	if stagePath.MatchString(path) {
		s.onStage(int(s.n.Add(1)))
	}
	return s.Driver.FileWrite(ctx, vm, path, data, mode)
}

// TestLabWritePluginKilled runs each backend's driver as a plugin process
// (this test binary, as `vmgate plugin NAME`) and kills it with SIGKILL
// when the second piece (4 MiB) of a 20 MiB write is about to go: the
// first is in the guest, the file is not touched. The spy hides the
// driver's channel, so the data is staged on every backend.
func TestLabWritePluginKilled(t *testing.T) {
	for _, b := range killBackends {
		t.Run(b.name, func(t *testing.T) {
			spec, vm := b.plugin(t)
			host := pluginhost.New(pluginhost.Options{Executable: os.Args[0], Registry: pluginhost.Registered(), Logger: slog.New(slog.DiscardHandler)})
			t.Cleanup(func() { host.Close() })
			ctx := testCtx(t, 10*time.Minute)
			d, err := host.Launch(ctx, spec)
			if err != nil {
				t.Fatalf("Launch(%s) = %v", spec.Driver, err)
			}
			sup := d.(*pluginhost.Supervisor)
			spy := &stageSpy{Driver: sup}
			var killed atomic.Int32
			spy.onStage = func(n int) {
				if n == 2 {
					killed.Store(int32(sup.PID()))
					syscall.Kill(sup.PID(), syscall.SIGKILL)
				}
			}
			h := New(spy, &DirBinaries{Dirs: []string{guestDir}})
			old := victimSetup(t, ctx, h, vm)
			_, err = h.FileWrite(ctx, vm, killDir+"/victim", randomData(20<<20, 8), WriteOptions{CreateMode: 0o644})
			if err == nil || killed.Load() == 0 {
				t.Fatalf("FileWrite with the plugin killed = %v (killed pid %d); want an error", err, killed.Load())
			}
			t.Logf("FileWrite with the plugin killed: %v", err)
			waitAgent(t, ctx, sup, vm) // the supervisor starts a new plugin
			if sup.PID() == int(killed.Load()) {
				t.Errorf("the plugin's pid is still %d; want a new process", killed.Load())
			}
			victimIntact(t, ctx, h, vm, old)
		})
	}
}

// TestLabWriteHelperKilled kills the resident helper (kill -9 from inside
// the guest) while a 20 MiB write comes to it over its channel as one
// call, once the helper holds 8 MiB more than before: the write fails as
// lost (it is not sent again), and the old file is as it was, with nothing
// beside it.
func TestLabWriteHelperKilled(t *testing.T) {
	const vm = "cg"
	h, _ := labHelper(t, vm)
	ctx := testCtx(t, 10*time.Minute)
	if r := h.CheckRoad(ctx, vm); r.Kind != RoadResident || r.Via != ViaChannel {
		t.Fatalf("road = %s; want resident over the channel", r)
	}
	old := victimSetup(t, ctx, h, vm)
	watcher := `p=$(cat ` + serveLock + `); rss() { awk '/^VmRSS:/ { print $2 }' /proc/$p/status; }; base=$(rss)
	end=$(($(cut -d. -f1 /proc/uptime) + 300)); echo "watching the helper at $base kB" >/dev/console
	while [ -d ` + killDir + ` ] && [ "$(cut -d. -f1 /proc/uptime)" -lt $end ]; do n=$(rss); [ -n "$n" ] && [ "$n" -gt $((base + 8192)) ] && { kill -9 $p; echo "killed the helper at $n kB" >/dev/console; exit 0; }; sleep 0.01 2>/dev/null || :; done`
	serial := labtest.VM(t, vm).SerialLog
	seen := fileSize(serial)
	if _, err := h.d.ExecStart(ctx, vm, hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", watcher}}); err != nil {
		t.Fatal(err)
	}
	waitConsole(t, ctx, serial, seen, "watching the helper at ")
	_, err := h.FileWrite(ctx, vm, killDir+"/victim", randomData(20<<20, 9), WriteOptions{CreateMode: 0o644})
	if !errors.Is(err, hypervisor.ErrHelperLost) || !logSince(serial, seen, "killed the helper at ") {
		t.Fatalf("FileWrite with the helper killed = %v (console: killed %v); want the call lost", err, logSince(serial, seen, "killed the helper at "))
	}
	got := string(sh(t, ctx, h, vm, "sha256sum "+killDir+"/victim; stat -c %a "+killDir+"/victim; ls -A "+killDir).Stdout)
	if exp := old + "  " + killDir + "/victim\n600\nvictim\n"; got != exp {
		t.Errorf("guest after the killed write: %q; want %q (the old file, nothing beside it)", got, exp)
	}
	sh(t, ctx, h, vm, "rm -rf "+killDir)
}
