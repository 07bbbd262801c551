// Package hypervisor is the contract between vmgate and its backends: the
// Driver interface every backend (QEMU, libvirt, VirtualBox, Proxmox)
// implements, its domain types, and the sentinel errors callers branch on.
//
// A Driver knows VMs by their backend-local name ("vm1", "101"); the server
// owns the "<backend>/<name>" ids and strips the backend part before calling
// a driver. Every method takes a context whose deadline bounds the call:
// a driver must return (with an error wrapping context.DeadlineExceeded or
// ErrTimeout) when it expires, even when the hypervisor or guest is hung.
//
// Drivers must be safe for concurrent use by multiple goroutines. Calls to
// different VMs must not delay each other.
package hypervisor

import (
	"context"
	"time"
)

// Driver is what every backend implements. Optional capabilities are
// separate interfaces (see Runner) found by type assertion.
type Driver interface {
	// ListVMs returns every VM this backend can see, in a stable order.
	ListVMs(ctx context.Context) ([]VM, error)

	// Status reports the VM's power state and whether its guest agent answers.
	// An unknown name is ErrUnknownVM.
	Status(ctx context.Context, vm string) (Status, error)

	// AgentInfo reports the guest agent's version and which commands it has
	// enabled. ErrAgentUnavailable when the agent does not answer.
	AgentInfo(ctx context.Context, vm string) (AgentInfo, error)

	// ExecStart starts req in the guest and returns at once with a handle to
	// poll. ErrCommandDisabled when the guest forbids execution.
	ExecStart(ctx context.Context, vm string, req ExecRequest) (ExecHandle, error)

	// ExecStatus polls a started command. While the command runs the result
	// has Exited false; once it has exited the result is final and the
	// handle may be forgotten by the guest (a second poll may be ErrUnknownExec).
	ExecStatus(ctx context.Context, vm string, h ExecHandle) (ExecResult, error)

	// FileRead reads at most maxBytes of path; Truncated says whether more was there.
	FileRead(ctx context.Context, vm string, path string, maxBytes int64) (FileContent, error)

	// FileWrite creates or replaces path with data. Mode 0 means the guest's default.
	FileWrite(ctx context.Context, vm string, path string, data []byte, mode uint32) error

	// Power performs action. ErrNotSupported for an action the backend cannot do
	// (for example start on a VM it did not launch).
	Power(ctx context.Context, vm string, action PowerAction) error
}

// Runner is an optional capability: a driver that can run a command to
// completion itself (polling next to the guest rather than across a process
// boundary) implements it. Use Run, which falls back to ExecStart/ExecStatus.
type Runner interface {
	Run(ctx context.Context, vm string, req ExecRequest) (ExecResult, error)
}

// Closer is an optional capability for drivers holding connections.
type Closer interface {
	Close() error
}

// VM is one virtual machine as a backend sees it.
type VM struct {
	Name  string `json:"name"`            // backend-local name
	State State  `json:"state"`           // power state
	Info  string `json:"info,omitempty"`  // free-form, e.g. "lab VM" or a Proxmox node
	Agent bool   `json:"agent,omitempty"` // true when the backend knows the VM has a guest agent channel
}

// State is a VM's power state.
type State string

// The power states drivers report.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped"
	StateUnknown State = "unknown"
)

// Status is what Status returns.
type Status struct {
	Name  string `json:"name"`
	State State  `json:"state"`
	// AgentConnected is true when the guest agent answered a ping just now.
	AgentConnected bool `json:"agent_connected"`
	// AgentVersion is the guest agent's version when known.
	AgentVersion string `json:"agent_version,omitempty"`
	// Detail is the hypervisor's own word for the state (QMP's "status" field,
	// VirtualBox's VMState, ...).
	Detail string `json:"detail,omitempty"`
}

// AgentInfo describes the guest agent.
type AgentInfo struct {
	Version  string         `json:"version"`
	Commands []AgentCommand `json:"commands"`
}

// AgentCommand is one guest agent command and whether it is enabled.
type AgentCommand struct {
	Name    string `json:"name"`
	Enabled bool   `json:"enabled"`
}

// Enabled reports whether the named command is listed and enabled.
func (a AgentInfo) Enabled(name string) bool {
	for _, c := range a.Commands {
		if c.Name == name {
			return c.Enabled
		}
	}
	return false
}

// ExecRequest is a command to run in the guest. Argv is never passed through
// a shell by a driver; callers that want a shell put it in Argv themselves.
type ExecRequest struct {
	Argv []string
	// Env is added to the command's environment as KEY=VALUE entries.
	Env []string
	// Stdin is written to the command's standard input, which is then closed.
	Stdin []byte
	// Cwd is the working directory; empty means the agent's default.
	// Backends that cannot set it directly must refuse a non-empty Cwd with
	// ErrNotSupported rather than ignore it.
	Cwd string
	// Timeout, when positive, bounds the command's run time: when it fires the
	// driver kills the command and reports TimedOut with the output so far.
	Timeout time.Duration
	// MaxOutputBytes caps each of stdout and stderr; 0 means the driver's default.
	MaxOutputBytes int64
}

// ExecHandle identifies a started command. PID is the guest pid the agent
// reported; Token is backend state (opaque to callers) that ExecStatus needs.
type ExecHandle struct {
	PID       int64     `json:"pid"`
	Token     string    `json:"token,omitempty"`
	StartedAt time.Time `json:"started_at"`
}

// ExecResult is the state of a command.
type ExecResult struct {
	PID    int64 `json:"pid"`
	Exited bool  `json:"exited"`
	// ExitCode is valid when Exited and Signal == 0.
	ExitCode int `json:"exit_code"`
	// Signal is the signal number that ended the command, 0 if it exited normally.
	Signal          int    `json:"signal,omitempty"`
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	// TimedOut is set when the request's Timeout fired and the command was killed.
	TimedOut bool `json:"timed_out"`
}

// FileContent is what FileRead returns.
type FileContent struct {
	Data      []byte `json:"data"`
	Truncated bool   `json:"truncated"`
}

// PowerAction is one of the power operations.
type PowerAction string

// The power actions of the vm_power tool.
const (
	PowerShutdown PowerAction = "shutdown"
	PowerReboot   PowerAction = "reboot"
	PowerReset    PowerAction = "reset"
	PowerStop     PowerAction = "stop"
	PowerStart    PowerAction = "start"
)

// Valid reports whether a is a known action.
func (a PowerAction) Valid() bool {
	switch a {
	case PowerShutdown, PowerReboot, PowerReset, PowerStop, PowerStart:
		return true
	}
	return false
}
