package qga

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"time"
)

// Agent is the guest agent's command set over any Caller. The zero value
// is not usable: set Caller.
type Agent struct {
	Caller Caller
	// ChunkBytes is the file data one guest-file-read or guest-file-write
	// carries; 0 (or less) means FileChunkBytes. A transport that stalls on
	// large commands (libvirt's agent channel) sets it lower.
	ChunkBytes int
}

// chunkBytes is ChunkBytes or its default.
func (a Agent) chunkBytes() int {
	if a.ChunkBytes > 0 {
		return a.ChunkBytes
	}
	return FileChunkBytes
}

// Ping checks that the agent answers (guest-ping).
func (a Agent) Ping(ctx context.Context) error {
	return a.Caller.Call(ctx, "guest-ping", nil, nil)
}

// Info is guest-info's reply.
type Info struct {
	Version           string    `json:"version"`
	SupportedCommands []Command `json:"supported_commands"`
}

// Command is one entry of Info.SupportedCommands.
type Command struct {
	Name    string `json:"name"`
	Enabled bool   `json:"enabled"`
	// SuccessResponse is false for commands that never reply on success
	// (guest-shutdown, guest-suspend-*).
	SuccessResponse bool `json:"success-response"`
}

// Enabled reports whether the named command is listed and enabled.
func (i Info) Enabled(name string) bool {
	for _, c := range i.SupportedCommands {
		if c.Name == name {
			return c.Enabled
		}
	}
	return false
}

// Info returns the agent's version and commands (guest-info).
func (a Agent) Info(ctx context.Context) (Info, error) {
	var info Info
	err := a.Caller.Call(ctx, "guest-info", nil, &info)
	return info, err
}

// OSInfo is guest-get-osinfo's reply; fields the guest does not report are empty.
type OSInfo struct {
	KernelRelease string `json:"kernel-release"`
	KernelVersion string `json:"kernel-version"`
	Machine       string `json:"machine"`
	ID            string `json:"id"`
	Name          string `json:"name"`
	PrettyName    string `json:"pretty-name"`
	Version       string `json:"version"`
	VersionID     string `json:"version-id"`
	Variant       string `json:"variant"`
	VariantID     string `json:"variant-id"`
}

// OSInfo returns the guest's operating system (guest-get-osinfo).
func (a Agent) OSInfo(ctx context.Context) (OSInfo, error) {
	var info OSInfo
	err := a.Caller.Call(ctx, "guest-get-osinfo", nil, &info)
	return info, err
}

// NetworkInterface is one entry of guest-network-get-interfaces.
type NetworkInterface struct {
	Name            string      `json:"name"`
	HardwareAddress string      `json:"hardware-address"`
	IPAddresses     []IPAddress `json:"ip-addresses"`
	// Statistics are the interface's counters (qemu-ga 2.11 and later); nil
	// when the agent sends none.
	Statistics *NetworkStats `json:"statistics,omitempty"`
}

// NetworkStats are an interface's counters as qemu-ga reports them.
type NetworkStats struct {
	RxBytes   uint64 `json:"rx-bytes"`
	RxPackets uint64 `json:"rx-packets"`
	RxErrs    uint64 `json:"rx-errs"`
	RxDropped uint64 `json:"rx-dropped"`
	TxBytes   uint64 `json:"tx-bytes"`
	TxPackets uint64 `json:"tx-packets"`
	TxErrs    uint64 `json:"tx-errs"`
	TxDropped uint64 `json:"tx-dropped"`
}

// IPAddress is one address of a NetworkInterface.
type IPAddress struct {
	Type    string `json:"ip-address-type"` // "ipv4" or "ipv6"
	Address string `json:"ip-address"`
	Prefix  int    `json:"prefix"`
}

// NetworkInterfaces lists the guest's interfaces (guest-network-get-interfaces).
func (a Agent) NetworkInterfaces(ctx context.Context) ([]NetworkInterface, error) {
	var ifs []NetworkInterface
	err := a.Caller.Call(ctx, "guest-network-get-interfaces", nil, &ifs)
	return ifs, err
}

// ShutdownWait is how long Shutdown waits for an error reply after sending.
const ShutdownWait = 500 * time.Millisecond

// Shutdown asks the guest to power down, reboot or halt (guest-shutdown;
// mode "powerdown", "reboot" or "halt"). The agent never replies on success:
// over a NoReplyCaller, Shutdown returns once the command is sent and no
// error reply came within ShutdownWait. Over a plain Caller it waits for a
// reply and reports a timeout as an error, because it cannot tell whether
// the command was sent.
func (a Agent) Shutdown(ctx context.Context, mode string) error {
	switch mode {
	case "powerdown", "reboot", "halt":
	default:
		return fmt.Errorf("qga: guest-shutdown: %w: mode %q (want powerdown, reboot or halt)", ErrInvalidArgument, mode)
	}
	args := struct {
		Mode string `json:"mode"`
	}{mode}
	if nr, ok := a.Caller.(NoReplyCaller); ok {
		return nr.CallNoReply(ctx, "guest-shutdown", args, ShutdownWait)
	}
	return a.Caller.Call(ctx, "guest-shutdown", args, nil)
}

// base64Decode decodes an agent's base64 field.
func base64Decode(command, field, s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("qga: %s: %w: %s: %w", command, ErrProtocol, field, err)
	}
	return b, nil
}

// checkString refuses strings the guest cannot take (C strings: no NUL).
func checkString(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalidArgument, what)
	}
	return nil
}
