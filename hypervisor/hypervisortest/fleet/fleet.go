// Package fleet is hypervisortest's fleet driver: many VMs, no guests, for
// measuring what vmgate costs as a fleet grows. It is a package of its own
// because it registers with hypervisor/registry, whose tests use
// hypervisortest.
package fleet

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
)

// Fleet is an in-memory driver with many VMs and no guests, for measuring
// what vmgate costs as a fleet grows (a thousand VMs over several
// backends) through the real plugin boundary: register it under a name
// (registry.Register("fleet", fleet.New)) and launch it as a
// plugin, or serve it from an external plugin binary.
//
// ListVMs returns every VM sorted by name, as a new slice (what a real
// driver builds from its backend's answer); Status is a map lookup; Power
// start and stop change a VM's state; CreateVM and DeleteVM add and remove
// VMs and keep their marks (hypervisor.Creator). The guest side (exec,
// files, agent info) is not there: those calls fail with
// hypervisor.ErrNotSupported. A Fleet is safe for concurrent use; mu
// guards vms and names.
type Fleet struct {
	mu    sync.RWMutex
	vms   map[string]*fleetVM
	names []string // the keys of vms, sorted
}

type fleetVM struct {
	state hypervisor.State
	mark  string // the lease id CreateVM was given; "" for a VM the fleet started with
}

var (
	_ hypervisor.Driver  = (*Fleet)(nil)
	_ hypervisor.Creator = (*Fleet)(nil)
)

// MaxVMs bounds Settings.VMs.
const MaxVMs = 100_000

// Info is the Info of every fleet VM.
const Info = "fleet VM"

// Settings are a Fleet's settings, as a registered driver's: the
// number of running VMs it starts with and their name prefix. The VMs are
// named Prefix followed by their number, from 1, in five digits
// ("vm00001").
type Settings struct {
	VMs    int    `json:"vms"`
	Prefix string `json:"prefix"`
}

// Validate checks the settings (hypervisor/registry's Settings).
func (s *Settings) Validate() error {
	if s.VMs < 0 || s.VMs > MaxVMs {
		return registry.Fieldf("vms", "%d: want 0 to %d", s.VMs, MaxVMs)
	}
	if s.Prefix != "" && !fleetNameOK(VMName(s.Prefix, MaxVMs)) {
		return registry.Fieldf("prefix", "%q: want [a-z0-9][a-z0-9-]*, at most 26 characters (a VM name is at most 32)", s.Prefix)
	}
	return nil
}

// fleetNameOK reports whether name is a VM name a Fleet accepts: the
// rule of hypervisor.CreateRequest names, at most 32 characters long.
func fleetNameOK(name string) bool {
	if name == "" || len(name) > 32 || name[0] == '-' {
		return false
	}
	return strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-") == ""
}

// VMName is the name of the i-th VM (from 1) of a fleet with prefix.
func VMName(prefix string, i int) string {
	if prefix == "" {
		prefix = "vm"
	}
	n := strconv.Itoa(i)
	if len(n) < 5 {
		n = strings.Repeat("0", 5-len(n)) + n
	}
	return prefix + n
}

// New returns a Fleet with s.VMs running VMs; its signature is a
// registry constructor's. The settings must have passed Validate.
func New(_ context.Context, s *Settings) (*Fleet, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("fleet: config: %w: %w", hypervisor.ErrInvalidArgument, err)
	}
	f := &Fleet{vms: make(map[string]*fleetVM, s.VMs), names: make([]string, 0, s.VMs)}
	for i := 1; i <= s.VMs; i++ {
		name := VMName(s.Prefix, i)
		f.vms[name] = &fleetVM{state: hypervisor.StateRunning}
		f.names = append(f.names, name)
	}
	slices.Sort(f.names)
	return f, nil
}

func fleetUnknown(op, vm string) error {
	return fmt.Errorf("fleet: %s: %w: %q", op, hypervisor.ErrUnknownVM, vm)
}

// ListVMs returns every VM, sorted by name.
func (f *Fleet) ListVMs(context.Context) ([]hypervisor.VM, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]hypervisor.VM, len(f.names))
	for i, n := range f.names {
		out[i] = hypervisor.VM{Name: n, State: f.vms[n].state, Info: Info, Agent: true}
	}
	return out, nil
}

// Status reports vm's state; its agent answers while it runs.
func (f *Fleet) Status(_ context.Context, vm string) (hypervisor.Status, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	v, ok := f.vms[vm]
	if !ok {
		return hypervisor.Status{}, fleetUnknown("status", vm)
	}
	return hypervisor.Status{Name: vm, State: v.state, AgentConnected: v.state == hypervisor.StateRunning, Detail: string(v.state)}, nil
}

// Power starts or stops vm (stop and shutdown stop it, start starts it;
// reboot and reset leave it running).
func (f *Fleet) Power(_ context.Context, vm string, action hypervisor.PowerAction) error {
	if !action.Valid() {
		return fmt.Errorf("fleet: power: %w: action %q", hypervisor.ErrInvalidArgument, action)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.vms[vm]
	if !ok {
		return fleetUnknown("power", vm)
	}
	switch action {
	case hypervisor.PowerStop, hypervisor.PowerShutdown:
		v.state = hypervisor.StateStopped
	default:
		v.state = hypervisor.StateRunning
	}
	return nil
}

// CreateVM adds a running VM named req.Name, marked with req.Mark.
func (f *Fleet) CreateVM(_ context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
	if err := req.Validate(); err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("fleet: create: %w", err)
	}
	if err := hypervisor.DecodeSource(req.Source, &struct{}{}); err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("fleet: create: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, dup := f.vms[req.Name]; dup {
		return hypervisor.CreatedVM{}, fmt.Errorf("fleet: create: %w: a VM named %q exists", hypervisor.ErrInvalidArgument, req.Name)
	}
	f.vms[req.Name] = &fleetVM{state: hypervisor.StateRunning, mark: req.Mark}
	i, _ := slices.BinarySearch(f.names, req.Name)
	f.names = slices.Insert(f.names, i, req.Name)
	return hypervisor.CreatedVM{Name: req.Name}, nil
}

// DeleteVM removes the VM req names if it carries req.Mark.
func (f *Fleet) DeleteVM(_ context.Context, req hypervisor.DeleteRequest) error {
	if err := req.Validate(); err != nil {
		return fmt.Errorf("fleet: delete: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.vms[req.Name]
	switch {
	case !ok:
		return fleetUnknown("delete", req.Name)
	case v.mark != req.Mark:
		return fmt.Errorf("fleet: delete %q: %w", req.Name, hypervisor.ErrNotCreated)
	}
	delete(f.vms, req.Name)
	if i, found := slices.BinarySearch(f.names, req.Name); found {
		f.names = slices.Delete(f.names, i, i+1)
	}
	return nil
}

// Len is the number of VMs the fleet has now.
func (f *Fleet) Len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.names)
}

func fleetNoGuest(op string) error {
	return fmt.Errorf("fleet: %s: %w: fleet VMs have no guest", op, hypervisor.ErrNotSupported)
}

// AgentInfo fails: fleet VMs have no guest.
func (f *Fleet) AgentInfo(context.Context, string) (hypervisor.AgentInfo, error) {
	return hypervisor.AgentInfo{}, fleetNoGuest("agent info")
}

// ExecStart fails: fleet VMs have no guest.
func (f *Fleet) ExecStart(context.Context, string, hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	return hypervisor.ExecHandle{}, fleetNoGuest("exec")
}

// ExecStatus fails: fleet VMs have no guest.
func (f *Fleet) ExecStatus(context.Context, string, hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	return hypervisor.ExecResult{}, fleetNoGuest("exec status")
}

// FileRead fails: fleet VMs have no guest.
func (f *Fleet) FileRead(context.Context, string, string, int64) (hypervisor.FileContent, error) {
	return hypervisor.FileContent{}, fleetNoGuest("file read")
}

// FileWrite fails: fleet VMs have no guest.
func (f *Fleet) FileWrite(context.Context, string, string, []byte, uint32) error {
	return fleetNoGuest("file write")
}
