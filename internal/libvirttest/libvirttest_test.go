package libvirttest

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/lab"
)

func TestSpecValidate(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		ok   bool
	}{
		{"plain", Spec{Name: "t1"}, true},
		{"cmdline", Spec{Name: "noexec", Cmdline: map[string]string{"QGA_BLOCK": "guest-exec"}}, true},
		{"metadata", Spec{Name: "m", Metadata: "lab", MetadataURI: "https://example.org/vmgate"}, true},
		{"empty name", Spec{}, false},
		{"slash in name", Spec{Name: "a/b"}, false},
		{"xml in name", Spec{Name: "a<b"}, false},
		{"long name", Spec{Name: strings.Repeat("a", 49)}, false},
		{"space in value", Spec{Name: "x", Cmdline: map[string]string{"K": "a b"}}, false},
		{"quote in value", Spec{Name: "x", Cmdline: map[string]string{"K": `a"`}}, false},
		{"lowercase key", Spec{Name: "x", Cmdline: map[string]string{"k": "v"}}, false},
		{"metadata without uri", Spec{Name: "x", Metadata: "lab"}, false},
		{"bad uri", Spec{Name: "x", Metadata: "lab", MetadataURI: "no scheme"}, false},
		{"quote in uri", Spec{Name: "x", MetadataURI: "urn:a'b"}, false},
		{"negative memory", Spec{Name: "x", MemoryMiB: -1}, false},
		{"huge memory", Spec{Name: "x", MemoryMiB: 1 << 20}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			if (err == nil) != tc.ok {
				t.Errorf("Validate(%+v) = %v; want ok %v", tc.spec, err, tc.ok)
			}
		})
	}
}

func TestDomainXML(t *testing.T) {
	s := Spec{Name: "noexec", Cmdline: map[string]string{"QGA_BLOCK": "guest-exec", "A": "1"},
		Metadata: "a&b", MetadataURI: "https://example.org/vmgate"}
	got := s.DomainXML("/k/vm&linuz", "/k/initrd.img", "/k/serial.log", "/k/disk.qcow2")
	var dom struct {
		Type string `xml:"type,attr"`
		Name string `xml:"name"`
		OS   struct {
			Kernel  string `xml:"kernel"`
			Cmdline string `xml:"cmdline"`
		} `xml:"os"`
		Metadata struct {
			VM struct {
				XMLName xml.Name
				Text    string `xml:",chardata"`
			} `xml:",any"`
		} `xml:"metadata"`
		Channel struct {
			Target struct {
				Name string `xml:"name,attr"`
			} `xml:"target"`
		} `xml:"devices>channel"`
	}
	if err := xml.Unmarshal([]byte(got), &dom); err != nil {
		t.Fatalf("DomainXML() is not XML: %v\n%s", err, got)
	}
	checks := []struct{ what, got, want string }{
		{"type", dom.Type, "qemu"},
		{"name", dom.Name, "noexec"},
		{"kernel", dom.OS.Kernel, "/k/vm&linuz"},
		{"cmdline", dom.OS.Cmdline, "console=ttyS0 loglevel=6 panic=-1 no_timer_check LAB_NAME=noexec A=1 QGA_BLOCK=guest-exec"},
		{"metadata namespace", dom.Metadata.VM.XMLName.Space, "https://example.org/vmgate"},
		{"metadata text", dom.Metadata.VM.Text, "a&b"},
		{"agent channel", dom.Channel.Target.Name, "org.qemu.guest_agent.0"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("DomainXML() %s = %q; want %q", c.what, c.got, c.want)
		}
	}
	if strings.Contains(got, "<disk") || strings.Contains(got, "<interface") {
		t.Errorf("DomainXML() without Disk and NIC has a disk or an interface:\n%s", got)
	}
	for _, want := range []string{"<serial type='pty'><log file='/k/serial.log'", "<console type='pty'><target type='serial' port='0'/>", "<video><model type='vga'/></video>"} {
		if !strings.Contains(got, want) {
			t.Errorf("DomainXML() has no %s (the screen and console tools need it):\n%s", want, got)
		}
	}
}

func TestDomainXMLDevices(t *testing.T) {
	s := Spec{Name: "snap", Disk: true, NIC: true}
	got := s.DomainXML("/k/vmlinuz", "/k/initrd.img", "/k/serial.log", "/k/it's & disk.qcow2")
	var dom struct {
		Disk struct {
			Device string `xml:"device,attr"`
			Driver struct {
				Type string `xml:"type,attr"`
			} `xml:"driver"`
			Source struct {
				File string `xml:"file,attr"`
			} `xml:"source"`
			Target struct {
				Dev string `xml:"dev,attr"`
				Bus string `xml:"bus,attr"`
			} `xml:"target"`
		} `xml:"devices>disk"`
		Interface struct {
			Type  string `xml:"type,attr"`
			Model struct {
				Type string `xml:"type,attr"`
			} `xml:"model"`
		} `xml:"devices>interface"`
	}
	if err := xml.Unmarshal([]byte(got), &dom); err != nil {
		t.Fatalf("DomainXML() is not XML: %v\n%s", err, got)
	}
	checks := []struct{ what, got, want string }{
		{"disk device", dom.Disk.Device, "disk"},
		{"disk format", dom.Disk.Driver.Type, "qcow2"},
		{"disk file", dom.Disk.Source.File, "/k/it's & disk.qcow2"},
		{"disk target", dom.Disk.Target.Dev + " " + dom.Disk.Target.Bus, "vda virtio"},
		{"interface", dom.Interface.Type + " " + dom.Interface.Model.Type, "user virtio"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("DomainXML() %s = %q; want %q", c.what, c.got, c.want)
		}
	}
}

// TestDaemonsStartStop starts two pairs of daemons at once (as two test
// runs would), checks that each answers on its own socket and keeps its
// own domains, that their mounts are in namespaces of their own and leave
// the host's untouched, then closes them and checks both pids and the
// directory are gone. The package doc says why none of this looks at a
// system libvirtd; the README's libvirt test note says how to check that
// by hand.
func TestDaemonsStartStop(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*ReadyTimeout)
	defer cancel()
	pair := make([]*Daemons, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range pair {
		wg.Go(func() { pair[i], errs[i] = StartDaemons(ctx, nil) })
	}
	wg.Wait()
	for i, d := range pair {
		if d != nil {
			t.Cleanup(func() { d.Close() })
		}
		if errs[i] != nil {
			t.Fatalf("StartDaemons() #%d = %v", i, errs[i])
		}
	}
	a, b := pair[0], pair[1]
	hostNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	hostMounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range pair {
		if !strings.HasPrefix(d.Socket, d.Dir+"/") {
			t.Errorf("Socket = %q; want it inside the private dir %q", d.Socket, d.Dir)
		}
		if version, err := libVersion(d); err != nil || version == 0 {
			t.Errorf("ConnectGetLibVersion() on %s = %d, %v; want a version", d.Socket, version, err)
		}
		for _, pid := range []int{d.virtlogd.pid(), d.libvirtd.pid()} {
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err != nil || ns == hostNS {
				t.Errorf("pid %d's mount namespace = %q, %v; want one other than the test's %q", pid, ns, err, hostNS)
			}
		}
		if strings.Contains(string(hostMounts), d.Dir) {
			t.Errorf("the test's own mount table names %s; want the bind mounts only in the daemons' namespace:\n%s", d.Dir, hostMounts)
		}
	}

	// A domain defined in one daemon is that daemon's alone: in its private
	// /etc/libvirt/qemu, not the host's, and unknown to the other daemon.
	name := Name("probe")
	if err := a.withConn(func(l *golibvirt.Libvirt) error {
		_, err := l.DomainDefineXML(Spec{Name: name}.DomainXML("/nonexistent/k", "/nonexistent/i", "/nonexistent/s", ""))
		return err
	}); err != nil {
		t.Fatalf("DomainDefineXML(%s) in the first daemon = %v", name, err)
	}
	for _, c := range []struct {
		d    *Daemons
		want bool
	}{{a, true}, {b, false}} {
		err := c.d.withConn(func(l *golibvirt.Libvirt) error {
			_, err := l.DomainLookupByName(name)
			return err
		})
		if (err == nil) != c.want {
			t.Errorf("DomainLookupByName(%s) on %s = %v; want found %v", name, c.d.Socket, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(a.Dir, "etc", "qemu", name+".xml")); err != nil {
		t.Errorf("the definition in the private /etc/libvirt/qemu: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/etc/libvirt/qemu", name+".xml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stat(the host's /etc/libvirt/qemu/%s.xml) = %v; want not exist", name, err)
	}

	for _, d := range pair {
		vl, lv := d.Pids()
		if err := d.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
		for _, pid := range []int{vl, lv} {
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("after Close(), kill(%d, 0) = %v; want ESRCH (daemon gone)", pid, err)
			}
		}
		if _, err := os.Stat(d.Dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Close(), Stat(%s) = %v; want not exist", d.Dir, err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("second Close() = %v; want nil", err)
		}
	}
}

func libVersion(d *Daemons) (version uint64, err error) {
	err = d.withConn(func(l *golibvirt.Libvirt) error {
		version, err = l.ConnectGetLibVersion()
		return err
	})
	return version, err
}

// TestName: names carry one run id, the same for every call in a run, and
// stay valid domain names.
func TestName(t *testing.T) {
	a, b := Name("vmgate-t1"), Name("other")
	if !strings.HasPrefix(a, "vmgate-t1-") || !strings.HasPrefix(b, "other-") || a[len("vmgate-t1-"):] != b[len("other-"):] {
		t.Errorf("Name(vmgate-t1), Name(other) = %q, %q; want the same run id after each base", a, b)
	}
	if id := b[len("other-"):]; len(id) != 6 || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz234567") != "" {
		t.Errorf("run id %q; want six of [a-z2-7]", id)
	}
	if err := (Spec{Name: Name(strings.Repeat("a", 41))}).Validate(); err != nil {
		t.Errorf("Spec{Name: Name(41 characters)}.Validate() = %v; want nil", err)
	}
}

// TestCapsCache: entries a daemon cached reach the shared directory and
// seed the next daemon's cache; an entry that changed replaces the shared
// one; no temporary file is left.
func TestCapsCache(t *testing.T) {
	shared := filepath.Join(t.TempDir(), "shared")
	priv := func(t *testing.T) string {
		d := t.TempDir()
		if err := os.MkdirAll(filepath.Join(d, privateCapsDir), 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	write := func(t *testing.T, path, text string) {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	first := priv(t)
	write(t, filepath.Join(first, privateCapsDir, "qemu.xml"), "<qemuCaps>one</qemuCaps>")
	write(t, filepath.Join(first, privateCapsDir, "notes.txt"), "not an entry")
	if err := seedCaps(shared, first); err != nil {
		t.Errorf("seedCaps(missing shared dir) = %v; want nil", err)
	}
	if err := saveCaps(first, shared); err != nil {
		t.Fatalf("saveCaps() = %v", err)
	}
	next := t.TempDir()
	if err := seedCaps(shared, next); err != nil {
		t.Fatalf("seedCaps() = %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(next, privateCapsDir, "qemu.xml")); err != nil || string(b) != "<qemuCaps>one</qemuCaps>" {
		t.Errorf("seeded entry = %q, %v; want the saved one", b, err)
	}
	write(t, filepath.Join(next, privateCapsDir, "qemu.xml"), "<qemuCaps>two</qemuCaps>")
	if err := saveCaps(next, shared); err != nil {
		t.Fatalf("saveCaps(changed) = %v", err)
	}
	ents, err := os.ReadDir(shared)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if b, err := os.ReadFile(filepath.Join(shared, "qemu.xml")); err != nil || string(b) != "<qemuCaps>two</qemuCaps>" || len(names) != 1 {
		t.Errorf("shared dir = %v, qemu.xml = %q, %v; want only qemu.xml, the changed entry", names, b, err)
	}
	// Private, as everything in the lab's state directory.
	for path, want := range map[string]os.FileMode{shared: lab.DirMode, filepath.Join(shared, "qemu.xml"): lab.FileMode} {
		st, err := os.Stat(path)
		if err != nil {
			t.Errorf("Stat(%s) = %v", path, err)
		} else if st.Mode().Perm() != want {
			t.Errorf("Stat(%s) mode = %v; want %v", path, st.Mode().Perm(), want)
		}
	}
}

// TestOwnThreadNotMain: goOnOwnThread never runs f on the process's main
// thread (whose namespace /proc/self shows), however often the scheduler
// would have put the goroutine there.
func TestOwnThreadNotMain(t *testing.T) {
	const n = 200
	tids := make(chan int, n)
	for range n {
		goOnOwnThread(func() { tids <- unix.Gettid() })
	}
	pid := os.Getpid()
	for range n {
		if tid := <-tids; tid == pid {
			t.Fatalf("goOnOwnThread ran f on the main thread (tid %d = pid)", tid)
		}
	}
}

// TestNSThreadOutlivesStop: the namespace thread never ends, not even after
// stop. It was one of the runtime's threads before it was locked, so a child
// another test started from it with Pdeathsig (a lab VM's QEMU) would get
// SIGKILL when it ended: the e2e lab VM died that way after the libvirt
// e2e test closed its daemons.
func TestNSThreadOutlivesStop(t *testing.T) {
	Require(t)
	dir := t.TempDir()
	for _, s := range systemDirs {
		if err := os.Mkdir(filepath.Join(dir, s.private), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ns, err := newNSThread(dir)
	if err != nil {
		t.Fatalf("newNSThread() = %v", err)
	}
	var tid int
	if err := ns.do(func() { tid = unix.Gettid() }); err != nil {
		t.Fatalf("do() = %v", err)
	}
	ns.stop()
	select {
	case <-ns.parked:
	case <-time.After(ReadyTimeout):
		t.Fatalf("after stop, the namespace thread's goroutine did not park within %v", ReadyTimeout)
	}
	task := filepath.Join("/proc/self/task", strconv.Itoa(tid))
	if _, err := os.Stat(task); err != nil {
		t.Fatalf("after stop, the namespace thread %d: %v; want it parked, alive", tid, err)
	}
	if err := ns.do(func() {}); !errors.Is(err, errNSStopped) {
		t.Errorf("do() after stop = %v; want %v", err, errNSStopped)
	}
}
