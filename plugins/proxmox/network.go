package proxmox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/guestnet"
)

// The guest's interfaces through qemu-server's API2/Qemu/Agent.pm
// "network-get-interfaces" (GET {vmid}/agent/network-get-interfaces): the
// agent command relayed as is, its reply under "result". The privilege is
// VM.Monitor up to qemu-server 9.0.2 and VM.GuestAgent.Audit (or
// .Unrestricted) since 9.0.3.

var _ hypervisor.GuestNetworker = (*Driver)(nil)

// GuestNetwork implements hypervisor.GuestNetworker: the agent's answer,
// converted and cleaned by guestnet.FromQGA (the guest is not trusted).
func (d *Driver) GuestNetwork(ctx context.Context, name string) ([]hypervisor.NetInterface, error) {
	const op = "guest network"
	v, err := d.lookup(ctx, op, name)
	if err != nil {
		return nil, err
	}
	ifs, err := d.agentOf(v).NetworkInterfaces(ctx)
	if err != nil {
		return nil, d.classify(op, err)
	}
	return guestnet.FromQGA(ifs), nil
}

// networkInterfaces is agent/network-get-interfaces for agentCaller. Agent.pm's
// register_command answers {result => REPLY}, where an error reply of the
// agent is the reply itself ({error => {class, desc}}) with HTTP 200; that
// becomes the *qga.Error (or *qga.DisabledError) qga.DecodeReply makes of it.
func (c agentCaller) networkInterfaces(ctx context.Context, result any) error {
	var r struct {
		Result json.RawMessage `json:"result"`
	}
	if err := c.api.do(ctx, "GET", c.path+"/network-get-interfaces", nil, nil, &r); err != nil {
		return err
	}
	const command = "guest-network-get-interfaces"
	if len(r.Result) == 0 || string(r.Result) == "null" {
		return fmt.Errorf("proxmox: agent/network-get-interfaces: %w: answer has no result", qga.ErrProtocol)
	}
	var probe struct {
		Error json.RawMessage `json:"error"`
	}
	if r.Result[0] == '{' && json.Unmarshal(r.Result, &probe) == nil && len(probe.Error) > 0 {
		return qga.DecodeReply(command, r.Result, result)
	}
	if result == nil {
		return nil
	}
	if err := json.Unmarshal(r.Result, result); err != nil {
		return fmt.Errorf("proxmox: agent/network-get-interfaces: %w: %w", qga.ErrProtocol, err)
	}
	return nil
}
