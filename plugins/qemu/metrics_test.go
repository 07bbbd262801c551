package qemu

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// fakeProc builds a /proc with one process tgid (comm pcomm, VmRSS 1000 kB)
// and threads tids (comm tcomm, schedstat 1000*tid ns), each listed under
// the process's task directory unless listed is false.
func fakeProc(t *testing.T, tgid int, pcomm string, tids []int, tcomm string, listed bool) string {
	t.Helper()
	dir := t.TempDir()
	write := func(path, data string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, strconv.Itoa(tgid))
	write(filepath.Join(p, "comm"), pcomm+"\n")
	write(filepath.Join(p, "status"), "Name:\t"+pcomm+"\nTgid:\t"+strconv.Itoa(tgid)+"\nVmRSS:\t    1000 kB\n")
	for _, tid := range tids {
		d := filepath.Join(dir, strconv.Itoa(tid))
		write(filepath.Join(d, "comm"), tcomm+"\n")
		write(filepath.Join(d, "status"), "Name:\t"+tcomm+"\nTgid:\t"+strconv.Itoa(tgid)+"\n")
		write(filepath.Join(d, "schedstat"), strconv.Itoa(1000*tid)+" 5 6\n")
		if listed {
			if err := os.MkdirAll(filepath.Join(p, "task", strconv.Itoa(tid)), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func TestVCPUHostFigures(t *testing.T) {
	tests := []struct {
		name          string
		pcomm, tcomm  string
		listed        bool
		tids          []int
		wantOK        bool
		wantCPU, want uint64
	}{
		{"qemu threads named like the process", "qemu-system-x86", "qemu-system-x86", true, []int{11, 12}, true, 23000, 1000 * 1024},
		{"named vCPU threads", "qemu-system-x86", "CPU 0/TCG", true, []int{11}, true, 11000, 1000 * 1024},
		{"not a qemu process", "bash", "bash", true, []int{11}, false, 0, 0},
		{"a thread of another name", "qemu-system-x86", "worker", true, []int{11}, false, 0, 0},
		{"tid not in the process (reused)", "qemu-system-x86", "qemu-system-x86", false, []int{11}, false, 0, 0},
		{"no threads", "qemu-system-x86", "qemu-system-x86", true, nil, false, 0, 0},
	}
	for _, tt := range tests {
		proc := fakeProc(t, 10, tt.pcomm, tt.tids, tt.tcomm, tt.listed)
		cpu, rss, ok := vcpuHostFigures(proc, tt.tids)
		if ok != tt.wantOK || cpu != tt.wantCPU || rss != tt.want {
			t.Errorf("%s: vcpuHostFigures() = %d, %d, %v; want %d, %d, %v", tt.name, cpu, rss, ok, tt.wantCPU, tt.want, tt.wantOK)
		}
	}
	// A tid of a different process than the first one's.
	proc := fakeProc(t, 10, "qemu-system-x86", []int{11}, "qemu-system-x86", true)
	if _, _, ok := vcpuHostFigures(proc, []int{11, 99}); ok {
		t.Errorf("vcpuHostFigures() with a tid that does not exist = ok; want not ok")
	}
}
