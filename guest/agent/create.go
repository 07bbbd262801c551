//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// creation is one session create: named steps that each register how to
// undo themselves, run in order under the lock. Decisions (plan) come
// before any side effect.
type creation struct {
	a     *Agent
	k     kernel
	m     meta
	undos []func()
}

func (c *creation) run() error {
	took := func(name string, d time.Duration) { c.a.stepTook("create "+name, d) }
	return runStepsTimed([]step{
		{"plan", c.plan},
		{"layout", c.layout},
		{"ids", c.ids},
		{"write access", c.writeAccess},
		{"workdir", c.workdir},
		{"tmp", c.tmp},
		{"cgroup", c.cgroup},
		{"netns", c.netns},
		{"report", c.report},
		{"metadata", c.metadata},
	}, took)
}

// undo reverts the steps that ran, last first.
func (c *creation) undo() {
	for i := len(c.undos) - 1; i >= 0; i-- {
		c.undos[i]()
	}
}

func (c *creation) sandboxed() bool { return c.m.Sandbox != nil }

// plan fills the Enforced report or refuses what this guest cannot give.
func (c *creation) plan() error {
	if !c.k.cgroup && c.m.Limits.CPUPercent > 0 {
		return refused(wire.ReasonNoCgroupLimit, "cpu_percent needs cgroup v2, which this guest does not have")
	}
	if !c.sandboxed() {
		c.m.Enforced = unsandboxed(map[bool]wire.Tracking{true: wire.TrackCgroup, false: wire.TrackMarker}[c.k.cgroup])
		return nil
	}
	e, err := plan(*c.m.Sandbox, c.k)
	c.m.Enforced = e
	return err
}

// layout makes the state directories. A session uid must be able to walk
// to its own directories: the state root and the directories holding
// workdirs and temporary directories are 0711 (enter, not list), and
// every directory above the root must let others enter too.
func (c *creation) layout() error {
	a := c.a
	type dir struct {
		path string
		mode os.FileMode
	}
	dirs := []dir{{a.cfg.Root, 0o711}, {a.sessionsDir(), 0o711}, {a.metaDir(), 0o700}}
	if c.sandboxed() {
		dirs = append(dirs, dir{a.tmpDir(), 0o711}, dir{a.netnsDir(), 0o700})
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return err
		}
	}
	if c.m.Enforced.User != wire.UserSession || !c.sandboxed() {
		return nil
	}
	for dir := filepath.Dir(a.cfg.Root); ; dir = filepath.Dir(dir) {
		st, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is mode %04o: the session's uid cannot reach %s below it (it needs o+x)", dir, st.Mode().Perm(), a.cfg.Root)
		}
		if dir == "/" {
			return nil
		}
	}
}

// ids gives a session-user sandbox its own uid and gid.
func (c *creation) ids() error {
	if !c.sandboxed() || c.m.Enforced.User != wire.UserSession {
		return nil
	}
	taken := map[int]bool{}
	for uid := range c.a.loadIndex().byUID {
		taken[int(uid)] = true
	}
	id, err := c.a.allocateIDLocked(taken)
	if err != nil {
		return err
	}
	c.m.Enforced.UID, c.m.Enforced.GID = id, id
	return nil
}

// ownedDir makes dir with mode, owned by the session's uid and gid, by
// descriptor: made in its parent's descriptor, then opened without
// following a symlink and given its mode and owner through that.
func (c *creation) ownedDir(dir string, mode os.FileMode) error {
	pfd, err := openNoFollowRaw(filepath.Dir(dir), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	name := filepath.Base(dir)
	if err := unix.Mkdirat(pfd, name, uint32(mode)); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return &wire.Error{Code: wire.CodeExists, Message: dir + " exists (destroy the session first)"}
		}
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	c.undos = append(c.undos, func() { _ = removePath(dir) })
	fd, err := openBeneath(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, uint32(mode)); err != nil { // the umask must not narrow it
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	if err := unix.Fchown(fd, c.m.Enforced.UID, c.m.Enforced.GID); err != nil {
		return fmt.Errorf("chown %s: %w", dir, err)
	}
	return nil
}

func (c *creation) workdir() error {
	mode := os.FileMode(0o755)
	if c.sandboxed() {
		mode = 0o700
	}
	return c.ownedDir(c.m.Workdir, mode)
}

func (c *creation) tmp() error {
	if !c.sandboxed() {
		return nil
	}
	c.m.Enforced.Tmp = filepath.Join(c.a.tmpDir(), c.m.ID)
	return c.ownedDir(c.m.Enforced.Tmp, 0o700)
}

func (c *creation) cgroup() error {
	if !c.k.cgroup {
		return nil
	}
	controllers, err := c.a.createSessionCgroup(c.m.ID, c.m.Limits)
	if err != nil {
		return err
	}
	c.undos = append(c.undos, func() { _ = removeCgroupTree(c.a.sessionCgroup(c.m.ID)) })
	c.m.Tracking = wire.TrackCgroup
	c.m.Enforced.Cgroup.Path = "/" + cgroupParent + "/" + c.m.ID
	c.m.Enforced.Cgroup.Controllers = controllers
	return nil
}

func (c *creation) netns() error {
	if !c.sandboxed() || !c.m.Enforced.Net.Namespace {
		return nil
	}
	p := filepath.Join(c.a.netnsDir(), c.m.ID)
	if err := createNetNS(p); err != nil {
		return err
	}
	c.undos = append(c.undos, func() { _ = removeNetNS(p) })
	c.m.NetNS = p
	return nil
}

// report lists the paths the Landlock rules allow.
func (c *creation) report() error {
	if !c.sandboxed() || !c.m.Enforced.Landlock.FS {
		return nil
	}
	l := &c.m.Enforced.Landlock
	for _, p := range systemRead {
		if exists(p) {
			l.Read = append(l.Read, p)
		}
	}
	l.Read = append(append(l.Read, "/etc"), c.m.Sandbox.FS.Read...)
	l.Write = append([]string{c.m.Workdir, c.m.Enforced.Tmp}, c.m.Sandbox.FS.Write...)
	return nil
}

func (c *creation) metadata() error {
	if err := c.a.writeMetaLocked(c.m); err != nil {
		return err
	}
	c.undos = append(c.undos, func() { _ = os.Remove(c.a.metaPath(c.m.ID)) })
	return nil
}
