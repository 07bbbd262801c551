package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// errorKinds names the errors that cross the plugin boundary. The server
// lists every kind an error wraps in an ErrorDetail; the client rebuilds an
// error that wraps the same values, so errors.Is answers alike on both sides.
// The first kind that matches also picks the status code (for logs and for
// clients that only look at codes).
var errorKinds = []struct {
	kind string
	err  error
	code codes.Code
}{
	{"unknown_vm", ErrUnknownVM, codes.NotFound},
	{"unknown_exec", ErrUnknownExec, codes.NotFound},
	{"not_created", ErrNotCreated, codes.PermissionDenied},
	{"snapshot_not_found", ErrSnapshotNotFound, codes.NotFound},
	{"snapshot_exists", ErrSnapshotExists, codes.AlreadyExists},
	{"snapshot_memory", ErrSnapshotMemory, codes.Unimplemented},
	{"snapshot_disk_only", ErrSnapshotDiskOnly, codes.Unimplemented},
	{"snapshot_changed", ErrSnapshotChanged, codes.FailedPrecondition},
	{"command_disabled", ErrCommandDisabled, codes.PermissionDenied},
	{"agent_unavailable", ErrAgentUnavailable, codes.FailedPrecondition},
	{"vm_not_running", ErrVMNotRunning, codes.FailedPrecondition},
	{"not_configured", ErrNotConfigured, codes.FailedPrecondition},
	{"timeout", ErrTimeout, codes.DeadlineExceeded},
	{"not_supported", ErrNotSupported, codes.Unimplemented},
	{"invalid_argument", ErrInvalidArgument, codes.InvalidArgument},
	{"backend", ErrBackend, codes.Aborted},
	{"plugin_exited", ErrPluginExited, codes.Unavailable},
	{"no_helper_channel", ErrNoHelperChannel, codes.FailedPrecondition},
	{"helper_unavailable", ErrHelperUnavailable, codes.FailedPrecondition},
	{"helper_lost", ErrHelperLost, codes.Aborted},
	{"deadline_exceeded", context.DeadlineExceeded, codes.DeadlineExceeded},
	{"canceled", context.Canceled, codes.Canceled},
}

// toStatus turns a driver error into a status error carrying an ErrorDetail.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	detail := &pb.ErrorDetail{}
	code := codes.Unknown
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			if code == codes.Unknown {
				code = k.code
			}
			detail.Kinds = append(detail.Kinds, k.kind)
		}
	}
	var cd *CommandDisabledError
	if errors.As(err, &cd) {
		detail.Command = cd.Command
	}
	st, derr := status.New(code, err.Error()).WithDetails(detail)
	if derr != nil {
		// Cannot happen for a registered message; still, never lose the error.
		return status.Error(codes.Internal, err.Error()+" (error detail: "+derr.Error()+")")
	}
	return st.Err()
}

// server serves a Driver over gRPC.
type server struct {
	pb.UnimplementedDriverServer
	d Driver
}

func registerServer(s grpc.ServiceRegistrar, d Driver) {
	pb.RegisterDriverServer(s, &server{d: d})
}

func (s *server) Configure(ctx context.Context, req *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	c, ok := s.d.(Configurer)
	if !ok {
		if len(req.GetConfig()) == 0 {
			return &pb.ConfigureResponse{Capabilities: capabilitiesToPB(CapabilitiesOf(s.d))}, nil
		}
		return nil, toStatus(fmt.Errorf("configure: %w: this driver takes no configuration", ErrNotSupported))
	}
	if err := c.Configure(ctx, req.GetConfig()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.ConfigureResponse{Capabilities: capabilitiesToPB(CapabilitiesOf(s.d))}, nil
}

func (s *server) ListVMs(ctx context.Context, _ *pb.ListVMsRequest) (*pb.ListVMsResponse, error) {
	vms, err := s.d.ListVMs(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.ListVMsResponse{Vms: make([]*pb.VM, len(vms))}
	for i, v := range vms {
		out.Vms[i] = &pb.VM{Name: v.Name, State: string(v.State), Info: v.Info, Agent: v.Agent}
	}
	return out, nil
}

func (s *server) Status(ctx context.Context, req *pb.VMRequest) (*pb.StatusResponse, error) {
	st, err := s.d.Status(ctx, req.GetVm())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.StatusResponse{
		Name: st.Name, State: string(st.State), AgentConnected: st.AgentConnected,
		AgentVersion: st.AgentVersion, Detail: st.Detail,
	}, nil
}

func (s *server) AgentInfo(ctx context.Context, req *pb.VMRequest) (*pb.AgentInfoResponse, error) {
	info, err := s.d.AgentInfo(ctx, req.GetVm())
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.AgentInfoResponse{Version: info.Version, Commands: make([]*pb.AgentCommand, len(info.Commands))}
	for i, c := range info.Commands {
		out.Commands[i] = &pb.AgentCommand{Name: c.Name, Enabled: c.Enabled}
	}
	return out, nil
}

func (s *server) ExecStart(ctx context.Context, req *pb.ExecRequest) (*pb.ExecHandle, error) {
	h, err := s.d.ExecStart(ctx, req.GetVm(), execRequestFromPB(req))
	if err != nil {
		return nil, toStatus(err)
	}
	return execHandleToPB(h), nil
}

func (s *server) ExecStatus(ctx context.Context, req *pb.ExecStatusRequest) (*pb.ExecResult, error) {
	res, err := s.d.ExecStatus(ctx, req.GetVm(), execHandleFromPB(req.GetHandle()))
	if err != nil {
		return nil, toStatus(err)
	}
	return execResultToPB(res), nil
}

// Run asks Run, the one place that decides whether a driver runs commands
// itself, about the served driver (the one a Deferred built).
func (s *server) Run(ctx context.Context, req *pb.ExecRequest) (*pb.ExecResult, error) {
	d, err := served(s.d)
	if err != nil {
		return nil, toStatus(err)
	}
	res, err := Run(ctx, d, req.GetVm(), execRequestFromPB(req))
	if err != nil {
		return nil, toStatus(err)
	}
	return execResultToPB(res), nil
}

func (s *server) FileRead(ctx context.Context, req *pb.FileReadRequest) (*pb.FileContent, error) {
	fc, err := s.d.FileRead(ctx, req.GetVm(), req.GetPath(), req.GetMaxBytes())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.FileContent{Data: fc.Data, Truncated: fc.Truncated}, nil
}

func (s *server) FileWrite(ctx context.Context, req *pb.FileWriteRequest) (*pb.FileWriteResponse, error) {
	if err := s.d.FileWrite(ctx, req.GetVm(), req.GetPath(), req.GetData(), req.GetMode()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.FileWriteResponse{}, nil
}

func (s *server) Power(ctx context.Context, req *pb.PowerRequest) (*pb.PowerResponse, error) {
	if err := s.d.Power(ctx, req.GetVm(), PowerAction(req.GetAction())); err != nil {
		return nil, toStatus(err)
	}
	return &pb.PowerResponse{}, nil
}

// Conversions shared by client and server.

func execRequestToPB(vm string, r ExecRequest) *pb.ExecRequest {
	return &pb.ExecRequest{
		Vm: vm, Argv: r.Argv, Env: r.Env, Stdin: r.Stdin, Cwd: r.Cwd,
		TimeoutNs: int64(r.Timeout), MaxOutputBytes: r.MaxOutputBytes,
	}
}

func execRequestFromPB(r *pb.ExecRequest) ExecRequest {
	return ExecRequest{
		Argv: r.GetArgv(), Env: r.GetEnv(), Stdin: r.GetStdin(), Cwd: r.GetCwd(),
		Timeout: time.Duration(r.GetTimeoutNs()), MaxOutputBytes: r.GetMaxOutputBytes(),
	}
}

func execHandleToPB(h ExecHandle) *pb.ExecHandle {
	out := &pb.ExecHandle{Pid: h.PID, Token: h.Token}
	if !h.StartedAt.IsZero() {
		out.HasStartedAt = true
		out.StartedAtUnixNs = h.StartedAt.UnixNano()
	}
	return out
}

func execHandleFromPB(h *pb.ExecHandle) ExecHandle {
	out := ExecHandle{PID: h.GetPid(), Token: h.GetToken()}
	if h.GetHasStartedAt() {
		out.StartedAt = time.Unix(0, h.GetStartedAtUnixNs())
	}
	return out
}

func execResultToPB(r ExecResult) *pb.ExecResult {
	return &pb.ExecResult{
		Pid: r.PID, Exited: r.Exited, ExitCode: int64(r.ExitCode), Signal: int64(r.Signal),
		Stdout: r.Stdout, Stderr: r.Stderr, StdoutTruncated: r.StdoutTruncated,
		StderrTruncated: r.StderrTruncated, TimedOut: r.TimedOut,
	}
}

func execResultFromPB(r *pb.ExecResult) ExecResult {
	return ExecResult{
		PID: r.GetPid(), Exited: r.GetExited(), ExitCode: int(r.GetExitCode()), Signal: int(r.GetSignal()),
		Stdout: r.GetStdout(), Stderr: r.GetStderr(), StdoutTruncated: r.GetStdoutTruncated(),
		StderrTruncated: r.GetStderrTruncated(), TimedOut: r.GetTimedOut(),
	}
}
