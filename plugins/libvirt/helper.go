package libvirt

import (
	"context"
	"fmt"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/helperchan"
)

// helperSocket is a domain's helper channel socket, read from the XML of
// the domain's run with that id (a domain started again gets a new id and
// may get a new socket).
type helperSocket struct {
	id   int32
	path string
	read bool
}

// HelperCall implements hypervisor.HelperCaller: the domain's
// <channel type='unix'> whose target is the virtio port org.vmgate.guest.0
// has its host end at a unix socket (the path the domain XML gives, or the
// one libvirt chose and reports in the live XML), which the driver
// connects to directly. That needs libvirtd on this host (a unix URI) and
// the socket reachable by vmgate's user; otherwise helper commands go
// through the guest agent (ErrNoHelperChannel). go-libvirt's
// DomainOpenChannel would carry the stream through libvirtd instead, but
// it only reads (its stream has no way back to the guest).
func (d *Driver) HelperCall(ctx context.Context, name string, call hypervisor.HelperCall) (hypervisor.HelperReply, error) {
	if d.ep.network != "unix" {
		return hypervisor.HelperReply{}, fmt.Errorf("libvirt: helper call %s: %w: libvirtd is reached over %s, and a domain's channel socket is on its host", name, hypervisor.ErrNoHelperChannel, d.ep.network)
	}
	s, err := d.lookup(ctx, "helper call", name)
	if err != nil {
		return hypervisor.HelperReply{}, err
	}
	path, err := d.helperPath(ctx, s)
	if err != nil {
		return hypervisor.HelperReply{}, err
	}
	rep, err := d.helpers.Call(ctx, path, call)
	if err != nil {
		return rep, fmt.Errorf("libvirt: helper call %s: %w", name, err)
	}
	return rep, nil
}

// helperPath is the domain's helper channel socket, from its live XML
// (read once per run of the domain).
func (d *Driver) helperPath(ctx context.Context, s *domState) (string, error) {
	h := s.handle()
	s.mu.Lock()
	cached := s.helper
	s.mu.Unlock()
	if !cached.read || cached.id != h.ID {
		var x string
		err := d.call(ctx, true, func(c conn) error {
			var err error
			x, err = c.DomainGetXMLDesc(h, 0)
			return err
		})
		if libvirtCode(err) == golibvirt.ErrNoDomain {
			d.forget(s)
			return "", fmt.Errorf("libvirt: helper call: %w: %q", hypervisor.ErrUnknownVM, s.name)
		}
		if err != nil {
			return "", opError("helper call", err)
		}
		path, _ := virtioChannel(x, helperchan.PortName)
		cached = helperSocket{id: h.ID, path: path, read: true}
		s.mu.Lock()
		s.helper = cached
		s.mu.Unlock()
	}
	if cached.path == "" {
		return "", fmt.Errorf("libvirt: helper call %s: %w: the domain has no <channel type='unix'> with <target type='virtio' name='%s'/>", s.name, hypervisor.ErrNoHelperChannel, helperchan.PortName)
	}
	return cached.path, nil
}
