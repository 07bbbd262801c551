package wire

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// NetMode is a sandboxed session's network.
type NetMode string

// Network modes, tightest first.
const (
	// NetNone: a network namespace of the session's own with only its
	// loopback interface, up. Nothing outside the session is reachable
	// over IP, not even the guest's own services.
	NetNone NetMode = "none"
	// NetLoopback asks for the guest's loopback services and nothing
	// beyond. A stock kernel cannot share one loopback between network
	// namespaces, nor filter addresses without a firewall or eBPF, so it
	// is enforced as NetNone (tighter than asked, never looser) and the
	// report says so.
	NetLoopback NetMode = "loopback"
	// NetHost: the guest's own network namespace.
	NetHost NetMode = "host"
)

// UserMode is whose uid a sandboxed session's processes run as.
type UserMode string

// User modes, tightest first.
const (
	// UserSession: an unprivileged uid and gid of the session's own,
	// without capabilities.
	UserSession UserMode = "session"
	// UserRoot: root with its capabilities (the loosest: a root process can
	// leave the session's cgroup and escape the rest).
	UserRoot UserMode = "root"
)

// Feature names a part of the confinement a kernel may lack. A request
// lists in Sandbox.BestEffort the features it accepts to go without;
// every other one is required, and a guest that lacks it refuses the
// session (CodeRefused, ReasonSandboxUnavailable) naming it.
type Feature string

// The features.
const (
	// FeatureLandlock: filesystem rules through Landlock (ABI 1 or later).
	FeatureLandlock Feature = "landlock"
	// FeatureLandlockTCP: Landlock TCP port rules (ABI 4 or later); only
	// needed when Sandbox.TCP is set.
	FeatureLandlockTCP Feature = "landlock_tcp"
	// FeatureNetNS: a network namespace (for NetNone and NetLoopback).
	FeatureNetNS Feature = "netns"
	// FeatureMountNS: a mount namespace with a private /tmp. Without it
	// the private temporary directory is still there (TMPDIR), and /tmp is
	// not writable.
	FeatureMountNS Feature = "mountns"
	// FeatureCgroup: membership and limits through a cgroup v2 group the
	// session's processes cannot leave. Without it a session's processes
	// are found by their uid (UserSession) or by a secret marker (UserRoot),
	// and limits are rlimits.
	FeatureCgroup Feature = "cgroup"
)

// Features lists every Feature, in a fixed order.
func Features() []Feature {
	return []Feature{FeatureLandlock, FeatureLandlockTCP, FeatureNetNS, FeatureMountNS, FeatureCgroup}
}

// Sandbox limits of the request.
const (
	MaxSandboxPaths = 64   // entries in each of FS.Read and FS.Write
	MaxPathLen      = 4096 // bytes in one path
	MaxPorts        = 64   // entries in each of TCP.Bind and TCP.Connect
)

// Sandbox is the confinement a session asks for (SessionCreate.Sandbox).
// The zero value of each field is the tightest: net none, user session,
// no extra paths, everything required.
type Sandbox struct {
	Net  NetMode  `json:"net,omitempty"`
	User UserMode `json:"user,omitempty"`
	// FS adds paths to what the session may read (and execute) or write,
	// beyond the system directories (read) and its own directories (write).
	FS FSAccess `json:"fs,omitzero"`
	// TCP, when set, limits TCP bind and connect to the listed ports
	// (Landlock ABI 4 or later); nil leaves TCP as the network mode has it.
	TCP *TCPPorts `json:"tcp,omitempty"`
	// BestEffort lists the features the session may go without.
	BestEffort []Feature `json:"best_effort,omitempty"`
}

// FSAccess lists extra paths: absolute, clean, without symlinks.
type FSAccess struct {
	Read  []string `json:"read,omitempty"`
	Write []string `json:"write,omitempty"`
}

// TCPPorts are the TCP ports a session may bind and connect to.
type TCPPorts struct {
	Bind    []uint16 `json:"bind,omitempty"`
	Connect []uint16 `json:"connect,omitempty"`
}

// ErrInvalidSandbox is wrapped by every Sandbox.Validate error.
var ErrInvalidSandbox = errors.New("invalid sandbox")

// Normalized fills the defaults (net none, user session) and returns a copy
// with sorted, de-duplicated lists.
func (s Sandbox) Normalized() Sandbox {
	if s.Net == "" {
		s.Net = NetNone
	}
	if s.User == "" {
		s.User = UserSession
	}
	s.FS.Read = sortedUnique(s.FS.Read)
	s.FS.Write = sortedUnique(s.FS.Write)
	if s.TCP != nil {
		s.TCP = &TCPPorts{Bind: sortedUnique(s.TCP.Bind), Connect: sortedUnique(s.TCP.Connect)}
	}
	s.BestEffort = sortedUnique(s.BestEffort)
	return s
}

func sortedUnique[T ~string | ~uint16](in []T) []T {
	if len(in) == 0 {
		return nil
	}
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

// Validate checks the request without side effects: known modes and
// features, at most MaxSandboxPaths absolute clean paths per list (no NUL,
// no "..", at most MaxPathLen bytes), at most MaxPorts ports per list,
// connect ports not 0.
func (s Sandbox) Validate() error {
	switch s.Net {
	case "", NetNone, NetLoopback, NetHost:
	default:
		return fmt.Errorf("%w: net %q (want none, loopback or host)", ErrInvalidSandbox, s.Net)
	}
	switch s.User {
	case "", UserSession, UserRoot:
	default:
		return fmt.Errorf("%w: user %q (want session or root)", ErrInvalidSandbox, s.User)
	}
	for _, l := range []struct {
		name  string
		paths []string
	}{{"fs.read", s.FS.Read}, {"fs.write", s.FS.Write}} {
		if len(l.paths) > MaxSandboxPaths {
			return fmt.Errorf("%w: %s has %d paths; the limit is %d", ErrInvalidSandbox, l.name, len(l.paths), MaxSandboxPaths)
		}
		for i, p := range l.paths {
			if err := ValidateSandboxPath(p); err != nil {
				return fmt.Errorf("%w: %s[%d]: %w", ErrInvalidSandbox, l.name, i, err)
			}
		}
	}
	if s.TCP != nil {
		if len(s.TCP.Bind) > MaxPorts || len(s.TCP.Connect) > MaxPorts {
			return fmt.Errorf("%w: tcp lists at most %d ports each", ErrInvalidSandbox, MaxPorts)
		}
		if slices.Contains(s.TCP.Connect, 0) {
			return fmt.Errorf("%w: tcp.connect port 0", ErrInvalidSandbox)
		}
	}
	for _, f := range s.BestEffort {
		if !slices.Contains(Features(), f) {
			return fmt.Errorf("%w: best_effort %q (want some of %s)", ErrInvalidSandbox, f, featureList())
		}
	}
	return nil
}

func featureList() string {
	features := Features()
	s := make([]string, len(features))
	for i, f := range features {
		s[i] = string(f)
	}
	return strings.Join(s, ", ")
}

// ValidateSandboxPath accepts an absolute, clean path of at most MaxPathLen
// bytes without NUL: "/srv/data", not "srv", "/srv/../etc" or "/srv/".
func ValidateSandboxPath(p string) error {
	switch {
	case p == "":
		return errors.New("empty path")
	case len(p) > MaxPathLen:
		return fmt.Errorf("path is %d bytes; the limit is %d", len(p), MaxPathLen)
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("path contains NUL")
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is not absolute", p)
	case path.Clean(p) != p:
		return fmt.Errorf("path %q is not clean (want %q)", p, path.Clean(p))
	}
	return nil
}

// Allows reports whether the request accepts going without f.
func (s Sandbox) Allows(f Feature) bool { return slices.Contains(s.BestEffort, f) }

// Reasons a session create is refused for its sandbox (Error.Reason).
const (
	// ReasonSandboxUnavailable: the guest's kernel lacks a required feature.
	ReasonSandboxUnavailable = "sandbox feature unavailable"
)

// Membership says how a session's processes are known to be its own.
type Membership string

// Membership kinds, strongest first.
const (
	// MemberCgroup: the session's cgroup v2 group, owned by root, which an
	// unprivileged process cannot leave.
	MemberCgroup Membership = "cgroup"
	// MemberUID: the session's own uid, which its processes cannot change.
	MemberUID Membership = "uid"
	// MemberSecret: an environment marker carrying a per-session secret
	// that only vmgate-guest and the session's processes hold (never a
	// call's arguments). A root process can clear it.
	MemberSecret Membership = "secret"
)

// Enforced is what holds for a session on this guest's kernel, reported by
// session create and list. Everything a session asked for and did not get
// is named in NotEnforced, in plain words.
type Enforced struct {
	// Sandboxed is false for a session created without a Sandbox: its
	// processes run as root, unconfined (only tracked and limited).
	Sandboxed bool     `json:"sandboxed"`
	User      UserMode `json:"user,omitempty"`
	UID       int      `json:"uid"`
	GID       int      `json:"gid"`
	// NoNewPrivs: setuid bits and file capabilities grant nothing.
	NoNewPrivs bool `json:"no_new_privs"`
	// Capabilities is "none" (bounding, inheritable and ambient sets
	// cleared) or "all" (root's).
	Capabilities string         `json:"capabilities"`
	Landlock     LandlockReport `json:"landlock"`
	Net          NetReport      `json:"net"`
	// PrivateTmp: /tmp is the session's own directory (a mount namespace).
	PrivateTmp bool `json:"private_tmp"`
	// ReadOnlyOutside: in the session's mount namespace every mount is
	// read-only but its write paths (its workdir, its temporary directory
	// on /tmp, the extra write paths): nothing outside them can be
	// written, truncated, chmod'ed, chown'ed, given an xattr, linked or
	// renamed, whatever Landlock's ABI handles.
	ReadOnlyOutside bool `json:"read_only_outside"`
	// HeldBy names, per right (read, execute, write, create, remove,
	// rename, link, truncate, chmod, chown, xattr, utime, ioctl_dev), what
	// denies it outside the session's paths: HeldLandlock, HeldMount,
	// HeldBoth, HeldUID (only the session's uid and the files' modes) or,
	// for a root session without either, HeldNothing.
	HeldBy map[string]string `json:"held_by,omitempty"`
	// WriteBlocked lists the extra write paths the sandbox allows but
	// the session's uid cannot write for the files' own permissions.
	WriteBlocked []BlockedPath `json:"write_blocked,omitempty"`
	// Tmp is the session's private temporary directory (TMPDIR).
	Tmp    string       `json:"tmp,omitempty"`
	Cgroup CgroupReport `json:"cgroup"`
	// Membership is how the session's processes are found (and killed).
	Membership Membership `json:"membership"`
	// NotEnforced: one sentence per thing asked for that does not hold.
	NotEnforced []string `json:"not_enforced,omitempty"`
}

// LandlockReport is the session's Landlock domain.
type LandlockReport struct {
	// ABI is the kernel's Landlock ABI version; 0 without Landlock.
	ABI int `json:"abi"`
	// FS: filesystem rules are enforced.
	FS bool `json:"fs"`
	// Rights are the filesystem access rights handled (denied unless a
	// rule allows them), by their Landlock names: execute, write_file, ...
	Rights []string `json:"rights,omitempty"`
	// Unhandled are rights the kernel's ABI lacks (not restricted here):
	// truncate before ABI 3, ioctl_dev before 5, ...
	Unhandled []string `json:"unhandled,omitempty"`
	// TCP: TCP bind and connect are limited to Sandbox.TCP's ports.
	TCP bool `json:"tcp"`
	// Scoped are the IPC scopes restricted (ABI 6): signal, abstract_unix_socket.
	Scoped []string `json:"scoped,omitempty"`
	// Read are the trees the rules let the session read and execute: the
	// system directories the guest has, /etc (without its secret files:
	// shadow, gshadow, sudoers, private keys), and the extra read paths;
	// the usual device files (/dev/null, /dev/tty, ...) are read-write.
	Read []string `json:"read,omitempty"`
	// Write are the trees it may write: its workdir, its temporary
	// directory and the extra write paths.
	Write []string `json:"write,omitempty"`
}

// NetReport is the session's network.
type NetReport struct {
	// Mode is what was asked for.
	Mode NetMode `json:"mode"`
	// Namespace: the session has a network namespace of its own.
	Namespace bool `json:"namespace"`
	// LoopbackUp: its loopback interface is up.
	LoopbackUp bool `json:"loopback_up"`
	// GuestLoopback: the guest's own loopback services are reachable.
	GuestLoopback bool `json:"guest_loopback"`
}

// CgroupReport is the session's cgroup.
type CgroupReport struct {
	// Path is the group under the cgroup v2 mount ("/vmgate/<id>"); "" without one.
	Path string `json:"path,omitempty"`
	// Controllers enabled for it (cpu, memory, pids).
	Controllers []string `json:"controllers,omitempty"`
	// Limits says how Limits hold: "cgroup", "rlimit" or "none".
	Limits string `json:"limits"`
}

// BlockedPath is a write path the session's uid cannot write, and why.
type BlockedPath struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// What holds a right outside a sandboxed session's paths (Enforced.HeldBy).
const (
	HeldLandlock = "landlock"
	HeldMount    = "read-only mount"
	HeldBoth     = "landlock+read-only mount"
	HeldUID      = "unix permissions only"
	HeldNothing  = "nothing (root)"
)
