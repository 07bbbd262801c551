package qemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/digitalocean/go-qemu/qmp/raw"
)

// Snapshot descriptions (see snapshot.go): a lab VM's are in this file in
// its directory; a configured VM's in memory (guarded by vm.snap.memMu).
// Callers hold the VM's snapshot slot (vm.snap.lock) to change them.

// SnapshotMetaName is the file in a lab VM's directory holding its
// snapshots' descriptions.
const SnapshotMetaName = "snapshots.json"

// maxMetaBytes bounds what is read of the file.
const maxMetaBytes = 4 << 20

// metas returns the VM's kept descriptions. An unreadable file is logged
// and read as none (descriptions are informative; the snapshots themselves
// are QEMU's).
func (d *Driver) metas(vm *vmState) []snapMeta {
	if vm.labDir == "" {
		vm.snap.memMu.Lock()
		defer vm.snap.memMu.Unlock()
		return slices.Clone(vm.snap.mem)
	}
	m, err := readMetaFile(filepath.Join(vm.labDir, SnapshotMetaName))
	if err != nil {
		d.log.Warn("snapshot descriptions unreadable", "vm", vm.name, "err", err)
	}
	return m
}

func readMetaFile(path string) ([]snapMeta, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMetaBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxMetaBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxMetaBytes)
	}
	var m []snapMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// storeMetas replaces the VM's descriptions (for a lab VM: a temporary file
// renamed over the old one). The caller holds the VM's snapshot slot.
func storeMetas(vm *vmState, m []snapMeta) error {
	if vm.labDir == "" {
		vm.snap.memMu.Lock()
		vm.snap.mem = m
		vm.snap.memMu.Unlock()
		return nil
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	// A fresh temporary file (O_EXCL: never one planted in its place).
	f, err := os.CreateTemp(vm.labDir, ".snapshots-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a successful rename there is nothing to remove
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(vm.labDir, SnapshotMetaName))
}

// currentMetas reads the descriptions while the caller holds the VM's snapshot slot.
func currentMetas(vm *vmState) ([]snapMeta, error) {
	if vm.labDir == "" {
		vm.snap.memMu.Lock()
		defer vm.snap.memMu.Unlock()
		return slices.Clone(vm.snap.mem), nil
	}
	return readMetaFile(filepath.Join(vm.labDir, SnapshotMetaName))
}

// putMeta records m, replacing any entry of the same name. The caller holds the VM's snapshot slot.
func (d *Driver) putMeta(vm *vmState, m snapMeta) error {
	old, err := currentMetas(vm)
	if err != nil {
		d.log.Warn("snapshot descriptions unreadable; starting afresh", "vm", vm.name, "err", err)
		old = nil
	}
	old = slices.DeleteFunc(old, func(x snapMeta) bool { return x.Name == m.Name })
	if m.Description == "" {
		return storeMetas(vm, old)
	}
	return storeMetas(vm, append(old, m))
}

// dropMeta forgets the named snapshot's description. The caller holds the VM's snapshot slot.
func (d *Driver) dropMeta(vm *vmState, name string) error {
	old, err := currentMetas(vm)
	if err != nil {
		return err
	}
	n := len(old)
	old = slices.DeleteFunc(old, func(x snapMeta) bool { return x.Name == name })
	if len(old) == n {
		return nil
	}
	return storeMetas(vm, old)
}

// describe returns the kept description of sn (matched by name and time).
func describe(metas []snapMeta, sn raw.SnapshotInfo) string {
	for _, m := range metas {
		if m.Name == sn.Name && m.DateSec == sn.DateSec && m.DateNsec == sn.DateNsec {
			return m.Description
		}
	}
	return ""
}
