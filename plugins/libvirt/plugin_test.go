package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/internal/libvirttest"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/internal/testload"
)

// TestConformancePlugin runs the suite through the go-plugin boundary: the
// driver lives in a plugin process (this test binary, see TestMain) started
// by pluginhost, on the domains the package's private libvirtd already runs.
// It must run before TestPower (vm_test.go), which destroys vmNoExec: Go
// runs the tests of plugin_test.go before those of vm_test.go.
func TestConformancePlugin(t *testing.T) {
	env := libvirttest.Env(t)
	config, err := json.Marshal(Settings{URI: env.URI(), NameGlob: "vmgate-*", ExecTimeout: registry.Duration(5 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	h := pluginhost.New(pluginhost.Options{Executable: os.Args[0], Registry: pluginhost.Registered(), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { h.Close() })
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, pluginhost.Spec{Driver: "libvirt", Backend: "virt", Config: config})
	if err != nil {
		t.Fatalf("Launch(libvirt, %s) = %v", config, err)
	}

	// The name glob crossed the boundary: the plugin lists the vmgate-
	// domains and not vmOther, and does not know vmOther by name.
	vms, err := d.ListVMs(ctx)
	if err != nil {
		t.Fatalf("ListVMs() through the plugin error: %v", err)
	}
	var names []string
	for _, vm := range vms {
		names = append(names, vm.Name)
	}
	for _, want := range []string{vmT1, vmNoExec} {
		if !slices.Contains(names, want) {
			t.Errorf("ListVMs() through the plugin = %q; want it to hold %q", names, want)
		}
	}
	if slices.Contains(names, vmOther) {
		t.Errorf("ListVMs() through the plugin = %q; want no %q (name_glob vmgate-*)", names, vmOther)
	}
	if _, err := d.Status(ctx, vmOther); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("Status(%q) through the plugin error %v; want %v", vmOther, err, hypervisor.ErrUnknownVM)
	}

	hypervisortest.Run(t, hypervisortest.Harness{Driver: d, VM: vmT1, NoExecVM: vmNoExec, UnknownVM: vmOther, Capabilities: libvirtCapabilities})
}

// TestRegisteredSettings: every setting reaches the Config; bad settings are
// refused with ErrInvalidArgument (or ErrNotSupported for a transport
// go-libvirt lacks) before anything is dialled.
func TestRegisteredSettings(t *testing.T) {
	good := []struct {
		name   string
		config string
		want   Config
		ep     endpoint
	}{
		{"empty", ``, Config{ExecTimeout: DefaultExecTimeout, InfoTTL: DefaultInfoTTL, DialTimeout: DefaultDialTimeout},
			endpoint{network: "unix", address: DefaultSocket, name: "qemu:///system"}},
		{"empty object", ` {} `, Config{ExecTimeout: DefaultExecTimeout, InfoTTL: DefaultInfoTTL, DialTimeout: DefaultDialTimeout},
			endpoint{network: "unix", address: DefaultSocket, name: "qemu:///system"}},
		{"every field",
			`{"uri": "qemu+tcp://virt.example:16510/system", "name_glob": "vm-*", "metadata_uri": "urn:vmgate:x",
			  "exec_timeout": "90s", "info_ttl": "2s", "dial_timeout": "3s"}`,
			Config{URI: "qemu+tcp://virt.example:16510/system", NameGlob: "vm-*", MetadataURI: "urn:vmgate:x",
				ExecTimeout: 90 * time.Second, InfoTTL: 2 * time.Second, DialTimeout: 3 * time.Second},
			endpoint{network: "tcp", address: "virt.example:16510", name: "qemu:///system"}},
		{"session socket", `{"uri": "qemu:///session?socket=/run/user/1000/libvirt/libvirt-sock"}`,
			Config{URI: "qemu:///session?socket=/run/user/1000/libvirt/libvirt-sock", ExecTimeout: DefaultExecTimeout, InfoTTL: DefaultInfoTTL, DialTimeout: DefaultDialTimeout},
			endpoint{network: "unix", address: "/run/user/1000/libvirt/libvirt-sock", name: "qemu:///session"}},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			hd, err := registry.New(context.Background(), Name, []byte(tc.config))
			if err != nil {
				t.Fatalf("registry.New(Name, %s) = %v; want nil", tc.config, err)
			}
			d := hd.(*Driver)
			defer d.Close()
			got := d.cfg
			got.Logger = nil
			if got != tc.want || d.ep != tc.ep {
				t.Errorf("registry.New(Name, %s) = %+v at %+v; want %+v at %+v", tc.config, got, d.ep, tc.want, tc.ep)
			}
			d.mu.Lock()
			connected := d.conn != nil
			d.mu.Unlock()
			if connected {
				t.Errorf("registry.New(Name, %s) connected; want nothing dialled before the first call", tc.config)
			}
		})
	}

	bad := []struct {
		name   string
		config string
		want   error
	}{
		{"unknown field", `{"url": "qemu:///system"}`, hypervisor.ErrInvalidArgument},
		{"misspelt field", `{"nameglob": "vm-*"}`, hypervisor.ErrInvalidArgument},
		{"wrong type", `{"uri": 1}`, hypervisor.ErrInvalidArgument},
		{"duration as number", `{"exec_timeout": 600}`, hypervisor.ErrInvalidArgument},
		{"bad duration", `{"exec_timeout": "ten minutes"}`, hypervisor.ErrInvalidArgument},
		{"negative duration", `{"info_ttl": "-1s"}`, hypervisor.ErrInvalidArgument},
		{"zero duration", `{"dial_timeout": "0s"}`, hypervisor.ErrInvalidArgument},
		{"trailing data", `{} {}`, hypervisor.ErrInvalidArgument},
		{"trailing garbage", `{}x`, hypervisor.ErrInvalidArgument},
		{"null", `null`, hypervisor.ErrInvalidArgument},
		{"list", `[]`, hypervisor.ErrInvalidArgument},
		{"string", `"qemu:///system"`, hypervisor.ErrInvalidArgument},
		{"truncated", `{"uri": "qemu:///system"`, hypervisor.ErrInvalidArgument},
		{"bad glob", `{"name_glob": "vm-["}`, hypervisor.ErrInvalidArgument},
		{"metadata uri not a uri", `{"metadata_uri": "vmgate"}`, hypervisor.ErrInvalidArgument},
		{"metadata uri with markup", `{"metadata_uri": "urn:x\"/><evil"}`, hypervisor.ErrInvalidArgument},
		{"uri bad path", `{"uri": "qemu:///root"}`, hypervisor.ErrInvalidArgument},
		{"uri relative socket", `{"uri": "qemu:///system?socket=sock"}`, hypervisor.ErrInvalidArgument},
		{"uri unknown scheme", `{"uri": "xen:///system"}`, hypervisor.ErrInvalidArgument},
		{"uri ssh", `{"uri": "qemu+ssh://root@virt/system"}`, hypervisor.ErrNotSupported},
	}
	for _, tc := range bad {
		d, err := registry.New(context.Background(), Name, []byte(tc.config))
		if !errors.Is(err, tc.want) {
			t.Errorf("registry.New(Name, %s) [%s] = %v, %v; want %v", tc.config, tc.name, d, err, tc.want)
		}
		if d != nil {
			t.Errorf("registry.New(Name, %s) [%s] returned a driver with an error", tc.config, tc.name)
		}
	}
}
