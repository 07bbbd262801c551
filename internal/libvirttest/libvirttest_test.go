package libvirttest

import (
	"context"
	"encoding/xml"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
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

// TestDaemonsStartStop starts the daemons, checks libvirtd answers on the
// private socket, closes them and checks both pids and the directory are gone.
func TestDaemonsStartStop(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := StartDaemons(ctx, nil)
	if errors.Is(err, ErrDaemonRunning) && os.Getenv(RequireEnv) == "" {
		t.Skipf("StartDaemons() = %v", err)
	}
	if err != nil {
		t.Fatalf("StartDaemons() = %v", err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			d.Close()
		}
	})
	if !strings.HasPrefix(d.Socket, d.Dir) {
		t.Errorf("Socket = %q; want it inside the private dir %q", d.Socket, d.Dir)
	}
	var version uint64
	if err := d.withConn(func(l *golibvirt.Libvirt) error {
		var err error
		version, err = l.ConnectGetLibVersion()
		return err
	}); err != nil || version == 0 {
		t.Errorf("ConnectGetLibVersion() = %d, %v; want a version", version, err)
	}
	// A second start must refuse: virtlogd's socket is taken.
	if d2, err := StartDaemons(ctx, nil); !errors.Is(err, ErrDaemonRunning) {
		if d2 != nil {
			d2.Close()
		}
		t.Errorf("second StartDaemons() error %v; want %v", err, ErrDaemonRunning)
	}
	vl, lv := d.Pids()
	closed = true
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
