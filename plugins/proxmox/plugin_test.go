package proxmox

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
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pluginhost"
)

func jsonConfig(cfg Config) []byte {
	b, _ := json.Marshal(JSONConfig{URL: cfg.URL, TokenID: cfg.TokenID, TokenSecretFile: cfg.TokenSecretFile, CAFile: cfg.CAFile})
	return b
}

// TestConformancePlugin runs the suite through the go-plugin boundary: the
// driver lives in a plugin process (this test binary) started by pluginhost.
func TestConformancePlugin(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	noexec := labtest.VM(t, "noexec")
	e := newPVEEmulator(t)
	e.addVM(101, "pve", "t1", "running", t1.QGASocket)
	e.addVM(103, "pve-2", "noexec", "running", noexec.QGASocket)
	h := pluginhost.New(pluginhost.Options{Executable: os.Args[0], Registry: pluginhost.Registry{"proxmox": NewFromJSON}, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { h.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, pluginhost.Spec{Driver: "proxmox", Backend: "pve", Config: jsonConfig(e.config(t))})
	if err != nil {
		t.Fatalf("Launch(proxmox) = %v", err)
	}
	hypervisortest.Run(t, hypervisortest.Harness{Driver: d, VM: "101", NoExecVM: "103", UnknownVM: "999"})
}

func TestNewFromJSON(t *testing.T) {
	e := newPVEEmulator(t)
	good := jsonConfig(e.config(t))
	d, err := NewFromJSON(context.Background(), good)
	if err != nil {
		t.Fatalf("NewFromJSON(%s) = %v; want nil", good, err)
	}
	d.(hypervisor.Closer).Close()
	var m map[string]any
	json.Unmarshal(good, &m)
	for name, mod := range map[string]func(map[string]any){
		"unknown field": func(m map[string]any) { m["tokenid"] = "x" },
		"bad duration":  func(m map[string]any) { m["exec_timeout"] = "ten minutes" },
		"wrong type":    func(m map[string]any) { m["insecure_skip_verify"] = "yes" },
		"no url":        func(m map[string]any) { delete(m, "url") },
	} {
		c := map[string]any{}
		for k, v := range m {
			c[k] = v
		}
		mod(c)
		b, _ := json.Marshal(c)
		if _, err := NewFromJSON(context.Background(), b); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("NewFromJSON(%s) [%s] = %v; want %v", b, name, err, hypervisor.ErrInvalidArgument)
		}
	}
	if _, err := NewFromJSON(context.Background(), append(good, []byte(" {}")...)); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("NewFromJSON(with trailing data) = %v; want %v", err, hypervisor.ErrInvalidArgument)
	}
}
