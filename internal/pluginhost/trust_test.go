package pluginhost

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testload"
)

// nobody is the uid of the user "nobody" on Debian: an owner vmgate must not trust.
const nobody = 65534

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chown to nobody needs root (the tests run as root in CI)")
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, mode); err != nil {
		t.Fatal(err)
	}
}

// pluginTree is base/up/plugins/vmgate-plugin-fake (a copy of the fake
// plugin, so chown and chmod touch it alone) and base/elsewhere/real-plugin.
type pluginTree struct {
	base, up, dir, plugin, elsewhere string
}

func newPluginTree(t *testing.T, fake string) pluginTree {
	t.Helper()
	base := t.TempDir()
	tr := pluginTree{base: base, up: filepath.Join(base, "up"), elsewhere: filepath.Join(base, "elsewhere")}
	tr.dir = filepath.Join(tr.up, "plugins")
	tr.plugin = filepath.Join(tr.dir, ExternalPrefix+"fake")
	for _, d := range []string{tr.dir, tr.elsewhere} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{base, tr.up, tr.dir, tr.elsewhere} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, fake, tr.plugin, 0o755)
	return tr
}

// TestPluginTrust: a plugin runs only when it, plugin_dir and every
// directory above belong to root (or vmgate's user) and nobody else can
// write them (a sticky directory above plugin_dir excepted); otherwise
// Launch stops, naming the file or directory, its owner and mode, and
// Discover leaves the plugin out.
func TestPluginTrust(t *testing.T) {
	requireRoot(t)
	fake := filepath.Join(buildFakePlugin(t, "fake"), ExternalPrefix+"fake")
	chown := func(p string) error { return os.Lchown(p, nobody, nobody) }
	tests := []struct {
		name  string
		spoil func(tr pluginTree) error
		says  []string // nil: trusted; PLUGIN, DIR, UP, ELSEWHERE are replaced
		want  error    // the refusal; nil: ErrUntrustedPlugin
	}{
		{name: "trusted", spoil: func(pluginTree) error { return nil }},
		{name: "plugin owned by nobody", spoil: func(tr pluginTree) error { return chown(tr.plugin) },
			says: []string{"plugin PLUGIN (owner uid 65534 (nobody), mode 0755) is owned by neither root nor vmgate's user", "chown root PLUGIN"}},
		{name: "plugin group writable", spoil: func(tr pluginTree) error { return os.Chmod(tr.plugin, 0o775) },
			says: []string{"plugin PLUGIN (owner uid 0 (root), mode 0775) is writable by its group", "chmod go-w PLUGIN"}},
		{name: "plugin world writable", spoil: func(tr pluginTree) error { return os.Chmod(tr.plugin, 0o757) },
			says: []string{"(owner uid 0 (root), mode 0757) is writable by everyone"}},
		{name: "plugin not executable", spoil: func(tr pluginTree) error { return os.Chmod(tr.plugin, 0o644) },
			says: []string{"plugin PLUGIN is not executable (mode 0644)"}, want: ErrUnknownDriver},
		{name: "plugin a directory", spoil: func(tr pluginTree) error {
			if err := os.Remove(tr.plugin); err != nil {
				return err
			}
			return os.Mkdir(tr.plugin, 0o755)
		}, says: []string{"plugin PLUGIN is not a regular file"}, want: ErrUnknownDriver},
		{name: "plugin_dir owned by nobody", spoil: func(tr pluginTree) error { return chown(tr.dir) },
			says: []string{"plugin directory DIR (owner uid 65534 (nobody), mode 0755) is owned by neither root nor vmgate's user", "chown root DIR"}},
		{name: "plugin_dir group writable", spoil: func(tr pluginTree) error { return os.Chmod(tr.dir, 0o775) },
			says: []string{"plugin directory DIR (owner uid 0 (root), mode 0775) is writable by its group", "chmod go-w DIR"}},
		{name: "plugin_dir sticky and world writable", spoil: func(tr pluginTree) error { return os.Chmod(tr.dir, os.ModeSticky|0o777) },
			says: []string{"plugin directory DIR (owner uid 0 (root), mode 1777) is writable by its group and everyone"}},
		{name: "ancestor group writable", spoil: func(tr pluginTree) error { return os.Chmod(tr.up, 0o775) },
			says: []string{"directory UP on the path to plugin PLUGIN (owner uid 0 (root), mode 0775) is writable by its group", "chmod go-w UP"}},
		{name: "ancestor owned by nobody", spoil: func(tr pluginTree) error { return chown(tr.up) },
			says: []string{"directory UP on the path to plugin PLUGIN (owner uid 65534 (nobody), mode 0755) is owned by neither"}},
		{name: "ancestor sticky and world writable, as /tmp", spoil: func(tr pluginTree) error { return os.Chmod(tr.up, os.ModeSticky|0o777) }},
		{name: "plugin a symlink to a trusted file", spoil: func(tr pluginTree) error {
			real := filepath.Join(tr.elsewhere, "real-plugin")
			if err := os.Rename(tr.plugin, real); err != nil {
				return err
			}
			return os.Symlink(real, tr.plugin)
		}},
		{name: "plugin a symlink to a file of nobody's", spoil: func(tr pluginTree) error {
			real := filepath.Join(tr.elsewhere, "real-plugin")
			if err := os.Rename(tr.plugin, real); err != nil {
				return err
			}
			if err := chown(real); err != nil {
				return err
			}
			return os.Symlink(real, tr.plugin)
		}, says: []string{"plugin PLUGIN (ELSEWHERE/real-plugin) (owner uid 65534 (nobody), mode 0755)", "chown root ELSEWHERE/real-plugin"}},
		{name: "plugin a symlink into a group-writable directory", spoil: func(tr pluginTree) error {
			real := filepath.Join(tr.elsewhere, "real-plugin")
			if err := os.Rename(tr.plugin, real); err != nil {
				return err
			}
			if err := os.Chmod(tr.elsewhere, 0o775); err != nil {
				return err
			}
			return os.Symlink(real, tr.plugin)
		}, says: []string{"plugin directory ELSEWHERE (owner uid 0 (root), mode 0775) is writable by its group"}},
	}
	ctx, cancel := testload.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newPluginTree(t, fake)
			if err := tt.spoil(tr); err != nil {
				t.Fatal(err)
			}
			h, _ := newTestHost(t, Options{PluginDir: tr.dir, StartTimeout: 20 * time.Second})
			d, err := h.Launch(ctx, Spec{Driver: "fake", Config: []byte(`{"vms":["x"]}`)})
			names, derr := Discover(tr.dir)
			if derr != nil {
				t.Fatalf("Discover(%s) = %v", tr.dir, derr)
			}
			if tt.says == nil {
				if err != nil {
					t.Fatalf("Launch(%s) = %v; want it running", tt.name, err)
				}
				if vms, err := d.ListVMs(ctx); err != nil || len(vms) != 1 {
					t.Errorf("ListVMs() = %v, %v; want [x]", vms, err)
				}
				if !slices.Equal(names, []string{"fake"}) {
					t.Errorf("Discover() = %v; want [fake]", names)
				}
				return
			}
			want := tt.want
			if want == nil {
				want = ErrUntrustedPlugin
			}
			if !errors.Is(err, want) {
				t.Fatalf("Launch(%s) = %v, %v; want %v", tt.name, d, err, want)
			}
			r := strings.NewReplacer("PLUGIN", tr.plugin, "DIR", tr.dir, "UP", tr.up, "ELSEWHERE", tr.elsewhere)
			for _, s := range tt.says {
				if s = r.Replace(s); !strings.Contains(err.Error(), s) {
					t.Errorf("Launch(%s) = %q; want it to say %q", tt.name, err, s)
				}
			}
			if len(names) != 0 {
				t.Errorf("Discover() = %v; want the untrusted plugin left out", names)
			}
		})
	}
}

// TestPluginRunsFromTheCheckedFile: the plugin that runs is the file the
// check opened, not whatever has been renamed into its place since.
func TestPluginRunsFromTheCheckedFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	plugin := filepath.Join(dir, ExternalPrefix+"swap")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\necho checked \"$0\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := openTrusted(plugin)
	if err != nil {
		t.Fatalf("openTrusted(%s) = %v", plugin, err)
	}
	defer exe.Close()
	// The swap: another file takes the plugin's name after the check.
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("#!/bin/sh\necho swapped\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, plugin); err != nil {
		t.Fatal(err)
	}
	r, err := newProcRunner(plugin, nil, os.Environ(), exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	out, _ := io.ReadAll(r.Stdout())
	if err := r.Wait(context.Background()); err != nil {
		t.Fatalf("Wait() = %v", err)
	}
	if !bytes.HasPrefix(out, []byte("checked ")) {
		t.Errorf("the plugin printed %q; want the checked file's %q", out, "checked …")
	}
	if r.Name() != plugin {
		t.Errorf("Name() = %q; want the plugin's path %q", r.Name(), plugin)
	}
}
