package virtualbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/internal/vboxemu"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

// emulatorBinary builds the VBoxManage emulator (internal/vboxemu) once per
// test binary.
func emulatorBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "vmgate-vboxemu-")
		if buildErr != nil {
			return
		}
		builtBin = filepath.Join(buildDir, "VBoxManage")
		out, err := exec.Command("go", "build", "-o", builtBin, "github.com/vmgate/vmgate/internal/vboxemu/cmd/vboxmanage").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build internal/vboxemu/cmd/vboxmanage: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// emulator is one emulated VirtualBox host: its world file, its log, and
// its own copy of the emulator binary, which finds both next to itself.
type emulator struct {
	dir, bin, world, logPath, passwordFile string
}

const (
	emuUser     = "vagrant"
	emuPassword = "correct horse battery"
)

// Machine UUIDs of the tests' machines.
const (
	uuidT1     = "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0001"
	uuidNoExec = "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0002"
	uuidOff    = "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0003"
)

// newEmulator makes a host of VirtualBox version with vms; tweak may
// change the world before it is written.
func newEmulator(t testing.TB, version string, vms []*vboxemu.Machine, tweak ...func(*vboxemu.World)) *emulator {
	t.Helper()
	bin := emulatorBinary(t)
	dir := t.TempDir()
	e := &emulator{dir: dir, bin: filepath.Join(dir, "VBoxManage"), world: filepath.Join(dir, vboxemu.WorldFile),
		logPath: filepath.Join(dir, vboxemu.LogFile), passwordFile: filepath.Join(dir, "password")}
	// The emulator reads its world next to itself: each test gets its own copy.
	if err := os.Link(bin, e.bin); err != nil {
		raw, err := os.ReadFile(bin)
		if err == nil {
			err = os.WriteFile(e.bin, raw, 0o700)
		}
		if err != nil {
			t.Fatalf("copying the emulator: %v", err)
		}
	}
	w := &vboxemu.World{Version: version, Users: map[string]string{emuUser: emuPassword}, VMs: vms}
	for _, f := range tweak {
		f(w)
	}
	if err := vboxemu.WriteWorld(e.world, w); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.passwordFile, []byte(emuPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return e
}

// machine is a running machine backed by a lab VM's sockets, or a powered
// off one without a guest when qga is empty.
func machine(name, uuid, qga, qmp string) *vboxemu.Machine {
	state := "running"
	if qga == "" {
		state = "poweroff"
	}
	return &vboxemu.Machine{Name: name, UUID: uuid, State: state, StateChange: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), QGASocket: qga, QMPSocket: qmp}
}

func (e *emulator) config() Config {
	return Config{VBoxManage: e.bin, Username: emuUser, PasswordFile: e.passwordFile, Logger: slog.New(slog.DiscardHandler)}
}

func (e *emulator) driver(t testing.TB, mod ...func(*Config)) *Driver {
	t.Helper()
	cfg := e.config()
	for _, f := range mod {
		f(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func (e *emulator) jsonConfig() []byte {
	b, _ := json.Marshal(Settings{VBoxManage: e.bin, Username: emuUser, PasswordFile: e.passwordFile})
	return b
}

// calls are the emulator's invocations so far.
func (e *emulator) calls(t testing.TB) []vboxemu.LogEntry {
	t.Helper()
	f, err := os.Open(e.logPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []vboxemu.LogEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		var l vboxemu.LogEntry
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("emulator log: %v", err)
		}
		out = append(out, l)
	}
	return out
}

func (e *emulator) resetLog() { os.Remove(e.logPath) }

// runCalls are the `guestcontrol ... run` invocations so far.
func (e *emulator) runCalls(t testing.TB) []vboxemu.LogEntry {
	var runs []vboxemu.LogEntry
	for _, c := range e.calls(t) {
		if len(c.Argv) > 2 && c.Argv[0] == "guestcontrol" && c.Argv[2] == "run" {
			runs = append(runs, c)
		}
	}
	return runs
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := testload.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// versions are the emulated releases every driver test runs against.
var versions = []string{"6.1", "7.0", "7.1"}
