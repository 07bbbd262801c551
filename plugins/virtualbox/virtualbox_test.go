package virtualbox

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/internal/vboxemu"
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

// TestConformance runs the shared driver suite in process against the
// newest release (the plugin tests cover every release).
func TestConformance(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	noexec := labtest.VM(t, "noexec")
	e := newEmulator(t, "7.1", []*vboxemu.Machine{
		labMachine("t1", uuidT1, t1),
		machine("noexec", uuidNoExec, noexec.QGASocket, noexec.QMPSocket),
		machine("off", uuidOff, "", ""),
	}, func(w *vboxemu.World) {
		// As on a real host, a VM process ends a moment after poweroff
		// returns: the power and snapshot checks start VMs right after.
		w.VMProcessTeardownMS = 300
	})
	hypervisortest.Run(t, hypervisortest.Harness{Driver: e.driver(t), VM: "t1", NoExecVM: "noexec", Capabilities: vboxCapabilities,
		NetworkIPv4Only: true})
}

// TestHostileNames: names and paths VBoxManage could take for options or
// that break its output are refused before VBoxManage runs.
func TestHostileNames(t *testing.T) {
	e := newEmulator(t, "7.1", []*vboxemu.Machine{machine("off", uuidOff, "", "")})
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
	for _, p := range []string{"", "relative", "-rf", "/tmp/a\x00b", "/tmp/a\nb", "/tmp/\xff", "/tmp/dir/", "/tmp/..", "/tmp/.", "/"} {
		e.resetLog()
		if _, err := d.FileRead(ctx, "off", p, 10); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("FileRead(off, %q) = %v; want %v", p, err, hypervisor.ErrInvalidArgument)
		}
		if err := d.FileWrite(ctx, "off", p, []byte("x"), 0); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("FileWrite(off, %q) = %v; want %v", p, err, hypervisor.ErrInvalidArgument)
		}
		if p != "" && p != "/tmp/dir/" && p != "/tmp/.." && p != "/tmp/." && p != "/" { // an empty Cwd means the default; directories are fine
			if _, err := d.Run(ctx, "off", hypervisor.ExecRequest{Argv: []string{"/bin/true"}, Cwd: p}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
				t.Errorf("Run(off, cwd %q) = %v; want %v", p, err, hypervisor.ErrInvalidArgument)
			}
		}
		if c := e.calls(t); len(c) != 0 {
			t.Errorf("calls with path %q ran VBoxManage %d times (first %q); want none", p, len(c), c[0].Argv)
		}
	}
	for _, argv := range [][]string{{"-x"}, {"/bin/echo\x00"}, {"/bin/echo", "a\x00b"}, {"/bin/\n"}, {"/bin/echo", "\xff"}} {
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
		{"negative stdio block", func(c *Config) { c.StdioBlock = -1 }},
		{"huge stdio block", func(c *Config) { c.StdioBlock = 1 << 30 }},
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
	e := newEmulator(t, "7.1", []*vboxemu.Machine{machine("t1", uuidT1, t1.QGASocket, t1.QMPSocket)})
	if err := os.WriteFile(e.passwordFile, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := e.driver(t)
	_, err := d.Run(ctxT(t), "t1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
	if err == nil || !strings.Contains(err.Error(), "was not able to logon on guest") || !strings.Contains(err.Error(), "password_file") {
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
	if got, err := ParseListVMs([]byte("\"<inaccessible>\" {6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0009}\n\"t1\" {u}\n")); err != nil || strings.Join(got, "|") != "t1" {
		t.Errorf("ParseListVMs(inaccessible, t1) = %q, %v; want [t1]", got, err)
	}
	for _, bad := range []string{"t1 {uuid}\n", "\"t1\"\n", "<inaccessible>\n"} {
		if got, err := ParseListVMs([]byte(bad)); err == nil {
			t.Errorf("ParseListVMs(%q) = %q, nil; want an error", bad, got)
		}
	}
}

func TestParseMachineReadable(t *testing.T) {
	out := "name=\"t1 \\\"quoted\\\" back\\\\slash\"\nVMState=\"running\"\nGuestAdditionsRunLevel=2\n\"storagecontrollername0\"=\"SATA\"\n\"a=b\"=\"c\"\nGuestAdditionsFacility_VirtualBox System Service=50,1704067200000\n"
	kv := ParseMachineReadable([]byte(out))
	for k, want := range map[string]string{"name": `t1 "quoted" back\slash`, "VMState": "running", "GuestAdditionsRunLevel": "2", "storagecontrollername0": "SATA", "a=b": "c",
		"GuestAdditionsFacility_VirtualBox System Service": "50,1704067200000"} {
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

// TestGolden checks the VBoxManage argv the driver runs, and the
// emulator's output for them, against testdata/golden-<version>.txtar,
// for every release.
func TestGolden(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) { checkGolden(t, v) })
	}
}

func checkGolden(t *testing.T, version string) {
	e := newEmulator(t, version, []*vboxemu.Machine{machine("off", uuidOff, "", "")})
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
	if err := d.Power(ctx, "off", hypervisor.PowerStop); !errors.Is(err, hypervisor.ErrVMNotRunning) {
		t.Fatalf("Power(off, stop) of a stopped VM = %v; want %v", err, hypervisor.ErrVMNotRunning)
	}
	if _, err := d.Status(ctx, "gone"); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Fatalf("Status(gone) = %v; want %v", err, hypervisor.ErrUnknownVM)
	}
	// The temp dir and the time of a state change vary from run to run.
	stable := func(s string) string {
		return stateTime.ReplaceAllString(strings.ReplaceAll(s, e.dir, "$DIR"), `VMStateChangeTime="$$TIME"`)
	}
	var got []txtarFile
	for i, c := range e.calls(t) {
		n := fmt.Sprintf("%02d", i+1)
		got = append(got,
			txtarFile{n + ".argv", stable(strings.Join(quoteAll(c.Argv), " ")) + "\n"},
			txtarFile{n + ".stdout", stable(c.Stdout)},
			txtarFile{n + ".stderr", stable(c.Stderr)},
			txtarFile{n + ".exit", fmt.Sprintf("%d\n", c.Code)})
	}
	golden := "testdata/golden-" + version + ".txtar"
	comment := "VBoxManage " + version + " (emulated) invocations of TestGolden: argv (quoted, the test's temp dir as $DIR), stdout, stderr, exit code.\nRegenerate with go test -run TestGolden -update.\n"
	compareGolden(t, golden, comment, got)
}

var stateTime = regexp.MustCompile(`VMStateChangeTime="[^"]*"`)

// compareGolden checks got against the golden file (rewriting it with -update).
func compareGolden(t *testing.T, golden, comment string, got []txtarFile) {
	t.Helper()
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
