//go:build linux

package agent

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A sandboxed run gets a mount namespace of its own (when the kernel has
// them) in which nothing propagates back to the guest. In it, with
// ReadOnly, every mount is read-only (mount_setattr MOUNT_ATTR_RDONLY,
// AT_RECURSIVE, from /) except clones of the session's write paths, bound
// back over themselves as they were (nosuid, nodev), and of its temporary
// directory, on /tmp: so writes, truncation, chmod, chown, xattrs, links
// and renames outside those paths fail with EROFS whatever Landlock's ABI
// handles (ABI 2 has no truncate right; no ABI has chmod, chown or
// xattrs). The clones are made from the paths' descriptors (open_tree) and
// attached onto them (move_mount), never by name. Device files stay
// usable: a read-only mount does not stop writes to a device.

// mountNamespace unshares the calling thread's mount namespace and makes
// every mount in it private.
func (c confinement) mountNamespace() error {
	if !c.PrivateTmp {
		return nil
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	return nil
}

// sessionMounts makes the run's view (see above) from the open paths and
// returns the descriptors a working directory is entered through
// (enterCwd), which the caller closes (also on error): with ReadOnly the
// writable clones, so that a cwd in a write path is in its writable mount
// (through the clone's own descriptor when a later mount hides its path,
// as the session's /tmp hides a workdir under the guest's /tmp); without,
// the guest's /tmp as it was before the session's was bound on it, so that
// a cwd below /tmp is the guest's, as it was before the bind.
func (c confinement) sessionMounts(paths rulePaths) ([]attachedTree, error) {
	if !c.PrivateTmp {
		return nil, nil
	}
	tmp, ok := paths.find(c.Tmp)
	if !ok {
		return nil, fmt.Errorf("the session's temporary directory %s is missing", c.Tmp)
	}
	if !c.ReadOnly || paths.writesRoot() {
		under, err := openNoFollowRaw("/tmp", unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil, fmt.Errorf("/tmp: %w", err)
		}
		return []attachedTree{{under, "/tmp"}}, bindTmp(tmp)
	}
	return readOnlyOutside(paths, tmp)
}

// attachedTree is a writable clone of the write path path, attached (or,
// without ReadOnly, the guest's /tmp under the session's).
type attachedTree struct {
	tree int
	path string
}

// enterCwd enters c.cwd: through the attached tree that holds it, when
// there is one, else by name. It sets the calling thread's working
// directory whole (a thread of its own mount namespace has its own): a
// confined thread that forks many runs enters each run's before its fork.
func (c confinement) enterCwd(attached []attachedTree) error {
	if c.cwd == "" {
		return nil
	}
	var best *attachedTree
	for i, a := range attached {
		if (c.cwd == a.path || strings.HasPrefix(c.cwd, a.path+"/")) && (best == nil || len(a.path) > len(best.path)) {
			best = &attached[i]
		}
	}
	if best == nil {
		if err := unix.Chdir(c.cwd); err != nil {
			return fmt.Errorf("cwd %s: %w", c.cwd, err)
		}
		return nil
	}
	if err := unix.Fchdir(best.tree); err != nil {
		return fmt.Errorf("cwd %s: %w", best.path, err)
	}
	if rest := strings.TrimPrefix(strings.TrimPrefix(c.cwd, best.path), "/"); rest != "" {
		if err := unix.Chdir(rest); err != nil {
			return fmt.Errorf("cwd %s: %w", c.cwd, err)
		}
	}
	return nil
}

// writesRoot reports whether "/" itself is a write path (nothing is
// outside the write paths then).
func (ps rulePaths) writesRoot() bool {
	_, ok := ps.find("/")
	return ok
}

// bindTmp binds the session's temporary directory on /tmp (nosuid, nodev)
// from its descriptor: the road of a kernel without mount_setattr.
func bindTmp(tmp rulePath) error {
	src := "/proc/thread-self/fd/" + strconv.Itoa(tmp.fd)
	if err := unix.Mount(src, "/tmp", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on /tmp: %w", tmp.path, err)
	}
	return unix.Mount("", "/tmp", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, "")
}

// readOnlyOutside clones the write paths and the temporary directory,
// makes every mount read-only, and attaches the clones (the temporary
// directory's on /tmp). It returns the attached clones, which the caller
// closes (also on error).
func readOnlyOutside(paths rulePaths, tmp rulePath) (attached []attachedTree, err error) {
	tmpDir, err := openNoFollowRaw("/tmp", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("/tmp: %w", err)
	}
	defer unix.Close(tmpDir)
	var targets []int
	for _, p := range append(paths.writable(tmp.path), tmp) {
		target := p.fd
		if p.path == tmp.path {
			target = tmpDir
		} else if nestedIn(p.path, attached) {
			continue // writable already: a clone of a write path above it has it
		}
		tree, err := cloneWritable(p)
		if err != nil {
			return attached, err
		}
		attached = append(attached, attachedTree{tree, p.path})
		targets = append(targets, target)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, &attr); err != nil {
		return attached, fmt.Errorf("making every mount read-only: %w", err)
	}
	for i, a := range attached {
		if err := unix.MoveMount(a.tree, "", targets[i], "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
			return attached, fmt.Errorf("attaching %s: %w", a.path, err)
		}
	}
	return attached, nil
}

// writable lists the write paths but skip, sorted, so that a directory
// comes before what lies below it.
func (ps rulePaths) writable(skip string) []rulePath {
	var out []rulePath
	for _, p := range ps {
		if p.write && p.path != skip {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b rulePath) int { return strings.Compare(a.path, b.path) })
	return out
}

// nestedIn reports whether p lies below one of the attached trees.
func nestedIn(p string, attached []attachedTree) bool {
	for _, a := range attached {
		if strings.HasPrefix(p, a.path+"/") {
			return true
		}
	}
	return false
}

// cloneWritable clones the mount tree at p's descriptor, detached, with
// the write path's mounts as they are (a read-only one stays so), nosuid
// and nodev.
func cloneWritable(p rulePath) (int, error) {
	tree, err := unix.OpenTree(p.fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
	if err != nil {
		return -1, fmt.Errorf("cloning %s: %w", p.path, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("nosuid, nodev on %s: %w", p.path, err)
	}
	return tree, nil
}
