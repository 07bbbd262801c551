package libvirttest

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/vmgate/vmgate/internal/testload"
)

// BootTimeout bounds one domain's boot to its first agent answer (5–7 s on
// an idle machine; TCG on a loaded one can take a minute).
const BootTimeout = 4 * time.Minute

// Spec describes a lab guest domain.
type Spec struct {
	// Name is the domain name: [A-Za-z0-9][A-Za-z0-9._-]{0,47}.
	Name string
	// Cmdline adds KEY=VALUE words to the kernel command line; the lab
	// guest's /init reads them (QGA_BLOCK=guest-exec). Keys are
	// [A-Z_][A-Z0-9_]*, values [A-Za-z0-9._,:/-]*.
	Cmdline map[string]string
	// Persistent defines the domain and then starts it, so it can be
	// stopped and started again; otherwise it is transient and gone once
	// destroyed.
	Persistent bool
	// Metadata, when not empty, is one element placed in the domain's
	// <metadata>: MetadataURI names its namespace, the element is
	// <vmgate:MetadataElement xmlns:vmgate="MetadataURI">Metadata</...>.
	Metadata    string
	MetadataURI string
	// MemoryMiB is the guest's memory; 0 means 256.
	MemoryMiB int
	// Disk gives the domain a qcow2 disk of DiskMiB (vda; the lab guest
	// mounts it at /data), which internal snapshots need.
	Disk bool
	// NIC gives the domain a virtio NIC on QEMU's user network (the lab
	// guest sets 10.0.2.15/24 on it).
	NIC bool
	// DefineOnly defines a persistent domain without starting it (a
	// template for vm_create); Boot returns once it is defined.
	DefineOnly bool
	// HelperPort gives the domain the resident helper's virtio-serial
	// port org.vmgate.guest.0, a unix channel whose socket is
	// HelperSocketName beside the serial log (where the host, outside the
	// daemons' mount namespace, reaches it).
	HelperPort bool
}

// DiskMiB is the virtual size of a Spec.Disk disk.
const DiskMiB = 64

// HelperSocketName is the socket of a HelperPort domain's helper channel,
// in its boot directory (beside Domain.SerialLog).
const HelperSocketName = "helper.sock"

// devicesXML is the optional devices of s; disk is the qcow2 file, dir the
// domain's boot directory.
func (s Spec) devicesXML(disk, dir string) string {
	var b strings.Builder
	if s.Disk {
		fmt.Fprintf(&b, `    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='%s'/>
      <target dev='vda' bus='virtio'/>
    </disk>
`, esc(disk))
	}
	if s.NIC {
		b.WriteString("    <interface type='user'><model type='virtio'/></interface>\n")
	}
	if s.HelperPort {
		fmt.Fprintf(&b, "    <channel type='unix'><source mode='bind' path='%s'/><target type='virtio' name='org.vmgate.guest.0'/></channel>\n",
			esc(filepath.Join(dir, HelperSocketName)))
	}
	return b.String()
}

// MetadataElement is the local name of the element Spec.Metadata creates.
const MetadataElement = "vm"

// Domain is a booted domain.
type Domain struct {
	Name       string
	UUID       string
	Persistent bool
	// SerialLog is the guest console.
	SerialLog string
	// QEMUPID is the domain's QEMU process, as the test process sees it
	// (0 when it was not found).
	QEMUPID int

	handle golibvirt.Domain
}

var (
	specName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$`)
	cmdlineKey = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
	cmdlineVal = regexp.MustCompile(`^[A-Za-z0-9._,:/-]*$`)
	metaURI    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:[^\s"'<>&]+$`)
)

// Validate checks s before anything is created.
func (s Spec) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("libvirttest: spec %q: "+format, append([]any{s.Name}, a...)...)
	}
	if !specName.MatchString(s.Name) {
		return bad("bad name")
	}
	for k, v := range s.Cmdline {
		if !cmdlineKey.MatchString(k) || !cmdlineVal.MatchString(v) {
			return bad("bad kernel command line word %q=%q", k, v)
		}
	}
	if s.Metadata != "" && s.MetadataURI == "" {
		return bad("metadata without a namespace URI")
	}
	if s.MetadataURI != "" && !metaURI.MatchString(s.MetadataURI) {
		return bad("bad metadata URI %q", s.MetadataURI)
	}
	if s.MemoryMiB < 0 || s.MemoryMiB > 4096 {
		return bad("memory %d MiB out of range", s.MemoryMiB)
	}
	if s.DefineOnly && !s.Persistent {
		return bad("a domain that is only defined must be persistent")
	}
	return nil
}

// cmdline is the kernel command line, keys sorted.
func (s Spec) cmdline() string {
	words := []string{"console=ttyS0", "loglevel=6", "panic=-1", "no_timer_check", "LAB_NAME=" + s.Name} // as internal/lab's
	keys := make([]string, 0, len(s.Cmdline))
	for k := range s.Cmdline {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		words = append(words, k+"="+s.Cmdline[k])
	}
	return strings.Join(words, " ")
}

func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return strings.ReplaceAll(b.String(), "'", "&#39;")
}

// DomainXML is the domain definition of s booting kernel and initrd: type
// qemu (TCG), direct kernel boot, ACPI, a display (std VGA), the serial
// console on a pty (virDomainOpenConsole's) logged to serialLog, and the
// guest agent channel org.qemu.guest_agent.0; with Spec.Disk, disk is its
// qcow2 disk.
func (s Spec) DomainXML(kernel, initrd, serialLog, disk string) string {
	mem := s.MemoryMiB
	if mem == 0 {
		mem = 256
	}
	meta := ""
	if s.MetadataURI != "" {
		meta = fmt.Sprintf("  <metadata><vmgate:%s xmlns:vmgate='%s'>%s</vmgate:%s></metadata>\n",
			MetadataElement, esc(s.MetadataURI), esc(s.Metadata), MetadataElement)
	}
	return fmt.Sprintf(`<domain type='qemu'>
  <name>%s</name>
%s  <memory unit='MiB'>%d</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>%s</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <serial type='pty'><log file='%s' append='off'/><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <video><model type='vga'/></video>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
%s    <memballoon model='none'/>
  </devices>
</domain>
`, esc(s.Name), meta, mem, esc(kernel), esc(initrd), esc(s.cmdline()), esc(serialLog), s.devicesXML(disk, filepath.Dir(serialLog)))
}

// Boot copies kernel and initrd, starts spec as a domain and waits until
// its guest agent answers guest-ping (bounded by ctx). The domain is
// destroyed by Close, or at once when Boot fails.
func (d *Daemons) Boot(ctx context.Context, spec Spec, kernel, initrd string) (_ *Domain, err error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	switch {
	case d.closed:
		d.mu.Unlock()
		return nil, fmt.Errorf("libvirttest: boot %s: daemons closed", spec.Name)
	case d.domains[spec.Name] != nil:
		d.mu.Unlock()
		return nil, fmt.Errorf("libvirttest: boot %s: already booted", spec.Name)
	}
	dom := &Domain{Name: spec.Name, Persistent: spec.Persistent}
	d.domains[spec.Name] = dom // reserved; Close destroys it if it got a handle
	d.mu.Unlock()

	bootDir := filepath.Join(d.Dir, "domains", spec.Name)
	dom.SerialLog = filepath.Join(bootDir, "serial.log")
	k, i, disk, err := prepareBoot(ctx, bootDir, spec, kernel, initrd)
	if err != nil {
		return nil, fmt.Errorf("libvirttest: boot %s: %w", spec.Name, err)
	}
	domXML := spec.DomainXML(k, i, dom.SerialLog, disk)

	l, err := d.connect()
	if err != nil {
		return nil, fmt.Errorf("libvirttest: boot %s: %w", spec.Name, err)
	}
	defer l.Disconnect()
	var h golibvirt.Domain
	if spec.Persistent {
		if h, err = l.DomainDefineXML(domXML); err == nil {
			d.setHandle(dom, h)
			if spec.DefineOnly {
				return dom, nil
			}
			err = l.DomainCreate(h)
		}
	} else {
		h, err = l.DomainCreateXML(domXML, 0)
		if err == nil {
			d.setHandle(dom, h)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("libvirttest: boot %s: %w\n%s", spec.Name, err, d.Logs())
	}
	// The private /run/libvirt/qemu; the pid there is one of libvirtd's PID namespace.
	dom.QEMUPID = d.hostPID(readPID(filepath.Join(d.Dir, "run", "qemu", spec.Name+".pid")))

	ctx, cancel := testload.WithTimeout(ctx, BootTimeout)
	defer cancel()
	wait := 50 * time.Millisecond
	for {
		_, err := l.QEMUDomainAgentCommand(h, `{"execute":"guest-ping"}`, 2, 0)
		if err == nil {
			return dom, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("libvirttest: boot %s: no agent answer: %w (last: %v); console: %s",
				spec.Name, context.Cause(ctx), err, tailFile(dom.SerialLog, 1500))
		case <-time.After(wait):
		}
		wait = min(wait*2, time.Second)
	}
}

// prepareBoot lays out bootDir for spec: copies of kernel and initrd (k,
// i) where the daemons' QEMU may read them, and the disk when spec wants
// one.
func prepareBoot(ctx context.Context, bootDir string, spec Spec, kernel, initrd string) (k, i, disk string, err error) {
	if err := os.MkdirAll(bootDir, 0o755); err != nil {
		return "", "", "", err
	}
	if err := os.Chmod(filepath.Dir(bootDir), 0o755); err != nil {
		return "", "", "", err
	}
	k, i = filepath.Join(bootDir, "vmlinuz"), filepath.Join(bootDir, "initrd.img")
	for _, c := range [][2]string{{kernel, k}, {initrd, i}} {
		if err := copyFile(c[0], c[1]); err != nil {
			return "", "", "", err
		}
	}
	disk = filepath.Join(bootDir, "disk.qcow2")
	if spec.Disk {
		out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", disk, strconv.Itoa(DiskMiB)+"M").CombinedOutput()
		if err != nil {
			return "", "", "", fmt.Errorf("qemu-img create: %w: %s", err, out)
		}
	}
	return k, i, disk, nil
}

func (d *Daemons) setHandle(dom *Domain, h golibvirt.Domain) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dom.handle = h
	dom.UUID = fmt.Sprintf("%x-%x-%x-%x-%x", h.UUID[0:4], h.UUID[4:6], h.UUID[6:8], h.UUID[8:10], h.UUID[10:16])
}

// Domain returns the booted domain called name, or nil.
func (d *Daemons) Domain(name string) *Domain {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.domains[name]
}

// connect opens a connection to libvirtd; the caller disconnects it.
func (d *Daemons) connect() (*golibvirt.Libvirt, error) {
	l := golibvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(d.Socket), dialers.WithLocalTimeout(5*time.Second)))
	if err := l.ConnectToURI(golibvirt.QEMUSystem); err != nil {
		return nil, err
	}
	return l, nil
}

// destroy destroys the domain (if it runs) and undefines it (if persistent).
// A domain libvirt no longer knows is fine.
func (dom *Domain) destroy(l *golibvirt.Libvirt) error {
	if dom.UUID == "" {
		return nil // never created
	}
	err := l.DomainDestroy(dom.handle)
	if err != nil && !golibvirt.IsNotFound(err) && !isNotRunning(err) {
		return fmt.Errorf("libvirttest: destroy %s: %w", dom.Name, err)
	}
	if dom.Persistent {
		// With its snapshots' metadata: a test that failed midway may leave some.
		if err := l.DomainUndefineFlags(dom.handle, golibvirt.DomainUndefineSnapshotsMetadata); err != nil && !golibvirt.IsNotFound(err) {
			return fmt.Errorf("libvirttest: undefine %s: %w", dom.Name, err)
		}
	}
	return nil
}

// isNotRunning reports libvirt's "domain is not running" (VIR_ERR_OPERATION_INVALID).
func isNotRunning(err error) bool {
	var e golibvirt.Error
	return errors.As(err, &e) && e.Code == uint32(golibvirt.ErrOperationInvalid)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Domains returns the domains Boot started (or is starting).
func (d *Daemons) Domains() []*Domain {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*Domain, 0, len(d.domains))
	for _, dom := range d.domains {
		out = append(out, dom)
	}
	slices.SortFunc(out, func(a, b *Domain) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Remove destroys (and undefines) one domain Boot made and forgets it, so
// a test can take away what only it needed.
func (d *Daemons) Remove(name string) error {
	d.mu.Lock()
	dom := d.domains[name]
	delete(d.domains, name)
	d.mu.Unlock()
	if dom == nil {
		return fmt.Errorf("libvirttest: remove %s: not booted", name)
	}
	return d.withConn(dom.destroy)
}
