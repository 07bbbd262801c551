package lab_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// qemuImgInfo is the part of `qemu-img info --output=json` the test reads.
type qemuImgInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"full-backing-filename"`
	BackingFormat   string `json:"backing-filename-format"`
}

func imgInfo(t *testing.T, path string) qemuImgInfo {
	t.Helper()
	// -U: the running QEMU holds the image's write lock.
	out, err := exec.Command(lab.QEMUImgBinary, "info", "-U", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	var info qemuImgInfo
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("qemu-img info %s: %v: %s", path, err, out)
	}
	return info
}

func TestLabVMHasAQcow2OverlayDisk(t *testing.T) {
	vm := labtest.VM(t, "t1")
	disk := filepath.Join(vm.Dir, lab.DiskName)
	info := imgInfo(t, disk)
	if info.Format != "qcow2" || info.BackingFormat != "qcow2" || info.BackingFilename == "" {
		t.Fatalf("qemu-img info %s = %+v; want a qcow2 overlay on a qcow2 base", disk, info)
	}
	if want := int64(lab.DefaultDiskMB) << 20; info.VirtualSize != want {
		t.Errorf("disk virtual size = %d; want %d", info.VirtualSize, want)
	}
	base := imgInfo(t, info.BackingFilename)
	if base.Format != "qcow2" || base.BackingFilename != "" {
		t.Errorf("base %s = %+v; want a qcow2 image with no backing file", info.BackingFilename, base)
	}
	// The argv names the disk by its node, which the QEMU driver's snapshots use.
	if !strings.Contains(strings.Join(vm.Argv, " "), `"node-name":"`+lab.DiskNodeName+`"`) {
		t.Errorf("argv %q does not attach the disk as node %s", vm.Argv, lab.DiskNodeName)
	}
}

func TestGuestMountsItsDiskAndHasAnAddress(t *testing.T) {
	vm := labtest.VM(t, "t1")
	tests := []struct {
		name string
		argv []string
		want string
	}{
		{"disk at /data", []string{"/bin/sh", "-c", `grep -c '^/dev/vda /data ext[24] rw' /proc/mounts`}, "1\n"},
		{"/data writable", []string{"/bin/sh", "-c", `echo x > /data/.probe && cat /data/.probe && rm /data/.probe`}, "x\n"},
		{"eth0 address", []string{"/bin/sh", "-c", `ip -o -4 addr show dev eth0 | grep -o '10.0.2.15/24'`}, "10.0.2.15/24\n"},
	}
	for _, tt := range tests {
		st, err := guestRun(t, vm, tt.argv...)
		if err != nil {
			t.Fatalf("%s: guest-exec %q: %v", tt.name, tt.argv, err)
		}
		out, _ := base64.StdEncoding.DecodeString(st.OutData)
		if st.ExitCode != 0 || string(out) != tt.want {
			t.Errorf("%s: %q = exit %d, %q; want exit 0, %q", tt.name, tt.argv, st.ExitCode, out, tt.want)
		}
	}
}

func TestStartRefusesBadDiskSize(t *testing.T) {
	for _, mb := range []int{-1, 1, 15, 1<<20 + 1} {
		dir := t.TempDir()
		_, err := lab.Start(context.Background(), lab.Spec{Name: "d", StateDir: dir, DiskMB: mb})
		if !errors.Is(err, lab.ErrInvalidSpec) {
			t.Errorf("Start(DiskMB %d) = %v; want ErrInvalidSpec", mb, err)
		}
	}
}
