package lab_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// TestLabVMFilesArePrivate: a booted lab VM's directory and everything in
// it (the disk with its snapshots, the QMP and QGA sockets, the logs, the
// pid file, vm.json) have no permission bit for group or others, whatever
// the umask QEMU ran with.
func TestLabVMFilesArePrivate(t *testing.T) {
	vm := labtest.VM(t, "t1")
	seen := map[string]bool{}
	for _, dir := range []string{filepath.Dir(vm.Dir), vm.Dir} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != lab.DirMode {
			t.Errorf("%s: %v, %v; want a directory of mode %04o", dir, fi.Mode(), err, lab.DirMode)
		}
	}
	ents, err := os.ReadDir(vm.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fi, err := os.Lstat(filepath.Join(vm.Dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		seen[e.Name()] = true
		if fi.Mode().Perm()&0o077 != 0 || fi.Mode()&fs.ModeSymlink != 0 {
			t.Errorf("%s has mode %v; want no bits for group or others", e.Name(), fi.Mode())
		}
	}
	for _, f := range []string{lab.DiskName, lab.QMPSocketName, lab.QGASocketName, lab.SerialLogName, lab.QEMULogName, lab.PIDFileName, lab.StateFileName} {
		if !seen[f] {
			t.Errorf("the VM directory has no %s; want it checked", f)
		}
	}
}
