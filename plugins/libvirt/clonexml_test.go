package libvirt

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
)

// templateXML is an inactive domain XML as libvirt 9.0 writes it, with
// everything the clone rules touch.
const templateXML = `<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>base</name>
  <uuid>2f6a6c2e-7b1e-4b5d-9a35-7d2a2c1f0e11</uuid>
  <metadata>
    <app:vm xmlns:app="https://example.test/app">template &amp; co</app:vm>
  </metadata>
  <memory unit='KiB'>262144</memory>
  <currentMemory unit='KiB'>262144</currentMemory>
  <vcpu placement='static' current='1'>2</vcpu>
  <os>
    <type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type>
    <kernel>/var/lib/vmgate/vmlinuz</kernel>
    <cmdline>console=ttyS0 LAB_NAME=base</cmdline>
    <nvram>/var/lib/libvirt/qemu/nvram/base_VARS.fd</nvram>
  </os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='/images/base.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <source file='/images/seed.iso'/>
      <target dev='hdc' bus='ide'/>
      <readonly/>
    </disk>
    <interface type='user'>
      <mac address='52:54:00:aa:bb:cc'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'>
      <source path='/logs/base.serial'/>
      <target port='0'/>
    </serial>
    <console type='pty'>
      <log file='/logs/base.console' append='off'/>
      <target type='serial' port='0'/>
    </console>
    <channel type='unix'>
      <source mode='bind' path='/run/base-qga.sock'/>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
    </channel>
    <graphics type='vnc' port='5901' autoport='no' listen='127.0.0.1'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-no-user-config'/>
  </qemu:commandline>
</domain>
`

// parsed is what the tests read back from a clone's XML.
type parsed struct {
	Name   string `xml:"name"`
	UUID   string `xml:"uuid"`
	Memory struct {
		Unit string `xml:"unit,attr"`
		V    string `xml:",chardata"`
	} `xml:"memory"`
	VCPU struct {
		Current string `xml:"current,attr"`
		V       string `xml:",chardata"`
	} `xml:"vcpu"`
	NVRAM string `xml:"os>nvram"`
	Disks []struct {
		Device    string `xml:"device,attr"`
		Transient *struct {
			Share string `xml:"shareBacking,attr"`
		} `xml:"transient"`
	} `xml:"devices>disk"`
	MAC    []string `xml:"devices>interface>mac"`
	Serial struct {
		Path string `xml:"path,attr"`
	} `xml:"devices>serial>source"`
	ConsoleLog struct {
		File string `xml:"file,attr"`
	} `xml:"devices>console>log"`
	Graphics struct {
		Port     string `xml:"port,attr"`
		Autoport string `xml:"autoport,attr"`
	} `xml:"devices>graphics"`
	Meta struct {
		Lease string `xml:"urn:vmgate:lease lease"`
		App   string `xml:"https://example.test/app vm"`
		Other string `xml:"urn:filter vm"`
	} `xml:"metadata"`
	Qemu []struct {
		Value string `xml:"value,attr"`
	} `xml:"http://libvirt.org/schemas/domain/qemu/1.0 commandline>arg"`
}

func TestCloneXML(t *testing.T) {
	out, err := cloneXML(templateXML, cloneSpec{name: "small-x7", memoryMB: 512, cpus: 1, mark: "LMARK0123456789"})
	if err != nil {
		t.Fatalf("cloneXML = %v", err)
	}
	var p parsed
	if err := xml.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("the clone's XML does not parse: %v\n%s", err, out)
	}
	checks := []struct {
		what      string
		got, want string
	}{
		{"name", p.Name, "small-x7"},
		{"uuid", p.UUID, ""},
		{"memory", p.Memory.V + " " + p.Memory.Unit, "512 MiB"},
		{"vcpu", p.VCPU.V + " current=" + p.VCPU.Current, "1 current="},
		{"nvram", p.NVRAM, ""},
		{"disk transient", p.Disks[0].Transient.Share, "yes"},
		{"cdrom stays", p.Disks[1].Device, "cdrom"},
		{"serial log", p.Serial.Path, "/logs/base.serial.small-x7"},
		{"console log file", p.ConsoleLog.File, "/logs/base.console.small-x7"},
		{"graphics", p.Graphics.Port + " autoport=" + p.Graphics.Autoport, " autoport=yes"},
		{"lease", p.Meta.Lease, "LMARK0123456789"},
		{"template metadata", p.Meta.App, "template & co"},
		{"qemu namespace", p.Qemu[0].Value, "-no-user-config"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("clone %s = %q; want %q", c.what, c.got, c.want)
		}
	}
	if p.Disks[1].Transient != nil {
		t.Errorf("the read-only cdrom got a transient overlay")
	}
	if len(p.MAC) != 0 {
		t.Errorf("clone keeps MAC %v; want libvirt to make one", p.MAC)
	}
	if !strings.Contains(out, "path='/run/base-qga.sock.small-x7'") {
		t.Errorf("the agent channel's socket path is not the clone's own:\n%s", out)
	}
}

func TestCloneXMLDefaultsAndFilter(t *testing.T) {
	src := `<domain type='kvm'><name>base</name><memory unit='KiB'>131072</memory><vcpu>2</vcpu>
<devices><disk type='file'><source file='/i.qcow2'/><target dev='vda'/></disk></devices></domain>`
	out, err := cloneXML(src, cloneSpec{name: "c1", mark: "LMARK0123456789", filterURI: "urn:filter"})
	if err != nil {
		t.Fatal(err)
	}
	var p parsed
	if err := xml.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if p.Memory.V != "131072" || p.Memory.Unit != "KiB" || p.VCPU.V != "2" {
		t.Errorf("memory %s %s, vcpu %s; want the template's (no request)", p.Memory.V, p.Memory.Unit, p.VCPU.V)
	}
	if p.Meta.Lease != "LMARK0123456789" || p.Meta.Other != "created" {
		t.Errorf("metadata: lease %q filter %q; want the mark and the filter element (a metadata element made for them)", p.Meta.Lease, p.Meta.Other)
	}
	if p.Disks[0].Transient == nil {
		t.Errorf("a disk without device= is a disk: want an overlay")
	}
	out, _ = cloneXML(src, cloneSpec{name: "c1", mark: "LMARK0123456789", filterURI: "urn:filter", filterPresent: true})
	if strings.Contains(out, "urn:filter") {
		t.Errorf("the filter element was added although the template has one:\n%s", out)
	}
}

func TestCloneXMLRefusals(t *testing.T) {
	tests := []struct{ name, xml, want string }{
		{"block disk", `<domain><name>b</name><devices><disk type='block' device='disk'><source dev='/dev/sda'/><target dev='vda'/></disk></devices></domain>`, "disk vda is not a file"},
		{"network disk", `<domain><name>b</name><devices><disk type='network' device='disk'><target dev='vdb'/></disk></devices></domain>`, "disk vdb is not a file"},
		{"shareable", `<domain><name>b</name><devices><disk type='file' device='disk'><shareable/><target dev='vda'/></disk></devices></domain>`, "disk vda is shareable"},
		{"not xml", `<domain><name>b</name>`, "its XML"},
		{"directive", `<!DOCTYPE domain [<!ENTITY x "y">]><domain><name>b</name></domain>`, "directive"},
		{"no domain", `<network><name>b</name></network>`, "no <domain>"},
	}
	for _, tt := range tests {
		_, err := cloneXML(tt.xml, cloneSpec{name: "c", mark: "LMARK0123456789"})
		if !errors.Is(err, errCloneXML) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("cloneXML(%s) = %v; want errCloneXML saying %q", tt.name, err, tt.want)
		}
	}
	// Text in the request cannot inject markup.
	out, err := cloneXML(`<domain><name>b</name></domain>`, cloneSpec{name: "c</name><x>", mark: "L'\"<>&0123456"})
	if err != nil {
		t.Fatal(err)
	}
	var p parsed
	if err := xml.Unmarshal([]byte(out), &p); err != nil || p.Name != "c</name><x>" || p.Meta.Lease != "L'\"<>&0123456" {
		t.Errorf("escaped values read back as %q, %q (%v); want them verbatim", p.Name, p.Meta.Lease, err)
	}
}

// TestCreateRefusesBeforeLibvirt: requests the driver can refuse itself
// never dial libvirtd.
func TestCreateRefusesBeforeLibvirt(t *testing.T) {
	d, err := New(Config{URI: "qemu:///system?socket=/nonexistent/sock", NameGlob: "vmgate-*"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dialed := false
	d.dial = func() (conn, error) { dialed = true; return nil, errors.New("no") }
	ctx := context.Background()
	const mark = "LMARK0123456789"
	for _, req := range []hypervisor.CreateRequest{
		{Name: "other-1", Source: json.RawMessage(`{"domain":"tmpl"}`), Mark: mark},
		{Name: "vmgate-1", Source: json.RawMessage(`{}`), Mark: mark},
		{Name: "vmgate-1", Source: json.RawMessage(`{"domain":"a b"}`), Mark: mark},
		{Name: "vmgate-1", Source: json.RawMessage(`{"domain":"tmpl","pool":"x"}`), Mark: mark},
		{Name: "vmgate-1", Source: json.RawMessage(`{"domain":"tmpl"}`), Mark: "short"},
	} {
		if _, err := d.CreateVM(ctx, req); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("CreateVM(%+v) = %v; want ErrInvalidArgument", req, err)
		}
	}
	if err := d.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "a b", Mark: mark}); !errors.Is(err, hypervisor.ErrNotCreated) {
		t.Errorf("DeleteVM(bad name) = %v; want ErrNotCreated", err)
	}
	if dialed {
		t.Error("a refused request dialed libvirtd")
	}
}
