// Command fakeplugin is an external vmgate driver plugin for the pluginhost
// tests. Its file name picks its behaviour: vmgate-plugin-badcookie and
// vmgate-plugin-badversion get the handshake wrong; vmgate-plugin-grpconly
// offers no call socket (as a plugin built before it existed); any other
// name serves a fake driver whose VMs are the names listed in its
// configuration ({"vms": ["a", "b"]}).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-plugin"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

func build(_ context.Context, config []byte) (hypervisor.Driver, error) {
	var c struct {
		VMs []string `json:"vms"`
	}
	dec := json.NewDecoder(strings.NewReader(string(config)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("fakeplugin: config: %w: %w", hypervisor.ErrInvalidArgument, err)
	}
	return &hypervisortest.Fake{
		ListVMsFunc: func(context.Context) ([]hypervisor.VM, error) {
			vms := make([]hypervisor.VM, len(c.VMs))
			for i, n := range c.VMs {
				vms[i] = hypervisor.VM{Name: n, State: hypervisor.StateRunning, Info: "external fake"}
			}
			return vms, nil
		},
	}, nil
}

func main() {
	d := hypervisor.NewDeferred(build)
	hs := hypervisor.Handshake()
	switch name := filepath.Base(os.Args[0]); {
	case strings.HasSuffix(name, "-badcookie"):
		hs.MagicCookieValue = "not-the-vmgate-cookie"
	case strings.HasSuffix(name, "-badversion"):
		hs.ProtocolVersion = hypervisor.ProtocolVersion + 1
	case strings.HasSuffix(name, "-grpconly"):
	default:
		hypervisor.Serve(d)
		return
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: hs,
		Plugins:         plugin.PluginSet{hypervisor.PluginName: &hypervisor.GRPCPlugin{Impl: d, GRPCOnly: true}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}
