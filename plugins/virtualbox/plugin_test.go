package virtualbox

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pluginhost"
)

func (e *emulator) jsonConfig() []byte {
	b, _ := json.Marshal(Settings{VBoxManage: e.bin, Username: emuUser, PasswordFile: e.passwordFile})
	return b
}

// TestConformancePlugin runs the suite through the go-plugin boundary: the
// driver lives in a plugin process (this test binary) started by
// pluginhost; the emulator finds its world next to its binary.
func TestConformancePlugin(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	noexec := labtest.VM(t, "noexec")
	e := newEmulator(t,
		emuVM{Name: "t1", UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0001", State: "running", QGASocket: t1.QGASocket},
		emuVM{Name: "noexec", UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0002", State: "running", QGASocket: noexec.QGASocket},
	)
	h := pluginhost.New(pluginhost.Options{Executable: os.Args[0], Registry: pluginhost.Registered(), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { h.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, pluginhost.Spec{Driver: "virtualbox", Backend: "vbox", Config: e.jsonConfig()})
	if err != nil {
		t.Fatalf("Launch(virtualbox) = %v", err)
	}
	hypervisortest.Run(t, hypervisortest.Harness{Driver: d, VM: "t1", NoExecVM: "noexec"})
}

func TestRegisteredSettings(t *testing.T) {
	e := newEmulator(t)
	good := e.jsonConfig()
	d, err := registry.New(context.Background(), Name, good)
	if err != nil {
		t.Fatalf("registry.New(Name, %s) = %v; want nil", good, err)
	}
	d.(hypervisor.Closer).Close()
	for _, bad := range []string{
		`{"username":"u","password_file":"/x","password":"inline"}`,
		`{"username":"u","password_file":"` + e.passwordFile + `","exec_timeout":"soon"}`,
		`{"username":"u","password_file":"` + e.passwordFile + `"} {}`,
		`{"username":7}`,
		`[]`,
	} {
		if _, err := registry.New(context.Background(), Name, []byte(bad)); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("registry.New(Name, %s) = %v; want %v", bad, err, hypervisor.ErrInvalidArgument)
		}
	}
}
