//go:build linux

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// SandboxCommand is the argv[1] that selects SandboxMain in
// cmd/vmgate-guest: the shim every process of a sandboxed session starts
// as. `vmgate-guest __sandbox SPEC -- argv...` confines itself as SPEC (a
// confinement in JSON) says, then replaces itself with argv, so the
// confinement holds from the command's first instruction.
const SandboxCommand = "__sandbox"

// statusFD is the shim's status pipe (the run's ExtraFiles[0]): the shim
// writes why it failed there; a successful exec closes it (close-on-exec)
// with nothing written.
const statusFD = 3

// confinement is what the shim applies (see apply for the order).
type confinement struct {
	// UID and GID to run as; -1 keeps root (and its capabilities).
	UID int `json:"uid"`
	GID int `json:"gid"`
	// NetNS is the session's network namespace (a bind-mounted nsfs file); "" keeps the guest's.
	NetNS string `json:"netns,omitempty"`
	// Tmp is bind-mounted on /tmp in a mount namespace of the run's own when PrivateTmp.
	Tmp        string `json:"tmp,omitempty"`
	PrivateTmp bool   `json:"private_tmp,omitempty"`
	// ReadOnly, with PrivateTmp, makes every mount of that namespace
	// read-only but the Write paths and /tmp (mounts.go).
	ReadOnly bool `json:"read_only,omitempty"`
	// LandlockABI is the kernel's ABI when Landlock holds; 0 for no Landlock.
	LandlockABI int `json:"landlock_abi,omitempty"`
	// Read and Write are the paths beyond the system's the rules allow.
	Read  []string `json:"read,omitempty"`
	Write []string `json:"write,omitempty"`
	// TCP limits TCP bind and connect to its ports (Landlock ABI 4+).
	TCP *wire.TCPPorts `json:"tcp,omitempty"`
	// Scoped restricts signals and abstract sockets to the domain (ABI 6+).
	Scoped bool `json:"scoped,omitempty"`
	// RlimitAS and RlimitNPROC are set when not 0 (sessions without cgroup).
	RlimitAS    uint64 `json:"rlimit_as,omitempty"`
	RlimitNPROC uint64 `json:"rlimit_nproc,omitempty"`
	// cwd, with PrivateTmp, is entered once the run's mounts are made
	// (sessionMounts), so that the process's working directory is in its
	// own view of the file system (a write path's writable mount, the
	// session's /tmp), not the mount underneath. The thread road sets it
	// from the run's cwd; the shim from its own working directory.
	cwd string
}

// SandboxMain runs the shim: args are SPEC, "--", argv. It returns only on
// failure, with the exit status (127) after writing the reason to the
// status pipe (and stderr, when there is no pipe).
func SandboxMain(args []string) int {
	runtime.MemProfileRate = 0 // no profiling buckets: nothing to map under RLIMIT_AS
	syscall.CloseOnExec(statusFD)
	err := sandboxExec(args)
	we := &wire.Error{Code: wire.CodeFailed, Message: "sandbox: " + err.Error()}
	errors.As(err, &we)
	msg, _ := json.Marshal(we)
	if _, werr := unix.Write(statusFD, msg); werr != nil {
		fmt.Fprintln(os.Stderr, "vmgate-guest:", we.Message)
	}
	return 127
}

func sandboxExec(args []string) error {
	if len(args) < 3 || args[1] != "--" || args[2] == "" {
		return errors.New("usage: " + SandboxCommand + " SPEC -- argv...")
	}
	var c confinement
	dec := json.NewDecoder(strings.NewReader(args[0]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	argv := args[2:]
	// Namespaces and credentials below are per thread: everything up to
	// the exec runs on this one.
	runtime.LockOSThread()
	parent := os.Getppid()
	if c.PrivateTmp {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("cwd: %w", err)
		}
		c.cwd = wd
	}
	if err := c.apply(); err != nil {
		return err
	}
	if c.UID >= 0 {
		// A change of uid clears the parent-death signal: set it again, and
		// give up if the parent went away meanwhile.
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
			return fmt.Errorf("pdeathsig: %w", err)
		}
		if os.Getppid() != parent {
			return errors.New("vmgate-guest went away")
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return notFoundf("%v", err)
	}
	// The rlimits come last: RLIMIT_AS would leave the Go runtime no room
	// to map memory for the steps above.
	err = limitedExec(path, argv, []rlimitSetting{{unix.RLIMIT_NPROC, c.RlimitNPROC}, {unix.RLIMIT_AS, c.RlimitAS}})
	if errors.Is(err, syscall.ENOENT) {
		return notFoundf("%v", err)
	}
	return err
}

// confinement is what every run of the sandboxed session m applies.
func (m meta) confinement() confinement {
	e := m.Enforced
	c := confinement{UID: -1, GID: -1, NetNS: m.NetNS, Tmp: e.Tmp, PrivateTmp: e.PrivateTmp, ReadOnly: e.ReadOnlyOutside,
		Read: m.Sandbox.FS.Read, Write: append([]string{m.Workdir, e.Tmp}, m.Sandbox.FS.Write...),
		Scoped: len(e.Landlock.Scoped) > 0}
	if e.User == wire.UserSession {
		c.UID, c.GID = e.UID, e.GID
	}
	if e.Landlock.FS {
		c.LandlockABI = e.Landlock.ABI
	}
	if e.Landlock.TCP {
		c.TCP = m.Sandbox.TCP
	}
	if m.Tracking != wire.TrackCgroup {
		c.RlimitAS, c.RlimitNPROC = uint64(m.Limits.MemoryMB<<20), uint64(m.Limits.Pids)
	}
	return c
}

// sandboxEnv sets HOME to the workdir and TMPDIR to the private temporary
// directory (as /tmp when that is mounted there), unless the request set them.
func sandboxEnv(env []string, m meta, asked map[string]string) []string {
	tmp := m.Enforced.Tmp
	if m.Enforced.PrivateTmp {
		tmp = "/tmp"
	}
	for _, kv := range [][2]string{{"HOME", m.Workdir}, {"TMPDIR", tmp}} {
		if _, ok := asked[kv[0]]; ok {
			continue
		}
		env = slices.DeleteFunc(env, func(s string) bool { return strings.HasPrefix(s, kv[0]+"=") })
		env = append(env, kv[0]+"="+kv[1])
	}
	return env
}

// apply confines the calling thread, which must stay locked to the
// goroutine until the exec: the shim's road, which switches its own ids
// last. The rlimits are set by sandboxExec just before the exec.
func (c confinement) apply() error { return c.applyOnce("credentials", c.dropPrivileges) }

// applyThread confines the calling thread, which must stay locked to its
// goroutine for good, for a child it then forks (runSetup.startConfined):
// as apply, but the ids stay root's on the thread (the child switches
// them) and only the capabilities a child could keep are dropped here:
// the bounding and ambient sets and the inheritable one.
func (c confinement) applyThread() error { return c.applyOnce("capabilities", c.dropChildCaps) }

// applyOnce confines the calling thread for one exec or fork: the working
// directory is entered with the mounts, and nothing is kept.
func (c confinement) applyOnce(lastName string, last func() error) error {
	k, err := c.applySteps(lastName, last, true)
	k.close()
	return err
}

// kept is what a confined thread keeps for the runs it forks later
// (sessionThread): the descriptors its working directory is entered
// through (enterCwd), and the identity of the session's paths it opened.
type kept struct {
	attached []attachedTree
	ids      []pathID
}

func (k kept) close() {
	for _, a := range k.attached {
		unix.Close(a.tree)
	}
}

// applySteps confines the calling thread and runs last as its final
// step. The session's own paths are opened once (rulepaths.go), in the
// run's mount namespace and before anything is mounted in it, and both
// the Landlock ruleset and the mounts are made from those descriptors;
// the ruleset is enforced last before the final step. With enterNow the
// working directory (c.cwd) is entered with the mounts; else the caller
// enters each run's (kept.attached, enterCwd), and the caller closes kept
// either way (also on error).
func (c confinement) applySteps(lastName string, last func() error, enterNow bool) (k kept, err error) {
	capLastCap() // read now, in the guest's namespaces, for the final step
	ruleset := -1
	var flags uint32
	var paths rulePaths
	steps := []step{
		{"mount namespace", c.mountNamespace},
		{"sandbox paths", func() (err error) { paths, err = c.openPaths(); k.ids = c.idsOf(paths); return err }},
		{"landlock ruleset", func() (err error) { ruleset, flags, err = c.landlockRuleset(paths); return err }},
		{"network namespace", c.enterNetNS},
		{"mounts", func() (err error) {
			if k.attached, err = c.sessionMounts(paths); err == nil && enterNow {
				err = c.enterCwd(k.attached)
			}
			return err
		}},
		{"no_new_privs", noNewPrivs},
		{"landlock", func() error { return restrictSelf(ruleset, flags) }},
		{lastName, last},
	}
	defer func() {
		paths.close()
		if ruleset >= 0 {
			unix.Close(ruleset)
		}
	}()
	return k, runSteps(steps)
}

func (c confinement) enterNetNS() error {
	if c.NetNS == "" {
		return nil
	}
	fd, err := unix.Open(c.NetNS, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Setns(fd, unix.CLONE_NEWNET)
}

// landlockRuleset builds the session's Landlock ruleset: read and execute
// the system directories and /etc without its secrets, read and write the
// usual device files (all by name: they are root's), the session's own
// paths from their descriptors (rulePaths.addRules: read the Read paths,
// read and write, and move files within and between, the Write paths),
// and, with TCP, bind and connect only its ports. It returns -1 without
// Landlock.
func (c confinement) landlockRuleset(paths rulePaths) (int, uint32, error) {
	if c.LandlockABI == 0 {
		return -1, 0, nil
	}
	cfg := landlockConfig(c.LandlockABI, c.TCP != nil && c.LandlockABI >= 4, c.Scoped)
	if c.LandlockABI >= 7 {
		cfg = cfg.EnableLoggingForSubprocesses() // denials after the exec reach the audit log
	}
	rules := []landlock.Rule{
		landlock.RODirs(systemRead...).IgnoreIfMissing(),
		landlock.RWFiles(systemDevices...).IgnoreIfMissing(),
	}
	for _, p := range readableBelow("/etc", etcSecrets) {
		rules = append(rules, readRule(p))
	}
	if cfg.HandledAccessNet != 0 {
		for _, p := range c.TCP.Bind {
			rules = append(rules, landlock.BindTCP(p))
		}
		for _, p := range c.TCP.Connect {
			rules = append(rules, landlock.ConnectTCP(p))
		}
	}
	fd, flags, err := cfg.NewRulesetFD(rules...)
	if err == nil && fd < 0 {
		err = errors.New("nothing to restrict") // cannot happen: every ABI handles file rights
	}
	if err != nil {
		return -1, 0, err
	}
	if err := paths.addRules(fd, uint64(cfg.HandledAccessFS)); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, flags, nil
}

// restrictSelf enforces the ruleset on the calling thread (the one that
// execs; no_new_privs is set); -1 does nothing.
func restrictSelf(ruleset int, flags uint32) error {
	if ruleset < 0 {
		return nil
	}
	return ll.LandlockRestrictSelf(ruleset, flags)
}

// readRule allows reading p, an entry of /etc: a directory's tree, or a
// file (a symlink is followed: only root writes /etc).
func readRule(p string) landlock.Rule {
	if st, err := os.Stat(p); err == nil && !st.IsDir() {
		return landlock.ROFiles(p).IgnoreIfMissing()
	}
	return landlock.RODirs(p).IgnoreIfMissing()
}

// noNewPrivs sets no_new_privs on the calling thread.
func noNewPrivs() error {
	return unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
}

// dropPrivileges switches to UID and GID with no supplementary groups and
// no capabilities in any set (bounding, ambient, inheritable, permitted,
// effective), and checks that it holds.
func (c confinement) dropPrivileges() error {
	if c.UID < 0 {
		return nil
	}
	if err := c.dropBounding(); err != nil {
		return err
	}
	// Raw system calls: on this thread only (the one that execs), not
	// through the runtime's stop-the-world for every thread, which costs
	// tens of milliseconds in an emulated guest.
	for _, sc := range []struct {
		name    string
		nr      uintptr
		a, b, c uintptr
	}{
		{"setgroups", unix.SYS_SETGROUPS, 0, 0, 0},
		{"setresgid", unix.SYS_SETRESGID, uintptr(c.GID), uintptr(c.GID), uintptr(c.GID)},
		{"setresuid", unix.SYS_SETRESUID, uintptr(c.UID), uintptr(c.UID), uintptr(c.UID)},
	} {
		if _, _, errno := unix.RawSyscall(sc.nr, sc.a, sc.b, sc.c); errno != 0 {
			return fmt.Errorf("%s: %w", sc.name, errno)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, d := range data {
		if d.Effective|d.Permitted|d.Inheritable != 0 {
			return fmt.Errorf("capabilities left after the switch: %+v", data)
		}
	}
	if r, e, s := unix.Getresuid(); r != c.UID || e != c.UID || s != c.UID {
		return fmt.Errorf("uids after the switch are %d %d %d, not %d", r, e, s, c.UID)
	}
	return nil
}

// dropChildCaps leaves the calling thread root, with its effective and
// permitted capabilities (the fork needs them), but drops every capability
// a child could keep after switching to UID: the bounding and ambient
// sets, and the inheritable set. The switch from uid 0 to UID clears the
// child's permitted and effective sets; with these empty, and
// no_new_privs, nothing gives them back.
func (c confinement) dropChildCaps() error {
	if c.UID < 0 {
		return nil
	}
	if err := c.dropBounding(); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// dropBounding checks that UID and GID are unprivileged and clears the
// calling thread's bounding and ambient capability sets.
func (c confinement) dropBounding() error {
	if c.UID == 0 || c.GID <= 0 {
		return fmt.Errorf("uid %d / gid %d: want an unprivileged uid and gid", c.UID, c.GID)
	}
	for i := 0; i <= capLastCap(); i++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(i), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", i, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	return nil
}

// capLastCap is the highest capability number the kernel knows, read once
// per process: applySteps reads it before it enters the session's
// namespaces, where /proc/sys is looked up in the guest's own network
// namespace (in the session's, on a TCG guest, the read took 5 to 8 ms).
var capLastCap = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 && n < 64 {
			return n
		}
	}
	return 63 // dropping an unknown one fails with EINVAL, which is skipped
})
