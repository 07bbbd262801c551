package proxmox

import (
	"bytes"
	"context"
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
	"github.com/vmgate/vmgate/internal/pveemu"
	"github.com/vmgate/vmgate/internal/testload"
)

var update = flag.Bool("update", false, "rewrite testdata/*.txtar from this run")

// The test binary is also the plugin: `<test binary> plugin proxmox` serves
// the registered driver over go-plugin, as `vmgate plugin proxmox` would.
func TestMain(m *testing.M) {
	if len(os.Args) >= 3 && os.Args[1] == "plugin" {
		if err := pluginhost.ServeBuiltin(pluginhost.Registered(), os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(labtest.Main(m,
		lab.Spec{Name: "t1"},
		lab.Spec{Name: "noexec", Cmdline: map[string]string{"QGA_BLOCK": "guest-exec"}},
	))
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newDriver(t *testing.T, cfg Config) *Driver {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) = %v; want nil", cfg, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := testload.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// labVMs are the conformance VMs: vmid 101 is a normal guest, 102 a stopped
// VM without a QEMU, 103 a guest with guest-exec blocked.
func labVMs(t *testing.T) []pveemu.VMSpec {
	t1 := labtest.VM(t, "t1")
	noexec := labtest.VM(t, "noexec")
	return []pveemu.VMSpec{
		{VMID: 101, Node: "pve", Name: "t1", Machine: pveemu.NewLabMachine(t1)},
		{VMID: 102, Node: "pve-2", Name: "off"},
		{VMID: 103, Node: "pve-2", Name: "noexec", Machine: pveemu.NewLabMachine(noexec)},
	}
}

// TestConformance runs the shared driver suite in this process against the
// newest emulated version (TestConformancePlugin runs it for every version
// through the plugin boundary).
func TestConformance(t *testing.T) {
	e := startEmu(t, pveemu.PVE92(), nil, labVMs(t)...)
	d := newDriver(t, e.cfg)
	hypervisortest.Run(t, hypervisortest.Harness{Driver: d, VM: "101", NoExecVM: "103", UnknownVM: "999",
		Capabilities: pveCapabilities, DiskDir: "/data"})
}

// pveCapabilities are the driver's optional capabilities, the same on every
// version: snapshots (snapshot.go), the guest's interfaces (network.go),
// the hypervisor's figures (metrics.go), the screen, keys and serial
// console (screen.go, console.go).
var pveCapabilities = hypervisor.Capabilities{Snapshots: true, GuestNetwork: true, Metrics: true, Create: true,
	Screenshot: true, SendKeys: true, ConsoleRead: true, ConsoleWrite: true}

func TestParseVMID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{{"100", 100}, {"101", 101}, {"999999999", 999999999}} {
		if got, err := ParseVMID(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseVMID(%q) = %d, %v; want %d, nil", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "99", "0", "-1", "+101", "0101", "1000000000", "101 ", " 101", "1 OR 1",
		"../101", "101/../102", "%2e", "101%2F", "１０１", "10\x001", "101\n", "1e3", "0x65", "9999999999999999999999"} {
		if got, err := ParseVMID(in); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("ParseVMID(%q) = %d, %v; want %v", in, got, err, hypervisor.ErrInvalidArgument)
		}
	}
}

func TestCheckNode(t *testing.T) {
	for _, in := range []string{"pve", "pve-2", "n1", "A", strings.Repeat("a", 63)} {
		if err := CheckNode(in); err != nil {
			t.Errorf("CheckNode(%q) = %v; want nil", in, err)
		}
	}
	for _, in := range []string{"", "../etc", "..", "%2e", "pve/../x", "pve?x=1", "pve#", "-pve", "pve-", "pve.example",
		"pve 2", "1 OR 1", "ñode", "pve\x00", "pve\n", strings.Repeat("a", 64)} {
		if err := CheckNode(in); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("CheckNode(%q) = %v; want %v", in, err, hypervisor.ErrInvalidArgument)
		}
	}
}

// TestHostileNames: a name that is not a vmid is refused before any
// request, and a cluster resource with a hostile node name never reaches a URL.
func TestHostileNames(t *testing.T) {
	e := startEmu(t, pveemu.PVE92(), nil, pveemu.VMSpec{VMID: 102, Node: "pve", Name: "off"},
		pveemu.VMSpec{VMID: 104, Node: "../../../cluster", Name: "evil", Running: true},
		pveemu.VMSpec{VMID: 105, Node: "pve%2f..", Name: "evil2", Running: true})
	d := newDriver(t, e.cfg)
	ctx := ctxT(t)
	for _, name := range []string{"", "../102", "%2e%2e", "1 OR 1", "-1", "102/../103", "１０２", "102\x00", "102\n", "99", "0102"} {
		e.ResetTranscript()
		calls := map[string]error{}
		_, calls["Status"] = d.Status(ctx, name)
		_, calls["AgentInfo"] = d.AgentInfo(ctx, name)
		_, calls["ExecStart"] = d.ExecStart(ctx, name, hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
		_, calls["FileRead"] = d.FileRead(ctx, name, "/etc/hostname", 10)
		calls["FileWrite"] = d.FileWrite(ctx, name, "/tmp/x", []byte("x"), 0)
		calls["Power"] = d.Power(ctx, name, hypervisor.PowerStart)
		for op, err := range calls {
			if !errors.Is(err, hypervisor.ErrUnknownVM) || !errors.Is(err, hypervisor.ErrInvalidArgument) {
				t.Errorf("%s(%q) = %v; want %v and %v", op, name, err, hypervisor.ErrUnknownVM, hypervisor.ErrInvalidArgument)
			}
		}
		if log := e.Transcript(); len(log) != 0 {
			t.Errorf("calls with name %q sent %d requests (first %q); want none", name, len(log), log[0].Request)
		}
	}
	vms, err := d.ListVMs(ctx)
	if err != nil {
		t.Fatalf("ListVMs() = %v", err)
	}
	if len(vms) != 1 || vms[0].Name != "102" {
		t.Errorf("ListVMs() = %+v; want only 102 (hostile node names skipped)", vms)
	}
	e.ResetTranscript()
	for _, name := range []string{"104", "105"} {
		if _, err := d.Status(ctx, name); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("Status(%q) on a hostile node = %v; want %v", name, err, hypervisor.ErrUnknownVM)
		}
	}
	for _, x := range e.Transcript() {
		if x.Request != "GET /api2/json/cluster/resources" {
			t.Errorf("request %q sent for a VM on a hostile node; want only cluster/resources", x.Request)
		}
	}
}

func TestBadToken(t *testing.T) {
	e := startEmu(t, pveemu.PVE84(), nil, pveemu.VMSpec{VMID: 102, Node: "pve", Name: "off"})
	cfg := e.cfg
	wrong := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrong, []byte("not-the-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.TokenSecretFile = wrong
	d := newDriver(t, cfg)
	_, err := d.ListVMs(ctxT(t))
	var ae *APIError
	if !errors.Is(err, ErrAuth) || !errors.As(err, &ae) || ae.StatusCode != 401 {
		t.Fatalf("ListVMs() with a wrong token = %v; want %v with HTTP 401", err, ErrAuth)
	}
	// A token with a wrong secret: "Authentication failed!" (pve-manager
	// PVE/HTTPServer.pm auth_handler), the status line of a body-less 401.
	if !strings.Contains(err.Error(), "Authentication failed!") || !errors.Is(err, hypervisor.ErrBackend) {
		t.Errorf("ListVMs() error %q; want %v with Proxmox's %q", err, hypervisor.ErrBackend, "Authentication failed!")
	}
	if strings.Contains(err.Error(), "not-the-secret") || strings.Contains(err.Error(), emuSecret) {
		t.Errorf("ListVMs() error %q holds a secret", err)
	}
}

func TestTLSVerification(t *testing.T) {
	e := startEmu(t, pveemu.PVE92(), nil, pveemu.VMSpec{VMID: 102, Node: "pve", Name: "off"})
	cfg := e.cfg
	cfg.CAFile = ""
	d := newDriver(t, cfg)
	if _, err := d.ListVMs(ctxT(t)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("ListVMs() without the CA = %v; want a certificate verification error", err)
	}

	var logBuf bytes.Buffer
	cfg.InsecureSkipVerify = true
	cfg.Logger = slog.New(slog.NewTextHandler(&logBuf, nil))
	d = newDriver(t, cfg)
	if _, err := d.ListVMs(ctxT(t)); err != nil {
		t.Errorf("ListVMs() with insecure_skip_verify = %v; want nil", err)
	}
	if !strings.Contains(logBuf.String(), "level=WARN") || !strings.Contains(logBuf.String(), "insecure_skip_verify") {
		t.Errorf("New() with InsecureSkipVerify logged %q; want a warning naming insecure_skip_verify", logBuf.String())
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("s3cret\n"), 0o600)
	twoLines := filepath.Join(dir, "two")
	os.WriteFile(twoLines, []byte("a\nb\n"), 0o600)
	notPEM := filepath.Join(dir, "ca.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	good := Config{URL: "https://pve.example:8006", TokenID: "root@pam!vmgate", TokenSecretFile: secret}
	for _, tc := range []struct {
		name string
		mod  func(c *Config)
	}{
		{"http url", func(c *Config) { c.URL = "http://pve.example:8006" }},
		{"no host", func(c *Config) { c.URL = "https://" }},
		{"credentials in url", func(c *Config) { c.URL = "https://u:p@pve.example" }},
		{"query in url", func(c *Config) { c.URL = "https://pve.example/?x=1" }},
		{"token without realm", func(c *Config) { c.TokenID = "root!vmgate" }},
		{"token without id", func(c *Config) { c.TokenID = "root@pam" }},
		{"token with =", func(c *Config) { c.TokenID = "root@pam!a=b" }},
		{"one-letter realm", func(c *Config) { c.TokenID = "root@p!vmgate" }},
		{"one-letter token", func(c *Config) { c.TokenID = "root@pam!v" }},
		{"user with a slash", func(c *Config) { c.TokenID = "ro/ot@pam!vmgate" }},
		{"no secret file", func(c *Config) { c.TokenSecretFile = "" }},
		{"missing secret file", func(c *Config) { c.TokenSecretFile = filepath.Join(dir, "nope") }},
		{"two-line secret", func(c *Config) { c.TokenSecretFile = twoLines }},
		{"ca without pem", func(c *Config) { c.CAFile = notPEM }},
		{"negative exec timeout", func(c *Config) { c.ExecTimeout = -time.Second }},
	} {
		cfg := good
		cfg.Logger = quietLogger()
		tc.mod(&cfg)
		if d, err := New(cfg); err == nil {
			d.Close()
			t.Errorf("New(%s) = nil error; want a config error", tc.name)
		}
	}
	cfg := good
	cfg.Logger = quietLogger()
	if d, err := New(cfg); err != nil {
		t.Errorf("New(good) = %v; want nil", err)
	} else {
		d.Close()
	}
}

func TestByteStrings(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	got, err := bytesString(byteString(all))
	if err != nil || !bytes.Equal(got, all) {
		t.Errorf("bytesString(byteString(0..255)) = %v, %v; want the 256 bytes back", got, err)
	}
	if _, err := bytesString("ok \u0100"); err == nil {
		t.Errorf("bytesString(%q) = nil error; want an error for a character above U+00FF", "ok \u0100")
	}
}

// TestGolden checks the driver's requests (and the emulator's answers)
// against testdata/golden.txtar, exchange by exchange: the access check of
// Open, the power tasks waited for, and a failed one.
func TestGolden(t *testing.T) {
	e := startEmu(t, pveemu.PVE92(), nil, pveemu.VMSpec{VMID: 102, Node: "pve", Name: "off"})
	ctx := ctxT(t)
	cfg := e.cfg
	cfg.Logger = quietLogger()
	d, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open() = %v", err)
	}
	t.Cleanup(func() { d.Close() })
	if _, err := d.ListVMs(ctx); err != nil {
		t.Fatalf("ListVMs() = %v", err)
	}
	if st, err := d.Status(ctx, "102"); err != nil || st.State != hypervisor.StateStopped {
		t.Fatalf("Status(102) = %+v, %v; want stopped", st, err)
	}
	if err := d.Power(ctx, "102", hypervisor.PowerStart); err != nil {
		t.Fatalf("Power(102, start) = %v", err)
	}
	if st, err := d.Status(ctx, "102"); err != nil || st.State != hypervisor.StateRunning || st.AgentConnected {
		t.Fatalf("Status(102) after start = %+v, %v; want running without an agent", st, err)
	}
	if _, err := d.AgentInfo(ctx, "102"); !errors.Is(err, hypervisor.ErrAgentUnavailable) {
		t.Fatalf("AgentInfo(102) = %v; want %v", err, hypervisor.ErrAgentUnavailable)
	}
	err = d.Power(ctx, "102", hypervisor.PowerStart)
	var te *TaskError
	if !errors.As(err, &te) || te.ExitStatus != "VM 102 already running" || !errors.Is(err, hypervisor.ErrBackend) {
		t.Fatalf("Power(102, start) twice = %v; want a %v naming the task's exit status %q", err, hypervisor.ErrBackend, "VM 102 already running")
	}
	if err := d.Power(ctx, "102", hypervisor.PowerStop); err != nil {
		t.Fatalf("Power(102, stop) = %v", err)
	}

	var got []txtarFile
	n := 0
	for _, x := range e.Transcript() {
		if strings.Contains(x.Response, `"status":"running"`) && strings.Contains(x.Request, "/tasks/") {
			continue // how often a running task is polled depends on timing
		}
		n++
		got = append(got, txtarFile{Name: itoa(n) + ".request", Data: normalizeUPIDs(x.Request) + "\n"},
			txtarFile{Name: itoa(n) + ".response", Data: normalizeUPIDs(x.Response) + "\n"})
	}
	const golden = "testdata/golden.txtar"
	comment := "Proxmox API exchanges of TestGolden: each request the driver sent and the emulator's answer\n(status line with Proxmox's message, then the body). Regenerate with go test -run TestGolden -update.\n"
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

var (
	upidTimesRE = regexp.MustCompile(`UPID:([^:]+):[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:`)
	taskNumsRE  = regexp.MustCompile(`"(pid|pstart|starttime|uptime)":\d+`)
)

// normalizeUPIDs replaces a task's pid, start and start time, which change
// from run to run.
func normalizeUPIDs(s string) string {
	s = upidTimesRE.ReplaceAllString(s, "UPID:$1:PID:PSTART:STARTTIME:")
	return taskNumsRE.ReplaceAllString(s, `"$1":N`)
}

func itoa(i int) string {
	if i < 10 {
		return "0" + string(rune('0'+i))
	}
	return string(rune('0'+i/10)) + string(rune('0'+i%10))
}

func TestAPIErrorMessage(t *testing.T) {
	for _, tc := range []struct {
		err  APIError
		want string
	}{
		{APIError{StatusCode: 500, Message: "boom"}, "HTTP 500: boom"},
		{APIError{StatusCode: 400, Message: "bad", Errors: map[string]string{"vmid": " not a number\n", "node": "unknown", "a": "x"}},
			"HTTP 400: bad; a: x; node: unknown; vmid: not a number"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("(%+v).Error() = %q; want %q", tc.err, got, tc.want)
		}
	}
}
