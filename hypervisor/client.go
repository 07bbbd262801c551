package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// client is the host side of a driver plugin: a Driver (and Runner and
// Configurer) whose calls are RPCs. It is safe for concurrent use (gRPC
// multiplexes calls on one connection). Every call is bounded by its
// context's deadline, which gRPC carries to the plugin.
type client struct {
	name string
	rpc  pb.DriverClient
	// caps are the plugin driver's capabilities, from Configure's reply (or
	// the Capabilities RPC); nil until known. See client_caps.go.
	caps atomic.Pointer[Capabilities]
}

var (
	_ Driver     = (*client)(nil)
	_ Runner     = (*client)(nil)
	_ Configurer = (*client)(nil)
)

func newClient(name string, conn grpc.ClientConnInterface) *client {
	if name == "" {
		name = "plugin"
	}
	return &client{name: name, rpc: pb.NewDriverClient(conn)}
}

// remoteError is a driver error rebuilt on the host side: the plugin's
// message, wrapping the sentinels (and CommandDisabledError) it wrapped.
type remoteError struct {
	msg  string
	errs []error
}

func (e *remoteError) Error() string   { return e.msg }
func (e *remoteError) Unwrap() []error { return e.errs }

// fromStatus maps an RPC error back to the driver's error. A status with an
// ErrorDetail is the driver's own error; anything else is the transport's:
// the call's context ending or gRPC's deadline (ErrTimeout / context
// error), the plugin being
// unreachable (ExitedError), or a TransportError.
func (c *client) fromStatus(ctx context.Context, op string, err error) error {
	st, ok := status.FromError(err)
	if ok {
		for _, d := range st.Details() {
			detail, ok := d.(*pb.ErrorDetail)
			if !ok {
				continue
			}
			re := &remoteError{msg: st.Message()}
			for _, kind := range detail.GetKinds() {
				for _, k := range errorKinds {
					if k.kind != kind {
						continue
					}
					if k.err == ErrCommandDisabled {
						re.errs = append(re.errs, &CommandDisabledError{Command: detail.GetCommand()})
					} else {
						re.errs = append(re.errs, k.err)
					}
				}
			}
			return re
		}
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("driver %s: %s: %w: %w", c.name, op, ErrTimeout, cerr)
		}
		return fmt.Errorf("driver %s: %s: %w", c.name, op, cerr)
	}
	if ok && st.Code() == codes.DeadlineExceeded {
		// gRPC's own deadline can fire a moment before ctx.Err() is set.
		return fmt.Errorf("driver %s: %s: %w: %w", c.name, op, ErrTimeout, context.DeadlineExceeded)
	}
	if ok && st.Code() == codes.Unavailable {
		return &ExitedError{Driver: c.name, Err: err}
	}
	return &TransportError{Driver: c.name, Op: op, Err: err}
}

// Configure sends the plugin its settings.
func (c *client) Configure(ctx context.Context, config []byte) error {
	resp, err := c.rpc.Configure(ctx, &pb.ConfigureRequest{Config: config})
	if err != nil {
		return c.fromStatus(ctx, "configure", err)
	}
	c.setCaps(capabilitiesFromPB(resp.GetCapabilities()))
	return nil
}

func (c *client) ListVMs(ctx context.Context) ([]VM, error) {
	resp, err := c.rpc.ListVMs(ctx, &pb.ListVMsRequest{})
	if err != nil {
		return nil, c.fromStatus(ctx, "list VMs", err)
	}
	vms := make([]VM, len(resp.GetVms()))
	for i, v := range resp.GetVms() {
		vms[i] = VM{Name: v.GetName(), State: State(v.GetState()), Info: v.GetInfo(), Agent: v.GetAgent()}
	}
	return vms, nil
}

func (c *client) Status(ctx context.Context, vm string) (Status, error) {
	resp, err := c.rpc.Status(ctx, &pb.VMRequest{Vm: vm})
	if err != nil {
		return Status{}, c.fromStatus(ctx, "status", err)
	}
	return Status{
		Name: resp.GetName(), State: State(resp.GetState()), AgentConnected: resp.GetAgentConnected(),
		AgentVersion: resp.GetAgentVersion(), Detail: resp.GetDetail(),
	}, nil
}

func (c *client) AgentInfo(ctx context.Context, vm string) (AgentInfo, error) {
	resp, err := c.rpc.AgentInfo(ctx, &pb.VMRequest{Vm: vm})
	if err != nil {
		return AgentInfo{}, c.fromStatus(ctx, "agent info", err)
	}
	info := AgentInfo{Version: resp.GetVersion(), Commands: make([]AgentCommand, len(resp.GetCommands()))}
	for i, cmd := range resp.GetCommands() {
		info.Commands[i] = AgentCommand{Name: cmd.GetName(), Enabled: cmd.GetEnabled()}
	}
	return info, nil
}

func (c *client) ExecStart(ctx context.Context, vm string, req ExecRequest) (ExecHandle, error) {
	resp, err := c.rpc.ExecStart(ctx, execRequestToPB(vm, req))
	if err != nil {
		return ExecHandle{}, c.fromStatus(ctx, "exec start", err)
	}
	return execHandleFromPB(resp), nil
}

func (c *client) ExecStatus(ctx context.Context, vm string, h ExecHandle) (ExecResult, error) {
	resp, err := c.rpc.ExecStatus(ctx, &pb.ExecStatusRequest{Vm: vm, Handle: execHandleToPB(h)})
	if err != nil {
		return ExecResult{}, c.fromStatus(ctx, "exec status", err)
	}
	return execResultFromPB(resp), nil
}

// Run runs req to completion inside the plugin: one round trip, with the
// polling next to the guest.
func (c *client) Run(ctx context.Context, vm string, req ExecRequest) (ExecResult, error) {
	resp, err := c.rpc.Run(ctx, execRequestToPB(vm, req))
	if err != nil {
		return ExecResult{}, c.fromStatus(ctx, "run", err)
	}
	return execResultFromPB(resp), nil
}

func (c *client) FileRead(ctx context.Context, vm, path string, maxBytes int64) (FileContent, error) {
	resp, err := c.rpc.FileRead(ctx, &pb.FileReadRequest{Vm: vm, Path: path, MaxBytes: maxBytes})
	if err != nil {
		return FileContent{}, c.fromStatus(ctx, "file read", err)
	}
	return FileContent{Data: resp.GetData(), Truncated: resp.GetTruncated()}, nil
}

func (c *client) FileWrite(ctx context.Context, vm, path string, data []byte, mode uint32) error {
	if _, err := c.rpc.FileWrite(ctx, &pb.FileWriteRequest{Vm: vm, Path: path, Data: data, Mode: mode}); err != nil {
		return c.fromStatus(ctx, "file write", err)
	}
	return nil
}

func (c *client) Power(ctx context.Context, vm string, action PowerAction) error {
	if _, err := c.rpc.Power(ctx, &pb.PowerRequest{Vm: vm, Action: string(action)}); err != nil {
		return c.fromStatus(ctx, "power", err)
	}
	return nil
}
