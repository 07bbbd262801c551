package virtualbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pluginhost"
)

var update = flag.Bool("update", false, "rewrite testdata/*.txtar from this run")

// The test binary is also the plugin: `<test binary> plugin virtualbox` serves
// the registered driver over go-plugin, as `vmgate plugin virtualbox` would.
func TestMain(m *testing.M) {
	if len(os.Args) >= 3 && os.Args[1] == "plugin" {
		if err := pluginhost.ServeBuiltin(pluginhost.Registered(), os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	code := labtest.Main(m,
		lab.Spec{Name: "t1"},
		lab.Spec{Name: "noexec", Cmdline: map[string]string{"QGA_BLOCK": "guest-exec"}},
	)
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

// emulatorBinary builds testdata/vboxmanage once per test binary.
func emulatorBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "vmgate-vboxemu-")
		if buildErr != nil {
			return
		}
		builtBin = filepath.Join(buildDir, "VBoxManage")
		out, err := exec.Command("go", "build", "-o", builtBin, "./testdata/vboxmanage").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./testdata/vboxmanage: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

type emuVM = struct {
	Name      string `json:"name"`
	UUID      string `json:"uuid"`
	State     string `json:"state"`
	QGASocket string `json:"qga_socket,omitempty"`
}

// emulator is one emulated VirtualBox host: its config file, its log, and
// its own copy of the emulator binary, which finds both next to itself.
type emulator struct {
	dir, bin, cfgPath, logPath, passwordFile string
}

const (
	emuUser     = "vagrant"
	emuPassword = "correct horse battery"
)

func newEmulator(t *testing.T, vms ...emuVM) *emulator {
	t.Helper()
	bin := emulatorBinary(t)
	dir := t.TempDir()
	e := &emulator{dir: dir, bin: filepath.Join(dir, "VBoxManage"), cfgPath: filepath.Join(dir, "vbox.json"), logPath: filepath.Join(dir, "vbox.log"), passwordFile: filepath.Join(dir, "password")}
	// The emulator reads vbox.json next to itself: each test gets its own copy.
	if err := os.Link(bin, e.bin); err != nil {
		raw, err := os.ReadFile(bin)
		if err == nil {
			err = os.WriteFile(e.bin, raw, 0o700)
		}
		if err != nil {
			t.Fatalf("copying the emulator: %v", err)
		}
	}
	raw, _ := json.Marshal(map[string]any{"username": emuUser, "password": emuPassword, "vms": vms})
	if err := os.WriteFile(e.cfgPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.passwordFile, []byte(emuPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *emulator) driver(t *testing.T) *Driver {
	t.Helper()
	d, err := New(Config{VBoxManage: e.bin, Username: emuUser, PasswordFile: e.passwordFile, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

type logEntry struct {
	Argv   []string `json:"argv"`
	Code   int      `json:"code"`
	Stdout string   `json:"stdout"`
	Stderr string   `json:"stderr"`
}

func (e *emulator) calls(t *testing.T) []logEntry {
	t.Helper()
	f, err := os.Open(e.logPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []logEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var l logEntry
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("emulator log: %v", err)
		}
		out = append(out, l)
	}
	return out
}

func (e *emulator) resetLog() { os.Remove(e.logPath) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestConformance runs the shared driver suite through the VBoxManage
// emulator with lab VMs behind it.
func TestConformance(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	noexec := labtest.VM(t, "noexec")
	e := newEmulator(t,
		emuVM{Name: "t1", UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0001", State: "running", QGASocket: t1.QGASocket},
		emuVM{Name: "noexec", UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0002", State: "running", QGASocket: noexec.QGASocket},
		emuVM{Name: "off", UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0003", State: "poweroff"},
	)
	hypervisortest.Run(t, hypervisortest.Harness{Driver: e.driver(t), VM: "t1", NoExecVM: "noexec"})
}

// TestHostileNames: names and paths VBoxManage could take for options or
// that break its output are refused before VBoxManage runs.
func TestHostileNames(t *testing.T) {
	e := newEmulator(t, emuVM{Name: "off", UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0003", State: "poweroff"})
	d := e.driver(t)
	ctx := ctxT(t)
	for _, name := range []string{"", "-", "--help", "-v", "--machinereadable", "off\x00", "off\nx", "off\r", "\xff\xfe"} {
		e.resetLog()
		calls := map[string]error{}
		_, calls["Status"] = d.Status(ctx, name)
		_, calls["AgentInfo"] = d.AgentInfo(ctx, name)
		_, calls["ExecStart"] = d.ExecStart(ctx, name, hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
		_, calls["ExecStatus"] = d.ExecStatus(ctx, name, hypervisor.ExecHandle{PID: 5, Token: "x"})
		_, calls["Run"] = d.Run(ctx, name, hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
		_, calls["FileRead"] = d.FileRead(ctx, name, "/etc/hostname", 10)
		calls["FileWrite"] = d.FileWrite(ctx, name, "/tmp/x", []byte("x"), 0)
		calls["Power"] = d.Power(ctx, name, hypervisor.PowerStart)
		for op, err := range calls {
			if !errors.Is(err, hypervisor.ErrUnknownVM) || !errors.Is(err, hypervisor.ErrInvalidArgument) {
				t.Errorf("%s(%q) = %v; want %v and %v", op, name, err, hypervisor.ErrUnknownVM, hypervisor.ErrInvalidArgument)
			}
		}
		if c := e.calls(t); len(c) != 0 {
			t.Errorf("calls with VM name %q ran VBoxManage %d times (first %q); want none", name, len(c), c[0].Argv)
		}
	}
	for _, p := range []string{"", "relative", "-rf", "/tmp/a\x00b", "/tmp/a\nb", "/tmp/\xff"} {
		e.resetLog()
		if _, err := d.FileRead(ctx, "off", p, 10); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("FileRead(off, %q) = %v; want %v", p, err, hypervisor.ErrInvalidArgument)
		}
		if err := d.FileWrite(ctx, "off", p, []byte("x"), 0); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("FileWrite(off, %q) = %v; want %v", p, err, hypervisor.ErrInvalidArgument)
		}
		if p != "" { // an empty Cwd means the default
			if _, err := d.Run(ctx, "off", hypervisor.ExecRequest{Argv: []string{"/bin/true"}, Cwd: p}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
				t.Errorf("Run(off, cwd %q) = %v; want %v", p, err, hypervisor.ErrInvalidArgument)
			}
		}
		if c := e.calls(t); len(c) != 0 {
			t.Errorf("calls with path %q ran VBoxManage %d times (first %q); want none", p, len(c), c[0].Argv)
		}
	}
	for _, argv := range [][]string{{"-x"}, {"/bin/echo\x00"}, {"/bin/echo", "a\x00b"}, {"/bin/\n"}} {
		e.resetLog()
		if _, err := d.Run(ctx, "off", hypervisor.ExecRequest{Argv: argv}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("Run(off, %q) = %v; want %v", argv, err, hypervisor.ErrInvalidArgument)
		}
		if c := e.calls(t); len(c) != 0 {
			t.Errorf("Run(off, %q) ran VBoxManage %d times; want none", argv, len(c))
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	bin := emulatorBinary(t)
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("x\n"), 0o600)
	good := Config{VBoxManage: bin, Username: "u", PasswordFile: pw, Logger: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"missing VBoxManage", func(c *Config) { c.VBoxManage = filepath.Join(dir, "nope") }},
		{"no username", func(c *Config) { c.Username = "" }},
		{"username as option", func(c *Config) { c.Username = "--password" }},
		{"username with newline", func(c *Config) { c.Username = "u\nv" }},
		{"no password file", func(c *Config) { c.PasswordFile = "" }},
		{"missing password file", func(c *Config) { c.PasswordFile = filepath.Join(dir, "nope") }},
		{"password file as option", func(c *Config) { c.PasswordFile = "-x" }},
		{"relative guest temp dir", func(c *Config) { c.GuestTempDir = "tmp" }},
		{"negative exec timeout", func(c *Config) { c.ExecTimeout = -time.Second }},
	} {
		cfg := good
		tc.mod(&cfg)
		if d, err := New(cfg); err == nil {
			d.Close()
			t.Errorf("New(%s) = nil error; want a config error", tc.name)
		}
	}
	if d, err := New(good); err != nil {
		t.Errorf("New(good) = %v; want nil", err)
	} else {
		d.Close()
	}
}

// TestWrongPassword: the guest refuses the logon; the driver reports
// VBoxManage's message.
func TestWrongPassword(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	e := newEmulator(t, emuVM{Name: "t1", UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0001", State: "running", QGASocket: t1.QGASocket})
	if err := os.WriteFile(e.passwordFile, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := e.driver(t)
	_, err := d.Run(ctxT(t), "t1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
	if err == nil || !strings.Contains(err.Error(), "was not able to logon on guest") {
		t.Errorf("Run() with a wrong password = %v; want VBoxManage's logon error", err)
	}
}

func TestParseListVMs(t *testing.T) {
	out := "\"t1\" {6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0001}\n\"my \\\"vm\\\" {x}\" {6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0002}\n\n"
	got, err := ParseListVMs([]byte(out))
	want := []string{"t1", `my \"vm\" {x}`}
	if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("ParseListVMs(%q) = %q, %v; want %q", out, got, err, want)
	}
	for _, bad := range []string{"t1 {uuid}\n", "\"t1\"\n", "<inaccessible>\n"} {
		if got, err := ParseListVMs([]byte(bad)); err == nil {
			t.Errorf("ParseListVMs(%q) = %q, nil; want an error", bad, got)
		}
	}
}

func TestParseMachineReadable(t *testing.T) {
	out := "name=\"t1\"\nVMState=\"running\"\nGuestAdditionsRunLevel=2\n\"storagecontrollername0\"=\"SATA\"\n"
	kv := ParseMachineReadable([]byte(out))
	for k, want := range map[string]string{"name": "t1", "VMState": "running", "GuestAdditionsRunLevel": "2", "storagecontrollername0": "SATA"} {
		if kv[k] != want {
			t.Errorf("ParseMachineReadable()[%q] = %q; want %q", k, kv[k], want)
		}
	}
}

func TestMappedExit(t *testing.T) {
	for guest, want := range map[int]int{0: 0, 1: 33, 7: 39, 93: 125, 94: 126, 255: 126} {
		if got := mappedExit(guest); got != want {
			t.Errorf("mappedExit(%d) = %d; want %d", guest, got, want)
		}
	}
}

// TestVerboseStdout feeds `run --verbose` output in small pieces and checks
// the pid, the guest's output (capped) and the trailer.
func TestVerboseStdout(t *testing.T) {
	pre := "Creating guest session as user 'vagrant'...\nWaiting for guest session to start...\nSuccessfully started guest session (ID 1)\nStarting guest process ...\nProcess '/bin/sh' (PID 4242) started\n"
	for _, tc := range []struct {
		name, guest, trailer string
		limit                int64
		wantOut              string
		wantTrunc            bool
		want                 outcome
	}{
		{"exit 0", "hello\n", "Process terminated\nExit code=0 (Status=500 [successfully terminated])\nClosing guest session ...\n", 100, "hello\n", false, outcome{ok: true, status: 500}},
		{"no newline", "abc", "Process terminated\nExit code=255 (Status=500 [successfully terminated])\nClosing guest session ...\n", 100, "abc", false, outcome{ok: true, status: 500, code: 255}},
		{"signal", "", "Process terminated\nExit code=9 (Status=510 [terminated by signal])\nClosing guest session ...\n", 100, "", false, outcome{ok: true, status: 510, code: 9}},
		{"capped", strings.Repeat("z", 5000), "Process terminated\nExit code=0 (Status=500 [successfully terminated])\n", 1000, strings.Repeat("z", 1000), true, outcome{ok: true, status: 500}},
		{"timeout", "partial\n", "Process timed out (guest side) and was terminated\nClosing guest session ...\n", 100, "partial\n", false, outcome{ok: true, timedOut: true}},
		{"guest prints a fake trailer first", "Exit code=3 (Status=500 [successfully terminated])\nmore\n", "Process terminated\nExit code=0 (Status=500 [successfully terminated])\n", 1000, "Exit code=3 (Status=500 [successfully terminated])\nmore\n", false, outcome{ok: true, status: 500}},
		{"no trailer", "cut", "", 100, "cut", false, outcome{}},
	} {
		v := newVerboseStdout(tc.limit)
		all := pre + tc.guest + tc.trailer
		for i := 0; i < len(all); i += 7 {
			v.Write([]byte(all[i:min(len(all), i+7)]))
		}
		if v.PID() != 4242 {
			t.Errorf("%s: PID() = %d; want 4242", tc.name, v.PID())
		}
		out, trunc, o := v.finish()
		if string(out) != tc.wantOut || trunc != tc.wantTrunc || o != tc.want {
			t.Errorf("%s: finish() = %q, %v, %+v; want %q, %v, %+v", tc.name, out, trunc, o, tc.wantOut, tc.wantTrunc, tc.want)
		}
	}
}

// TestGolden checks the VBoxManage argv the driver runs, and the
// emulator's output for them, against testdata/golden.txtar.
func TestGolden(t *testing.T) {
	e := newEmulator(t,
		emuVM{Name: "off", UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0003", State: "poweroff"},
	)
	d := e.driver(t)
	ctx := ctxT(t)
	if vms, err := d.ListVMs(ctx); err != nil || len(vms) != 1 || vms[0].State != hypervisor.StateStopped {
		t.Fatalf("ListVMs() = %+v, %v; want off, stopped", vms, err)
	}
	if err := d.Power(ctx, "off", hypervisor.PowerStart); err != nil {
		t.Fatalf("Power(off, start) = %v", err)
	}
	if st, err := d.Status(ctx, "off"); err != nil || st.State != hypervisor.StateRunning || st.AgentConnected {
		t.Fatalf("Status(off) = %+v, %v; want running, no agent", st, err)
	}
	if err := d.Power(ctx, "off", hypervisor.PowerStart); err == nil || !strings.Contains(err.Error(), "already locked") {
		t.Fatalf("Power(off, start) twice = %v; want VBoxManage's 'already locked'", err)
	}
	if err := d.Power(ctx, "off", hypervisor.PowerStop); err != nil {
		t.Fatalf("Power(off, stop) = %v", err)
	}
	if _, err := d.Run(ctx, "off", hypervisor.ExecRequest{Argv: []string{"/bin/echo", "x"}}); !errors.Is(err, hypervisor.ErrVMNotRunning) {
		t.Fatalf("Run(off) on a stopped VM = %v; want %v", err, hypervisor.ErrVMNotRunning)
	}
	if _, err := d.Status(ctx, "gone"); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Fatalf("Status(gone) = %v; want %v", err, hypervisor.ErrUnknownVM)
	}

	var got []txtarFile
	for i, c := range e.calls(t) {
		argv := strings.ReplaceAll(strings.Join(quoteAll(c.Argv), " "), e.dir, "$DIR")
		n := fmt.Sprintf("%02d", i+1)
		got = append(got,
			txtarFile{n + ".argv", argv + "\n"},
			txtarFile{n + ".stdout", c.Stdout},
			txtarFile{n + ".stderr", c.Stderr},
			txtarFile{n + ".exit", fmt.Sprintf("%d\n", c.Code)})
	}
	const golden = "testdata/golden.txtar"
	comment := "VBoxManage invocations of TestGolden: argv (quoted, the test's temp dir as $DIR), stdout, stderr, exit code.\nRegenerate with go test -run TestGolden -update.\n"
	if *update {
		if err := os.WriteFile(golden, []byte(formatTxtar(comment, got)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("reading %s: %v (run with -update to create it)", golden, err)
	}
	want := parseTxtar(string(raw))
	if len(want) != len(got) {
		t.Errorf("transcript has %d sections; want %d", len(got), len(want))
	}
	for i := range min(len(want), len(got)) {
		if want[i] != got[i] {
			t.Errorf("section %d = %q:\n%s\nwant %q:\n%s", i, got[i].Name, got[i].Data, want[i].Name, want[i].Data)
		}
	}
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, a := range s {
		b, _ := json.Marshal(a)
		out[i] = string(b)
	}
	return out
}

// --- a tiny txtar reader and writer (golang.org/x/tools/txtar is not a dependency) ---

type txtarFile struct {
	Name string
	Data string
}

// parseTxtar splits data into its "-- name --" sections. A section's data
// is every line up to the next marker, each with its newline.
func parseTxtar(data string) []txtarFile {
	var files []txtarFile
	cur := -1
	for _, line := range strings.SplitAfter(data, "\n") {
		trimmed := strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(trimmed, "-- ") && strings.HasSuffix(trimmed, " --") && len(trimmed) > 6 {
			files = append(files, txtarFile{Name: strings.TrimSpace(trimmed[3 : len(trimmed)-3])})
			cur = len(files) - 1
			continue
		}
		if cur >= 0 {
			files[cur].Data += line
		}
	}
	return files
}

func formatTxtar(comment string, files []txtarFile) string {
	var sb strings.Builder
	sb.WriteString(comment)
	for _, f := range files {
		fmt.Fprintf(&sb, "-- %s --\n%s", f.Name, f.Data)
	}
	return sb.String()
}
