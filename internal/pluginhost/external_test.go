package pluginhost

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

// buildFakePlugin builds testdata/fakeplugin into dir under each of names
// (as vmgate-plugin-NAME) and returns dir.
func buildFakePlugin(t *testing.T, names ...string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(t.TempDir(), "fakeplugin")
	cmd := exec.Command(goBin, "build", "-o", bin, "./testdata/fakeplugin")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build fakeplugin: %v\n%s", err, out)
	}
	for _, n := range names {
		if err := os.Link(bin, filepath.Join(dir, ExternalPrefix+n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestExternalPlugins(t *testing.T) {
	dir := buildFakePlugin(t, "fake", "badcookie", "badversion", "grpconly")
	// Not plugins: a non-executable file and a file without the prefix.
	for name, mode := range map[string]os.FileMode{ExternalPrefix + "readme": 0o644, "fake": 0o755} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	names, err := Discover(dir)
	if want := []string{"badcookie", "badversion", "fake", "grpconly"}; err != nil || !reflect.DeepEqual(names, want) {
		t.Errorf("Discover() = %v, %v; want %v", names, err, want)
	}

	h, logs := newTestHost(t, Options{PluginDir: dir, StartTimeout: 20 * time.Second})
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("serves", func(t *testing.T) {
		d, err := h.Launch(ctx, Spec{Driver: "fake", Config: []byte(`{"vms":["ext1","ext2"]}`)})
		if err != nil {
			t.Fatalf("Launch(fake) = %v", err)
		}
		vms, err := d.ListVMs(ctx)
		want := []hypervisor.VM{
			{Name: "ext1", State: hypervisor.StateRunning, Info: "external fake"},
			{Name: "ext2", State: hypervisor.StateRunning, Info: "external fake"},
		}
		if err != nil || !reflect.DeepEqual(vms, want) {
			t.Errorf("ListVMs() = %+v, %v; want %+v", vms, err, want)
		}
		if _, err := d.Status(ctx, "ext1"); !errors.Is(err, hypervisor.ErrNotSupported) {
			t.Errorf("Status() on a fake without StatusFunc = %v; want ErrNotSupported", err)
		}
	})
	// Both transports: the call socket, and gRPC for a plugin without one.
	for _, tt := range []struct{ driver, transport string }{{"fake", `transport="call socket"`}, {"grpconly", `transport=grpc`}} {
		t.Run("transport "+tt.driver, func(t *testing.T) {
			d, err := h.Launch(ctx, Spec{Driver: tt.driver, Config: []byte(`{"vms":["x"]}`)})
			if err != nil {
				t.Fatalf("Launch(%s) = %v", tt.driver, err)
			}
			if vms, err := d.ListVMs(ctx); err != nil || len(vms) != 1 || vms[0].Name != "x" {
				t.Errorf("ListVMs() = %+v, %v; want [x]", vms, err)
			}
			want := `msg="driver plugin started" driver=` + tt.driver
			found := false
			for _, line := range strings.Split(logs.String(), "\n") {
				found = found || strings.Contains(line, want) && strings.Contains(line, tt.transport)
			}
			if !found {
				t.Errorf("no log line says %s started with %s:\n%s", tt.driver, tt.transport, logs.String())
			}
		})
	}
	t.Run("config refused", func(t *testing.T) {
		_, err := h.Launch(ctx, Spec{Driver: "fake", Config: []byte(`{"vms":["a"],"surprise":true}`)})
		if !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("Launch(fake, unknown field) = %v; want ErrInvalidArgument", err)
		}
	})
	for _, tt := range []struct{ driver, says string }{
		{"badcookie", "This binary is a plugin"},
		{"badversion", "incompatible API version"},
	} {
		t.Run(tt.driver, func(t *testing.T) {
			d, err := h.Launch(ctx, Spec{Driver: tt.driver, Config: []byte(`{"vms":["x"]}`)})
			if !errors.Is(err, ErrHandshake) {
				t.Fatalf("Launch(%s) = %v, %v; want ErrHandshake", tt.driver, d, err)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Errorf("Launch(%s) error %q does not say %q", tt.driver, err, tt.says)
			}
			found := false
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "level=ERROR") && strings.Contains(line, "handshake failed") &&
					strings.Contains(line, ExternalPrefix+tt.driver) {
					found = true
				}
			}
			if !found {
				t.Errorf("no ERROR log line says the handshake of %s failed:\n%s", tt.driver, logs.String())
			}
		})
	}
}
