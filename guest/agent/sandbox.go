//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// kernel is what this guest's kernel offers a sandbox, probed once per
// session create (probeKernel) and handed to plan, which is pure.
type kernel struct {
	// landlockABI is the Landlock ABI version; 0 without Landlock.
	landlockABI int
	netns       bool // network namespaces
	mountns     bool // mount namespaces
	mountAPI    bool // open_tree, move_mount and mount_setattr (Linux 5.12)
	cgroup      bool // a writable cgroup v2 mount
}

// probeKernel asks the running kernel.
func (a *Agent) probeKernel() kernel {
	k := kernel{cgroup: a.cgroupUsable()}
	if v, err := ll.LandlockGetABIVersion(); err == nil && v > 0 {
		k.landlockABI = v
	}
	_, err := os.Stat("/proc/self/ns/net")
	k.netns = err == nil
	_, err = os.Stat("/proc/self/ns/mnt")
	k.mountns = err == nil
	// A bad descriptor is EBADF where mount_setattr exists, ENOSYS where not.
	err = unix.MountSetattr(-1, "", unix.AT_EMPTY_PATH, &unix.MountAttr{})
	k.mountAPI = !errors.Is(err, unix.ENOSYS)
	return k
}

// landlockPresets are go-landlock's configurations per ABI version, index
// v-1 for version v; a kernel newer than the newest uses the newest.
var landlockPresets = []landlock.Config{landlock.V1, landlock.V2, landlock.V3, landlock.V4, landlock.V5,
	landlock.V6, landlock.V7, landlock.V8, landlock.V9, landlock.V10, landlock.V11}

// landlockConfig is the configuration a session's runs restrict themselves
// with on a kernel of ABI abi (at least 1): every filesystem right that ABI
// handles (the best-effort downgrade, done here so the report can say what
// holds), TCP bind and connect when tcp is set and the ABI has them (4+),
// and, for root sessions, the signal and abstract socket scopes (6+): a
// session uid is already kept from signalling other uids by the kernel.
func landlockConfig(abi int, tcp, scoped bool) landlock.Config {
	p := landlockPresets[min(abi, len(landlockPresets))-1]
	c := landlock.Config{HandledAccessFS: p.HandledAccessFS}
	if tcp {
		c.HandledAccessNet = p.HandledAccessNet & (ll.AccessNetBindTCP | ll.AccessNetConnectTCP)
	}
	if scoped {
		c.Scoped = p.Scoped
	}
	return c
}

// setNames turns go-landlock's "{a,b}" rendering of a set into names.
func setNames(s fmt.Stringer) []string {
	v := strings.Trim(s.String(), "{}")
	if v == "" || v == "∅" {
		return nil
	}
	return strings.Split(v, ",")
}

// plan decides what holds for a sandboxed session on kernel k: the
// Enforced report, or a CodeRefused error naming every required feature
// k lacks (nothing has been changed yet). sb is normalized.
func plan(sb wire.Sandbox, k kernel) (wire.Enforced, error) {
	e := wire.Enforced{Sandboxed: true, User: sb.User, NoNewPrivs: true, Net: wire.NetReport{Mode: sb.Net}}
	var missing, notes []string
	lack := func(f wire.Feature, why, without string) {
		if sb.Allows(f) {
			notes = append(notes, why+": "+without)
		} else {
			missing = append(missing, string(f)+" ("+why+")")
		}
	}
	e.Capabilities = "none"
	if sb.User == wire.UserRoot {
		e.Capabilities = "all"
		notes = append(notes, "user root: the session's processes run as root with root's capabilities; only Landlock and the namespaces confine them (they can signal and trace processes outside the session unless Landlock ABI 6 scopes them, and without Landlock leave its cgroup)")
	}
	e.Landlock.ABI = k.landlockABI
	if k.landlockABI >= 1 {
		tcp := sb.TCP != nil && k.landlockABI >= 4
		c := landlockConfig(k.landlockABI, tcp, sb.User == wire.UserRoot)
		e.Landlock.FS, e.Landlock.TCP = true, tcp
		e.Landlock.Rights = setNames(c.HandledAccessFS)
		e.Landlock.Unhandled = setNames(landlock.V11.HandledAccessFS &^ c.HandledAccessFS)
		e.Landlock.Scoped = setNames(c.Scoped)
	} else {
		lack(wire.FeatureLandlock, "this kernel has no Landlock (Linux 5.13 or later, with landlock in the lsm= list)",
			"file access is limited only by the session's uid")
	}
	if sb.TCP != nil && !e.Landlock.TCP {
		lack(wire.FeatureLandlockTCP, fmt.Sprintf("TCP port rules need Landlock ABI 4 (Linux 6.7); this kernel has ABI %d", k.landlockABI),
			"TCP ports are not limited")
	}
	switch {
	case sb.Net == wire.NetHost:
		e.Net.GuestLoopback = true
	case k.netns:
		e.Net.Namespace, e.Net.LoopbackUp = true, true
		if sb.Net == wire.NetLoopback {
			notes = append(notes, "net loopback: the session has a loopback of its own, not the guest's (a stock kernel cannot share a loopback between network namespaces or filter addresses without a firewall), so it holds as net none")
		}
	default:
		e.Net.GuestLoopback = true
		lack(wire.FeatureNetNS, "this kernel has no network namespaces", "the session has the guest's network")
	}
	switch {
	case k.mountns && k.mountAPI:
		e.PrivateTmp, e.ReadOnlyOutside = true, true
	case k.mountns:
		e.PrivateTmp = true
		lack(wire.FeatureMountNS, "this kernel has no mount_setattr (Linux 5.12)",
			"the file system outside the session's paths is not mounted read-only: Landlock and the uid alone hold writes there")
	default:
		lack(wire.FeatureMountNS, "this kernel has no mount namespaces",
			"/tmp is the guest's (not writable from the session); TMPDIR is the session's private directory")
	}
	switch {
	case k.cgroup:
		e.Membership, e.Cgroup.Limits = wire.MemberCgroup, "cgroup"
	default:
		e.Membership, e.Cgroup.Limits = wire.MemberUID, "rlimit"
		without := "processes are found by the session's uid, which they cannot change; limits are rlimits"
		if sb.User == wire.UserRoot {
			e.Membership = wire.MemberSecret
			without = "processes are found by a secret marker, which a root process can clear; limits are rlimits"
		}
		lack(wire.FeatureCgroup, "this guest has no writable cgroup v2", without)
	}
	if len(missing) > 0 {
		return wire.Enforced{}, refused(wire.ReasonSandboxUnavailable,
			"this guest lacks what the sandbox requires: %s; list the feature in best_effort to go without it",
			strings.Join(missing, "; "))
	}
	e.NotEnforced = notes
	e.HeldBy = heldBy(e, sb.User)
	return e, nil
}

// heldRights are the keys of wire.Enforced.HeldBy, with the lowest
// Landlock ABI that handles each (0: none does).
var heldRights = []struct {
	name string
	abi  int
	ro   bool // a read-only mount denies it
}{
	{"read", 1, false}, {"execute", 1, false}, {"write", 1, true}, {"create", 1, true},
	{"remove", 1, true}, {"rename", 1, true}, {"link", 1, true}, {"truncate", 3, true},
	{"chmod", 0, true}, {"chown", 0, true}, {"xattr", 0, true}, {"utime", 0, true},
	{"ioctl_dev", 5, false},
}

// heldBy says, per right, what denies it outside the session's paths. A
// read-only mount holds against a root session only under Landlock, which
// keeps it from remounting.
func heldBy(e wire.Enforced, user wire.UserMode) map[string]string {
	out := make(map[string]string, len(heldRights))
	for _, r := range heldRights {
		byLL := e.Landlock.FS && r.abi > 0 && e.Landlock.ABI >= r.abi
		ro := r.ro && e.ReadOnlyOutside && (user != wire.UserRoot || e.Landlock.FS)
		switch {
		case byLL && ro:
			out[r.name] = wire.HeldBoth
		case byLL:
			out[r.name] = wire.HeldLandlock
		case ro:
			out[r.name] = wire.HeldMount
		case user == wire.UserRoot:
			out[r.name] = wire.HeldNothing
		default:
			out[r.name] = wire.HeldUID
		}
	}
	return out
}

// unsandboxed is the report of a session created without a Sandbox.
func unsandboxed(tracking wire.Tracking) wire.Enforced {
	e := wire.Enforced{User: wire.UserRoot, Capabilities: "all", Net: wire.NetReport{Mode: wire.NetHost, GuestLoopback: true},
		Membership: wire.MemberSecret, Cgroup: wire.CgroupReport{Limits: "rlimit"},
		NotEnforced: []string{"no sandbox was asked for: the session's processes run as root, unconfined (only tracked and limited)"}}
	if tracking == wire.TrackCgroup {
		e.Membership, e.Cgroup.Limits = wire.MemberCgroup, "cgroup"
	}
	return e
}

// systemRead are the system directories a sandboxed session may read and
// execute (missing ones are skipped). /etc is added entry by entry, without
// etcSecrets.
var systemRead = []string{"/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/run", "/proc", "/sys"}

// etcSecrets are the files under /etc a session may not read even where the
// uid would let it (a root session), as path.Match patterns.
var etcSecrets = []string{"/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
	"/etc/security/opasswd", "/etc/ssl/private", "/etc/ssh/ssh_host_*_key", "/etc/krb5.keytab", "/etc/wireguard",
	"/etc/NetworkManager/system-connections"}

// systemDevices are the device files a sandboxed session may read and write.
var systemDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/pts"}

// readableBelow lists the entries of dir a rule may cover whole: every
// entry but those matching a secret, and, for an entry holding a secret,
// its own entries in the same way. Symlinks are listed as they are (a rule
// covers the target, as the kernel resolves it, and only root writes /etc).
func readableBelow(dir string, secrets []string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		p := dir + "/" + e.Name()
		if slices.ContainsFunc(secrets, func(s string) bool { ok, _ := path.Match(s, p); return ok }) {
			continue
		}
		if e.IsDir() && slices.ContainsFunc(secrets, func(s string) bool { return strings.HasPrefix(s, p+"/") }) {
			out = append(out, readableBelow(p, secrets)...)
			continue
		}
		out = append(out, p)
	}
	return out
}
