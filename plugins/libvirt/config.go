// Package libvirt is vmgate's libvirt backend: a hypervisor.Driver over
// go-libvirt (libvirt's RPC protocol, pure Go) whose VMs are libvirt's
// domains.
//
// Domains: ConnectListAllDomains, filtered by a name glob and/or a metadata
// element namespace from the Config. Status is the domain state plus a
// guest-ping. Exec, files and agent info go through QEMUDomainAgentCommand
// (with its timeout argument set from the call's deadline) and reuse
// guest/qga's Agent logic through a qga.Caller, so the exec semantics are
// the QEMU driver's. Power: shutdown and reboot ask the guest agent, then
// ACPI (DomainShutdownFlags / DomainReboot with both methods); reset is
// DomainReset; stop is DomainDestroy; start is DomainCreate, which needs a
// persistent domain: a transient domain this driver destroyed is gone from
// libvirt, and starting it again is hypervisor.ErrNotSupported.
//
// Connections: one go-libvirt connection (safe for concurrent calls: it
// matches replies to requests by serial) is shared by all calls and
// re-dialled after it fails. go-libvirt calls take no context, so every
// call runs in its own goroutine and the driver returns when the caller's
// deadline passes even if libvirtd does not answer. Agent calls are
// serialised per domain (libvirt runs one agent job per domain anyway), so a
// domain whose agent hangs holds one libvirtd request slot, bounded by the
// timeout given to libvirt, and never delays another domain. libvirtd
// serves at most max_client_requests (default 5) calls of one connection at
// once: more than four domains with hung agents at the same moment can
// delay other calls up to those timeouts.
package libvirt

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/agentexec"
)

// Driver defaults.
const (
	// DefaultSocket is the system libvirtd's read-write socket.
	DefaultSocket = "/var/run/libvirt/libvirt-sock"
	// DefaultTCPPort is libvirtd's unencrypted TCP port.
	DefaultTCPPort = "16509"
	// DefaultExecTimeout bounds a command whose request sets no Timeout.
	DefaultExecTimeout = agentexec.DefaultExecTimeout
	// DefaultInfoTTL is how long a guest-info answer is trusted for the exec preflight.
	DefaultInfoTTL = agentexec.DefaultInfoTTL
	// DefaultAgentTimeout is the agent timeout given to libvirt when the
	// call's context has no deadline.
	DefaultAgentTimeout = 30 * time.Second
	// DefaultDialTimeout bounds connecting to libvirtd.
	DefaultDialTimeout = 10 * time.Second
	// lookupTTL is how long a domain handle (and its filter check) is reused
	// before the driver looks the name up again.
	lookupTTL = 5 * time.Second
	// statusPing bounds the guest-ping of Status.
	statusPing = 2 * time.Second
)

// Config configures the Driver.
type Config struct {
	// URI says where libvirtd is, in libvirt's own URI syntax:
	//   ""                                    the local system daemon (DefaultSocket)
	//   qemu:///system, qemu+unix:///system   the same
	//   qemu:///system?socket=/path/sock      a local daemon on another socket
	//   qemu:///session?socket=/path/sock     a session daemon (socket required)
	//   qemu+tcp://host[:port]/system         libvirtd's TCP listener (no TLS, no SASL)
	// qemu+ssh, qemu+tls, qemu+libssh(2) and qemu+ext are not supported
	// (go-libvirt has no transport for them): tunnel the socket instead,
	// e.g. ssh -L /tmp/remote-libvirt:/var/run/libvirt/libvirt-sock host,
	// and use qemu:///system?socket=/tmp/remote-libvirt.
	URI string
	// NameGlob, when set, lists only domains whose name matches it
	// (path.Match syntax: *, ?, [a-z]).
	NameGlob string
	// MetadataURI, when set, lists only domains with a <metadata> element
	// in this XML namespace, e.g. <vmgate:vm xmlns:vmgate="https://vmgate.dev/libvirt"/>.
	MetadataURI string
	// ExecTimeout bounds a command whose request has no Timeout.
	ExecTimeout time.Duration
	// InfoTTL is how long guest-info is cached for the exec preflight.
	InfoTTL time.Duration
	// DialTimeout bounds connecting to libvirtd.
	DialTimeout time.Duration
	// HelperSilenceLimit is how long a resident helper may send nothing
	// while it owes an answer before its channel's connection is given up
	// (helperchan.Options.SilenceLimit). Zero means mux.DefaultSilenceLimit
	// (30 s); otherwise between helperchan.MinSilenceLimit and
	// helperchan.MaxSilenceLimit.
	HelperSilenceLimit time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// endpoint is a parsed Config.URI.
type endpoint struct {
	network string // "unix" or "tcp"
	address string // socket path or host:port
	name    string // the URI given to ConnectOpen: qemu:///system or qemu:///session
}

// parseURI checks and parses a Config.URI.
func parseURI(raw string) (endpoint, error) {
	bad := func(format string, a ...any) (endpoint, error) {
		return endpoint{}, fmt.Errorf("%w: "+format, append([]any{hypervisor.ErrInvalidArgument}, a...)...)
	}
	if raw == "" {
		return endpoint{network: "unix", address: DefaultSocket, name: "qemu:///system"}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad("%v", err)
	}
	switch u.Scheme {
	case "qemu+ssh", "qemu+libssh", "qemu+libssh2", "qemu+tls", "qemu+ext":
		return endpoint{}, fmt.Errorf("%q: %w: go-libvirt has no %s transport; tunnel the socket and use qemu:///system?socket=",
			raw, hypervisor.ErrNotSupported, strings.TrimPrefix(u.Scheme, "qemu+"))
	}
	if u.User != nil || u.Fragment != "" || u.Opaque != "" {
		return bad("%q: user info, fragments and opaque URIs are not supported", raw)
	}
	if u.Path != "/system" && u.Path != "/session" {
		return bad("%q: path must be /system or /session", raw)
	}
	ep := endpoint{name: "qemu://" + u.Path}
	q := u.Query()
	for k := range q {
		if k != "socket" {
			return bad("%q: unsupported parameter %q", raw, k)
		}
	}
	switch u.Scheme {
	case "qemu", "qemu+unix":
		if u.Host != "" {
			return bad("%q: a remote host needs qemu+tcp://", raw)
		}
		ep.network, ep.address = "unix", DefaultSocket
		if s, ok := q["socket"]; ok {
			if len(s) != 1 || !path.IsAbs(s[0]) || strings.ContainsRune(s[0], 0) {
				return bad("%q: socket must be one absolute path", raw)
			}
			ep.address = s[0]
		} else if u.Path == "/session" {
			return bad("%q: a session daemon needs ?socket=", raw)
		}
	case "qemu+tcp":
		if u.Host == "" {
			return bad("%q: qemu+tcp needs a host", raw)
		}
		if len(q) > 0 {
			return bad("%q: socket= is for unix URIs", raw)
		}
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = DefaultTCPPort
		}
		ep.network, ep.address = "tcp", net.JoinHostPort(host, port)
	default:
		return bad("%q: unknown scheme %q (want qemu, qemu+unix or qemu+tcp)", raw, u.Scheme)
	}
	return ep, nil
}
