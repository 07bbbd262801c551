package libvirt

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"path"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/hypervisor"
)

// VMs on demand: a template is a shut-off domain; a created VM is a
// persistent domain defined from the template's XML (clonexml.go) whose
// file disks are transient overlays libvirt makes on the template's images
// when the clone starts and deletes when it stops. The clone carries the
// lease's mark in its metadata; DeleteVM destroys and undefines only a
// domain with that mark.

var _ hypervisor.Creator = (*Driver)(nil)

// TemplateSource is a libvirt template's source.
type TemplateSource struct {
	// Domain is the template domain: shut off (its images are the clones'
	// read-only backing files), with the guest agent channel.
	Domain string `json:"domain"`
}

// createConn is what creation needs of a libvirt connection beyond conn;
// *golibvirt.Libvirt implements it.
type createConn interface {
	DomainDefineXML(xml string) (golibvirt.Domain, error)
	DomainUndefineFlags(dom golibvirt.Domain, flags golibvirt.DomainUndefineFlagsValues) error
}

var _ createConn = (*golibvirt.Libvirt)(nil)

// defineTimeout bounds defining and starting a clone. It does not follow
// the caller's context: a define that ran on after the caller gave up
// would leave a domain nobody deletes.
const defineTimeout = 2 * time.Minute

// undefineFlags drop what libvirt keeps beside a domain's definition.
const undefineFlags = golibvirt.DomainUndefineSnapshotsMetadata | golibvirt.DomainUndefineManagedSave | golibvirt.DomainUndefineNvram

// CreateVM defines and starts a clone of the template domain and returns
// once its guest agent answers.
func (d *Driver) CreateVM(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
	if err := req.Validate(); err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("libvirt: create: %w", err)
	}
	var src TemplateSource
	if err := hypervisor.DecodeSource(req.Source, &src); err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("libvirt: create: %w", err)
	}
	if !domainName.MatchString(src.Domain) {
		return hypervisor.CreatedVM{}, fmt.Errorf("libvirt: create: %w: template domain %q", hypervisor.ErrInvalidArgument, src.Domain)
	}
	if d.cfg.NameGlob != "" {
		if ok, _ := path.Match(d.cfg.NameGlob, req.Name); !ok {
			return hypervisor.CreatedVM{}, fmt.Errorf("libvirt: create %s: %w: the backend's name_glob %q would hide it; give the template a name prefix it matches",
				req.Name, hypervisor.ErrInvalidArgument, d.cfg.NameGlob)
		}
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), defineTimeout)
	defer cancel()
	var dom golibvirt.Domain
	err := d.call(dctx, false, func(c conn) error {
		var err error
		dom, err = d.define(c, src.Domain, req)
		return err
	})
	if err != nil {
		return hypervisor.CreatedVM{}, createError(req.Name, err)
	}
	if err := d.waitAgent(ctx, dom); err != nil {
		d.undo(dom)
		return hypervisor.CreatedVM{}, fmt.Errorf("libvirt: create %s: %w", req.Name, err)
	}
	return hypervisor.CreatedVM{Name: req.Name}, nil
}

// errCreate marks refusals of define that are the request's fault.
var errCreate = errors.New("cannot create")

// define checks the template and the name, then defines and starts the
// clone; a clone that does not start is undefined again.
func (d *Driver) define(c conn, template string, req hypervisor.CreateRequest) (golibvirt.Domain, error) {
	cc, ok := c.(createConn)
	if !ok {
		return golibvirt.Domain{}, fmt.Errorf("%w: the libvirt connection cannot define domains", hypervisor.ErrNotSupported)
	}
	if _, err := c.DomainLookupByName(req.Name); err == nil {
		return golibvirt.Domain{}, fmt.Errorf("%w: a domain named %q exists", errCreate, req.Name)
	} else if libvirtCode(err) != golibvirt.ErrNoDomain {
		return golibvirt.Domain{}, err
	}
	tmpl, err := c.DomainLookupByName(template)
	if libvirtCode(err) == golibvirt.ErrNoDomain {
		return golibvirt.Domain{}, fmt.Errorf("%w: no template domain %q", errCreate, template)
	} else if err != nil {
		return golibvirt.Domain{}, err
	}
	if st, _, err := c.DomainGetState(tmpl, 0); err != nil {
		return golibvirt.Domain{}, err
	} else if s, _ := stateOf(st); s != hypervisor.StateStopped {
		return golibvirt.Domain{}, fmt.Errorf("%w: template domain %q is %s; shut it off: its disk images are the clones' backing files", errCreate, template, s)
	}
	src, err := c.DomainGetXMLDesc(tmpl, golibvirt.DomainXMLInactive)
	if err != nil {
		return golibvirt.Domain{}, err
	}
	spec := cloneSpec{name: req.Name, memoryMB: req.MemoryMB, cpus: req.CPUs, mark: req.Mark, filterURI: d.cfg.MetadataURI}
	if spec.filterURI != "" {
		_, err := c.DomainGetMetadata(tmpl, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{spec.filterURI}, golibvirt.DomainAffectCurrent)
		spec.filterPresent = err == nil
	}
	domXML, err := cloneXML(src, spec)
	if err != nil {
		return golibvirt.Domain{}, fmt.Errorf("%w: %w", errCreate, err)
	}
	dom, err := cc.DomainDefineXML(domXML)
	if err != nil {
		return golibvirt.Domain{}, err
	}
	if err := c.DomainCreate(dom); err != nil {
		if uerr := cc.DomainUndefineFlags(dom, undefineFlags); uerr != nil {
			d.log.Warn("a clone that did not start could not be undefined", "domain", req.Name, "err", uerr)
		}
		return golibvirt.Domain{}, err
	}
	return dom, nil
}

func createError(name string, err error) error {
	switch {
	case errors.Is(err, errCreate):
		return fmt.Errorf("libvirt: create %s: %w: %w", name, hypervisor.ErrInvalidArgument, err)
	case isLibvirtError(err):
		return fmt.Errorf("libvirt: create %s: %w: %w", name, hypervisor.ErrBackend, err)
	}
	return opError("create "+name, err)
}

// waitAgent pings the clone's guest agent until it answers or ctx ends.
func (d *Driver) waitAgent(ctx context.Context, dom golibvirt.Domain) error {
	wait := 50 * time.Millisecond
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = d.call(pctx, true, func(c conn) error {
			_, err := c.QEMUDomainAgentCommand(dom, `{"execute":"guest-ping"}`, 2, 0)
			return err
		})
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: the guest agent did not answer (last: %v): %w", hypervisor.ErrTimeout, last, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// undo destroys and undefines a clone whose creation failed.
func (d *Driver) undo(dom golibvirt.Domain) {
	ctx, cancel := context.WithTimeout(context.Background(), defineTimeout)
	defer cancel()
	if err := d.call(ctx, false, func(c conn) error { return d.remove(c, dom) }); err != nil {
		d.log.Warn("a clone whose creation failed could not be removed", "domain", dom.Name, "err", err)
	}
}

// remove destroys dom if it runs and undefines it with what libvirt keeps
// beside it; libvirt deletes the transient overlays when QEMU stops.
func (d *Driver) remove(c conn, dom golibvirt.Domain) error {
	cc, ok := c.(createConn)
	if !ok {
		return fmt.Errorf("%w: the libvirt connection cannot undefine domains", hypervisor.ErrNotSupported)
	}
	if err := c.DomainDestroy(dom); err != nil && libvirtCode(err) != golibvirt.ErrOperationInvalid && libvirtCode(err) != golibvirt.ErrNoDomain {
		return err
	}
	if err := cc.DomainUndefineFlags(dom, undefineFlags); err != nil && libvirtCode(err) != golibvirt.ErrNoDomain {
		return err
	}
	return nil
}

// DeleteVM destroys and undefines the domain req names if its metadata
// carries req.Mark.
func (d *Driver) DeleteVM(ctx context.Context, req hypervisor.DeleteRequest) error {
	if err := req.Validate(); err != nil {
		return fmt.Errorf("libvirt: delete: %w", err)
	}
	if !domainName.MatchString(req.Name) {
		return fmt.Errorf("libvirt: delete %q: %w", req.Name, hypervisor.ErrNotCreated)
	}
	err := d.call(ctx, false, func(c conn) error {
		dom, err := c.DomainLookupByName(req.Name)
		if err != nil {
			return err
		}
		raw, err := c.DomainGetMetadata(dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{leaseMetadataURI}, golibvirt.DomainAffectCurrent)
		if libvirtCode(err) == golibvirt.ErrNoDomainMetadata {
			return hypervisor.ErrNotCreated
		} else if err != nil {
			return err
		}
		var mark string
		if xml.Unmarshal([]byte(raw), &mark) != nil || mark != req.Mark {
			return hypervisor.ErrNotCreated
		}
		return d.remove(c, dom)
	})
	switch {
	case err == nil:
	case errors.Is(err, hypervisor.ErrNotCreated):
		return fmt.Errorf("libvirt: delete %s: %w", req.Name, err)
	case libvirtCode(err) == golibvirt.ErrNoDomain:
		err = fmt.Errorf("libvirt: delete %s: %w", req.Name, hypervisor.ErrUnknownVM)
	case isLibvirtError(err):
		return fmt.Errorf("libvirt: delete %s: %w: %w", req.Name, hypervisor.ErrBackend, err)
	default:
		return opError("delete "+req.Name, err)
	}
	d.mu.Lock()
	s := d.doms[req.Name]
	d.mu.Unlock()
	if s != nil {
		d.forget(s)
	}
	return err
}
