package hypervisor

import (
	"context"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// The plugin side of the Creator capability.

func (s *server) CreateVM(ctx context.Context, req *pb.CreateVMRequest) (*pb.CreatedVM, error) {
	c, ok := AsCreator(s.d)
	if !ok {
		return nil, notSupported("create", "VM creation")
	}
	made, err := c.CreateVM(ctx, createRequestFromPB(req))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.CreatedVM{Name: made.Name}, nil
}

func (s *server) DeleteVM(ctx context.Context, req *pb.DeleteVMRequest) (*pb.DeleteVMResponse, error) {
	c, ok := AsCreator(s.d)
	if !ok {
		return nil, notSupported("delete", "VM creation")
	}
	if err := c.DeleteVM(ctx, DeleteRequest{Name: req.GetName(), Mark: req.GetMark()}); err != nil {
		return nil, toStatus(err)
	}
	return &pb.DeleteVMResponse{}, nil
}

func createRequestToPB(r CreateRequest) *pb.CreateVMRequest {
	return &pb.CreateVMRequest{Name: r.Name, Source: r.Source, MemoryMb: r.MemoryMB, Cpus: r.CPUs, Mark: r.Mark}
}

func createRequestFromPB(r *pb.CreateVMRequest) CreateRequest {
	return CreateRequest{Name: r.GetName(), Source: r.GetSource(), MemoryMB: r.GetMemoryMb(), CPUs: r.GetCpus(), Mark: r.GetMark()}
}
