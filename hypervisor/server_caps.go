package hypervisor

import (
	"context"
	"fmt"
	"time"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// The plugin side of the optional capabilities: each RPC calls the driver's
// capability when it has one (CapabilitiesOf), and answers ErrNotSupported
// otherwise.

func (s *server) Capabilities(context.Context, *pb.CapabilitiesRequest) (*pb.CapabilitySet, error) {
	return capabilitiesToPB(CapabilitiesOf(s.d)), nil
}

func notSupported(op, what string) error {
	return toStatus(fmt.Errorf("%s: %w: this backend has no %s", op, ErrNotSupported, what))
}

func (s *server) SnapshotCreate(ctx context.Context, req *pb.SnapshotCreateRequest) (*pb.Snapshot, error) {
	sn, ok := AsSnapshotter(s.d)
	if !ok {
		return nil, notSupported("snapshot create", "snapshots")
	}
	snap, err := sn.SnapshotCreate(ctx, req.GetVm(), SnapshotRequest{
		Name: req.GetName(), Description: req.GetDescription(), Memory: req.GetMemory(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return snapshotToPB(snap), nil
}

func (s *server) SnapshotList(ctx context.Context, req *pb.VMRequest) (*pb.SnapshotListResponse, error) {
	sn, ok := AsSnapshotter(s.d)
	if !ok {
		return nil, notSupported("snapshot list", "snapshots")
	}
	snaps, err := sn.SnapshotList(ctx, req.GetVm())
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.SnapshotListResponse{Snapshots: make([]*pb.Snapshot, len(snaps))}
	for i, snap := range snaps {
		out.Snapshots[i] = snapshotToPB(snap)
	}
	return out, nil
}

func (s *server) SnapshotRevert(ctx context.Context, req *pb.SnapshotNameRequest) (*pb.SnapshotRevertResponse, error) {
	sn, ok := AsSnapshotter(s.d)
	if !ok {
		return nil, notSupported("snapshot revert", "snapshots")
	}
	revert := func() error { return sn.SnapshotRevert(ctx, req.GetVm(), req.GetName()) }
	if id := req.GetExpectId(); id != "" {
		revert = func() error {
			if r, ok := sn.(SnapshotIDReverter); ok {
				return r.SnapshotRevertID(ctx, req.GetVm(), req.GetName(), id)
			}
			return RevertSnapshotID(ctx, sn, req.GetVm(), req.GetName(), id)
		}
	}
	if err := revert(); err != nil {
		return nil, toStatus(err)
	}
	return &pb.SnapshotRevertResponse{}, nil
}

func (s *server) SnapshotDelete(ctx context.Context, req *pb.SnapshotNameRequest) (*pb.SnapshotDeleteResponse, error) {
	sn, ok := AsSnapshotter(s.d)
	if !ok {
		return nil, notSupported("snapshot delete", "snapshots")
	}
	if err := sn.SnapshotDelete(ctx, req.GetVm(), req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.SnapshotDeleteResponse{}, nil
}

func (s *server) GuestNetwork(ctx context.Context, req *pb.VMRequest) (*pb.GuestNetworkResponse, error) {
	n, ok := AsGuestNetworker(s.d)
	if !ok {
		return nil, notSupported("guest network", "guest network query")
	}
	ifs, err := n.GuestNetwork(ctx, req.GetVm())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.GuestNetworkResponse{Interfaces: netInterfacesToPB(ifs)}, nil
}

func (s *server) VMMetrics(ctx context.Context, req *pb.VMRequest) (*pb.VMMetricsResponse, error) {
	m, ok := AsMetricsReader(s.d)
	if !ok {
		return nil, notSupported("metrics", "hypervisor metrics")
	}
	vm, err := m.VMMetrics(ctx, req.GetVm())
	if err != nil {
		return nil, toStatus(err)
	}
	return metricsToPB(vm), nil
}

// Conversions shared by client and server.

func (s *server) HelperCall(ctx context.Context, req *pb.HelperCallRequest) (*pb.HelperCallReply, error) {
	h, ok := AsHelperCaller(s.d)
	if !ok {
		return nil, toStatus(fmt.Errorf("helper call: %w: %w: this backend has no resident helper channel", ErrNotSupported, ErrNoHelperChannel))
	}
	rep, err := h.HelperCall(ctx, req.GetVm(), HelperCall{Args: req.GetArgs(), Stdin: req.GetStdin(), Timeout: time.Duration(req.GetTimeoutNs())})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.HelperCallReply{Exit: int32(rep.Exit), Stdout: rep.Stdout}, nil
}

func capabilitiesToPB(k Capabilities) *pb.CapabilitySet {
	return &pb.CapabilitySet{
		Snapshots: k.Snapshots, SnapshotMemory: k.SnapshotModes.Memory, SnapshotDiskOnly: k.SnapshotModes.DiskOnly,
		GuestNetwork: k.GuestNetwork, Metrics: k.Metrics, Create: k.Create, HelperChannel: k.HelperChannel,
		Screenshot: k.Screenshot, SendKeys: k.SendKeys, ConsoleRead: k.ConsoleRead, ConsoleWrite: k.ConsoleWrite,
	}
}

// capabilitiesFromPB reads a plugin's answer; modes count only with snapshots.
func capabilitiesFromPB(k *pb.CapabilitySet) Capabilities {
	out := Capabilities{Snapshots: k.GetSnapshots(), GuestNetwork: k.GetGuestNetwork(), Metrics: k.GetMetrics(), Create: k.GetCreate(),
		HelperChannel: k.GetHelperChannel(),
		Screenshot:    k.GetScreenshot(), SendKeys: k.GetSendKeys(), ConsoleRead: k.GetConsoleRead(), ConsoleWrite: k.GetConsoleWrite()}
	if out.Snapshots {
		out.SnapshotModes = SnapshotModes{Memory: k.GetSnapshotMemory(), DiskOnly: k.GetSnapshotDiskOnly()}
	}
	return out
}

func snapshotToPB(s Snapshot) *pb.Snapshot {
	out := &pb.Snapshot{
		Name: s.Name, Description: s.Description, Memory: s.Memory, SizeBytes: s.SizeBytes,
		Parent: s.Parent, Current: s.Current, Id: s.ID,
	}
	if !s.CreatedAt.IsZero() {
		out.HasCreatedAt, out.CreatedAtUnixNs = true, s.CreatedAt.UnixNano()
	}
	return out
}

func snapshotFromPB(s *pb.Snapshot) Snapshot {
	out := Snapshot{
		Name: s.GetName(), Description: s.GetDescription(), Memory: s.GetMemory(), SizeBytes: s.GetSizeBytes(),
		Parent: s.GetParent(), Current: s.GetCurrent(), ID: s.GetId(),
	}
	if s.GetHasCreatedAt() {
		out.CreatedAt = time.Unix(0, s.GetCreatedAtUnixNs())
	}
	return out
}

func netInterfacesToPB(ifs []NetInterface) []*pb.NetInterface {
	out := make([]*pb.NetInterface, len(ifs))
	for i, ifc := range ifs {
		p := &pb.NetInterface{Name: ifc.Name, Mac: ifc.MAC, Addresses: make([]*pb.IPAddress, len(ifc.Addresses))}
		for j, a := range ifc.Addresses {
			p.Addresses[j] = &pb.IPAddress{Family: a.Family, Address: a.Address, Prefix: int32(a.Prefix)}
		}
		if st := ifc.Stats; st != nil {
			p.Stats = &pb.NetStats{
				RxBytes: st.RxBytes, RxPackets: st.RxPackets, RxErrors: st.RxErrors, RxDropped: st.RxDropped,
				TxBytes: st.TxBytes, TxPackets: st.TxPackets, TxErrors: st.TxErrors, TxDropped: st.TxDropped,
			}
		}
		out[i] = p
	}
	return out
}

func netInterfacesFromPB(ifs []*pb.NetInterface) []NetInterface {
	out := make([]NetInterface, len(ifs))
	for i, p := range ifs {
		ifc := NetInterface{Name: p.GetName(), MAC: p.GetMac(), Addresses: make([]IPAddress, len(p.GetAddresses()))}
		for j, a := range p.GetAddresses() {
			ifc.Addresses[j] = IPAddress{Family: a.GetFamily(), Address: a.GetAddress(), Prefix: int(a.GetPrefix())}
		}
		if st := p.GetStats(); st != nil {
			ifc.Stats = &NetStats{
				RxBytes: st.GetRxBytes(), RxPackets: st.GetRxPackets(), RxErrors: st.GetRxErrors(), RxDropped: st.GetRxDropped(),
				TxBytes: st.GetTxBytes(), TxPackets: st.GetTxPackets(), TxErrors: st.GetTxErrors(), TxDropped: st.GetTxDropped(),
			}
		}
		out[i] = ifc
	}
	return out
}

func metricsToPB(m VMMetrics) *pb.VMMetricsResponse {
	out := &pb.VMMetricsResponse{
		Source: m.Source, Vcpus: int64(m.VCPUs),
		CpuTimeNs: m.CPUTimeNS, MemoryBytes: m.MemoryBytes, BalloonBytes: m.BalloonBytes, HostRssBytes: m.HostRSSBytes,
		DiskReadBytes: m.DiskReadBytes, DiskWriteBytes: m.DiskWriteBytes, DiskReadOps: m.DiskReadOps, DiskWriteOps: m.DiskWriteOps,
		NetRxBytes: m.NetRxBytes, NetTxBytes: m.NetTxBytes,
	}
	if !m.Time.IsZero() {
		out.TimeUnixNs = m.Time.UnixNano()
	}
	return out
}

func metricsFromPB(p *pb.VMMetricsResponse) VMMetrics {
	out := VMMetrics{
		Source: p.GetSource(), VCPUs: int(p.GetVcpus()),
		CPUTimeNS: p.CpuTimeNs, MemoryBytes: p.MemoryBytes, BalloonBytes: p.BalloonBytes, HostRSSBytes: p.HostRssBytes,
		DiskReadBytes: p.DiskReadBytes, DiskWriteBytes: p.DiskWriteBytes, DiskReadOps: p.DiskReadOps, DiskWriteOps: p.DiskWriteOps,
		NetRxBytes: p.NetRxBytes, NetTxBytes: p.NetTxBytes,
	}
	if ns := p.GetTimeUnixNs(); ns != 0 {
		out.Time = time.Unix(0, ns)
	}
	return out
}
