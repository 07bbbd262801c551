package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// A lab VM's disk: <dir>/disk.qcow2, a qcow2 overlay made at every Start
// on a blank base image (<StateDir>/images/blank-<N>M.qcow2, made once),
// attached as a virtio disk whose QMP node name is DiskNodeName. The guest
// formats it on first boot and mounts it at /data (guest/image's /init).
//
// The disk is what makes the VM snapshotable: QEMU keeps internal
// snapshots, the VM's memory and device state included, inside a qcow2
// image. The overlay lives as long as the VM: a driver's power stop and
// start keep it (and its snapshots); Stop (vmgate lab down) removes it, and
// the next Start makes a fresh one.

// DiskName is the overlay's file name in the VM directory.
const DiskName = "disk.qcow2"

// DiskNodeName is the disk's block node name in QEMU.
const DiskNodeName = "disk0"

// DefaultDiskMB is the disk's virtual size when Spec.DiskMB is 0.
const DefaultDiskMB = 64

// QEMUImgBinary makes the disk images (Debian package qemu-utils).
const QEMUImgBinary = "qemu-img"

// ErrNoQEMUImg: qemu-img is not on PATH.
var ErrNoQEMUImg = errors.New("qemu-img not found on PATH (Debian package qemu-utils)")

func (s Spec) diskMB() int {
	if s.DiskMB == 0 {
		return DefaultDiskMB
	}
	return s.DiskMB
}

// baseDisk returns the blank base image of sizeMB, creating it when it is
// missing: into a temporary file renamed into place, so concurrent starts
// see a whole image or none (the first rename wins; they are alike).
func baseDisk(ctx context.Context, qemuImg, stateDir string, sizeMB int) (string, error) {
	dir := filepath.Join(stateDir, "images")
	base := filepath.Join(dir, "blank-"+strconv.Itoa(sizeMB)+"M.qcow2")
	if fi, err := os.Stat(base); err == nil && fi.Mode().IsRegular() {
		return base, nil
	}
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".blank-*.qcow2")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if err := runQEMUImg(ctx, qemuImg, "create", "-q", "-f", "qcow2", tmp.Name(), strconv.Itoa(sizeMB)+"M"); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp.Name(), FileMode); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), base); err != nil {
		return "", err
	}
	return base, nil
}

// makeOverlay replaces dst with a fresh qcow2 overlay on base.
func makeOverlay(ctx context.Context, qemuImg, base, dst string) error {
	if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	tmp := dst + ".tmp"
	os.Remove(tmp)
	if err := runQEMUImg(ctx, qemuImg, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	// qemu-img creates with its umask: the disk will hold the guest's
	// files and, in its snapshots, the guest's memory.
	if err := os.Chmod(tmp, FileMode); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

func runQEMUImg(ctx context.Context, qemuImg string, args ...string) error {
	cmd := exec.CommandContext(ctx, qemuImg, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 500 {
			msg = msg[:500]
		}
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(qemuImg), args[0], err, msg)
	}
	return nil
}

// prepareDisk makes the VM's overlay on the base image of spec's size.
func prepareDisk(ctx context.Context, spec Spec, dir string) (string, error) {
	qemuImg, err := exec.LookPath(QEMUImgBinary)
	if err != nil {
		return "", ErrNoQEMUImg
	}
	base, err := baseDisk(ctx, qemuImg, spec.StateDir, spec.diskMB())
	if err != nil {
		return "", fmt.Errorf("base disk: %w", err)
	}
	disk := filepath.Join(dir, DiskName)
	if err := makeOverlay(ctx, qemuImg, base, disk); err != nil {
		return "", fmt.Errorf("disk overlay: %w", err)
	}
	return disk, nil
}

// diskArgv attaches disk as a virtio disk (node DiskNodeName), gives the
// guest a NIC on QEMU's user network with restrict=on (the guest has an
// address but no way out of the VM) and a balloon device (so QMP's
// query-balloon reports the guest's memory).
func diskArgv(disk string) []string {
	// JSON syntax: a path with a comma needs no escaping.
	blockdev, _ := json.Marshal(map[string]any{
		"driver": "qcow2", "node-name": DiskNodeName,
		"file": map[string]any{"driver": "file", "filename": disk},
	})
	return []string{
		"-blockdev", string(blockdev),
		"-device", "virtio-blk-pci,drive=" + DiskNodeName + ",id=vda",
		"-nic", "user,model=virtio-net-pci,restrict=on",
		"-device", "virtio-balloon-pci",
	}
}
