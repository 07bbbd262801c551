package packaging

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/vmgate/vmgate/config"
	_ "github.com/vmgate/vmgate/plugins/qemu" // the lab backend's driver
)

// TestDefaultConfig: the installed vmgate.yaml is a valid config with the
// state directory the unit's StateDirectory makes, grant "local" on the
// built-in policy, and the address the unit serves on.
func TestDefaultConfig(t *testing.T) {
	c, err := config.Load("vmgate.yaml", "/nonexistent")
	if err != nil {
		t.Fatalf("config.Load(vmgate.yaml) = %v", err)
	}
	if c.StateDir != "/var/lib/vmgate" {
		t.Errorf("state_dir = %q; want /var/lib/vmgate (StateDirectory=vmgate)", c.StateDir)
	}
	if len(c.Grants) != 1 || c.Grants[0].Name != "local" || c.Grants[0].Policy != config.BuiltinPolicy {
		t.Errorf("grants = %+v; want only local with %s", c.Grants, config.BuiltinPolicy)
	}
	unit := readUnit(t)
	exec := unit["ExecStart"]
	if len(exec) != 1 || !strings.Contains(exec[0], " serve --config @SYSCONFDIR@/vmgate/vmgate.yaml --http "+c.HTTP.Addr) {
		t.Errorf("ExecStart = %q; want serve with the installed config over HTTP on http.addr %q", exec, c.HTTP.Addr)
	}
}

// readUnit parses vmgate.service.in into key → values (comments dropped).
func readUnit(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("vmgate.service.in")
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			unit[k] = append(unit[k], v)
		}
	}
	return unit
}

// TestUnitHardening: the unit keeps the hardening README promises, and
// leaves off what QEMU's TCG cannot run under.
func TestUnitHardening(t *testing.T) {
	unit := readUnit(t)
	want := map[string]string{
		"ProtectSystem":           "strict",
		"StateDirectory":          "vmgate",
		"StateDirectoryMode":      "0700",
		"NoNewPrivileges":         "yes",
		"PrivateTmp":              "yes",
		"ProtectHome":             "yes",
		"CapabilityBoundingSet":   "",
		"RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
		"ProtectKernelModules":    "yes",
		"ProtectControlGroups":    "yes",
		"WantedBy":                "multi-user.target",
	}
	for k, v := range want {
		if got := unit[k]; !slices.Equal(got, []string{v}) {
			t.Errorf("vmgate.service %s = %q; want %q", k, got, v)
		}
	}
	if _, ok := unit["MemoryDenyWriteExecute"]; ok {
		t.Errorf("vmgate.service sets MemoryDenyWriteExecute; QEMU's TCG (a child of vmgate) writes the code it runs")
	}
}

// TestDebContents: the package ships every file install lays out under
// PREFIX=/usr, the config as a conffile, and maintainer scripts that are
// there.
func TestDebContents(t *testing.T) {
	b, err := os.ReadFile("nfpm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Version  string `yaml:"version"`
		Contents []struct {
			Src, Dst, Type string
		} `yaml:"contents"`
		Scripts map[string]string `yaml:"scripts"`
	}
	if err := yaml.Unmarshal(b, &pkg); err != nil {
		t.Fatalf("nfpm.yaml: %v", err)
	}
	types := map[string]string{}
	for _, c := range pkg.Contents {
		if c.Src != strings.TrimPrefix(c.Dst, "/") {
			t.Errorf("nfpm.yaml: %s comes from %s; want the staging tree's %s", c.Dst, c.Src, strings.TrimPrefix(c.Dst, "/"))
		}
		types[c.Dst] = c.Type
	}
	want := map[string]string{
		"/usr/bin/vmgate":                          "",
		"/usr/lib/vmgate/vmgate-guest-linux-amd64": "",
		"/usr/lib/vmgate/vmgate-guest-linux-arm64": "",
		"/usr/lib/systemd/system/vmgate.service":   "",
		"/etc/vmgate/vmgate.yaml":                  "config|noreplace",
	}
	for dst, typ := range want {
		if got, ok := types[dst]; !ok || got != typ {
			t.Errorf("nfpm.yaml: %s type %q (listed %v); want listed, type %q", dst, got, ok, typ)
		}
	}
	if len(types) != len(want) {
		t.Errorf("nfpm.yaml lists %d files; want %d", len(types), len(want))
	}
	script := regexp.MustCompile(`^\.scripts/(postinst|prerm|postrm)$`)
	for k, p := range pkg.Scripts {
		m := script.FindStringSubmatch(p)
		if m == nil {
			t.Errorf("nfpm.yaml: script %s = %q; want .scripts/<name> (the Makefile copies packaging/<name> there)", k, p)
			continue
		}
		if st, err := os.Stat(m[1]); err != nil || st.Mode().Perm()&0o111 == 0 {
			t.Errorf("packaging/%s: %v, %v; want an executable script", m[1], st, err)
		}
	}
}
