package libvirt

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/hypervisor"
)

// Snapshots are libvirt's (DomainSnapshotCreateXML, DomainListAllSnapshots,
// DomainRevertToSnapshot, DomainSnapshotDelete). The driver takes internal
// snapshots of running domains, which libvirt makes with the domain's
// memory and device state in its qcow2 disks (every disk must be qcow2), so
// a revert returns the whole domain to that moment and leaves it running.
// Disk-only snapshots are not offered: of a running domain libvirt makes
// them external (new overlay files), which libvirt 9.0 cannot revert to; a
// request for one is hypervisor.ErrSnapshotDiskOnly. Snapshots made outside
// vmgate are listed and can be reverted to and deleted (a revert always
// leaves the domain running). libvirt keeps the descriptions, the creation
// time, the tree (Parent) and which snapshot is current.

var (
	_ hypervisor.Snapshotter        = (*Driver)(nil)
	_ hypervisor.SnapshotIDReverter = (*Driver)(nil)
)

// snapConn is what snapshots need of a libvirt connection; *golibvirt.Libvirt
// implements it.
type snapConn interface {
	DomainSnapshotCreateXML(dom golibvirt.Domain, xmlDesc string, flags uint32) (golibvirt.DomainSnapshot, error)
	DomainListAllSnapshots(dom golibvirt.Domain, needResults int32, flags uint32) ([]golibvirt.DomainSnapshot, int32, error)
	DomainSnapshotLookupByName(dom golibvirt.Domain, name string, flags uint32) (golibvirt.DomainSnapshot, error)
	DomainSnapshotGetXMLDesc(snap golibvirt.DomainSnapshot, flags uint32) (string, error)
	DomainSnapshotCurrent(dom golibvirt.Domain, flags uint32) (golibvirt.DomainSnapshot, error)
	DomainRevertToSnapshot(snap golibvirt.DomainSnapshot, flags uint32) error
	DomainSnapshotDelete(snap golibvirt.DomainSnapshot, flags golibvirt.DomainSnapshotDeleteFlags) error
}

var _ snapConn = (*golibvirt.Libvirt)(nil)

// errNoSnapConn: the connection (a test fake) has no snapshot calls.
var errNoSnapConn = fmt.Errorf("%w: the libvirt connection has no snapshot calls", hypervisor.ErrNotSupported)

// snapCall runs fn on the shared connection's snapshot calls (see call).
func (d *Driver) snapCall(ctx context.Context, retry bool, fn func(c snapConn) error) error {
	return d.call(ctx, retry, func(c conn) error {
		sc, ok := c.(snapConn)
		if !ok {
			return errNoSnapConn
		}
		return fn(sc)
	})
}

// SnapshotModes implements hypervisor.Snapshotter: snapshots with memory only.
func (d *Driver) SnapshotModes() hypervisor.SnapshotModes {
	return hypervisor.SnapshotModes{Memory: true}
}

// snapshotXML is the part of a <domainsnapshot> the driver writes and reads.
type snapshotXML struct {
	XMLName      xml.Name `xml:"domainsnapshot"`
	Name         string   `xml:"name"`
	Description  string   `xml:"description,omitempty"`
	State        string   `xml:"state,omitempty"`
	CreationTime string   `xml:"creationTime,omitempty"`
	Parent       *struct {
		Name string `xml:"name"`
	} `xml:"parent,omitempty"`
	Memory *struct {
		Snapshot string `xml:"snapshot,attr"`
	} `xml:"memory,omitempty"`
}

// toSnapshot reads a snapshot's XML description.
func toSnapshot(desc string) (hypervisor.Snapshot, error) {
	var x snapshotXML
	if err := xml.Unmarshal([]byte(desc), &x); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("snapshot XML: %w", err)
	}
	s := hypervisor.Snapshot{Name: x.Name, Description: x.Description}
	if sec, err := strconv.ParseInt(strings.TrimSpace(x.CreationTime), 10, 64); err == nil && sec > 0 {
		s.CreatedAt = time.Unix(sec, 0).UTC()
		// libvirt's own identity of a snapshot is its name; what tells a
		// snapshot made anew under that name apart is its creationTime
		// (seconds) and the state it holds.
		s.ID = "libvirt:" + strconv.FormatInt(sec, 10) + ":" + x.State
	}
	if x.Parent != nil {
		s.Parent = x.Parent.Name
	}
	// A system checkpoint of a running (or paused) domain holds its memory;
	// so does an explicit internal or external memory element.
	switch {
	case x.Memory != nil:
		s.Memory = x.Memory.Snapshot == "internal" || x.Memory.Snapshot == "external"
	default:
		s.Memory = x.State == "running" || x.State == "paused"
	}
	return s, nil
}

// snapError maps libvirt's errors for snapshots to the sentinels.
func (d *Driver) snapError(op string, s *domState, name string, err error) error {
	switch code := libvirtCode(err); {
	case code == golibvirt.ErrNoDomainSnapshot:
		return fmt.Errorf("libvirt: %s: %w: %q: %w", op, hypervisor.ErrSnapshotNotFound, name, err)
	case code == golibvirt.ErrNoDomain:
		d.forget(s)
		return fmt.Errorf("libvirt: %s: %w: %q", op, hypervisor.ErrUnknownVM, s.name)
	case code == golibvirt.ErrConfigUnsupported || code == golibvirt.ErrOperationUnsupported || code == golibvirt.ErrArgumentUnsupported:
		return fmt.Errorf("libvirt: %s: %w: %w", op, hypervisor.ErrNotSupported, err)
	case errors.Is(err, errNoSnapConn):
		return fmt.Errorf("libvirt: %s: %w", op, err)
	}
	return opError(op, err)
}

// runningDomain looks the domain up and checks it runs: libvirt's internal
// snapshots of a running domain are the ones with memory.
func (d *Driver) runningDomain(ctx context.Context, op, name string) (*domState, error) {
	s, err := d.lookup(ctx, op, name)
	if err != nil {
		return nil, err
	}
	state, detail, err := d.domainState(ctx, op, s)
	if err != nil {
		return nil, err
	}
	if state != hypervisor.StateRunning {
		return nil, fmt.Errorf("libvirt: %s: %w: the domain is %s, and a snapshot with memory needs it running", op, hypervisor.ErrVMNotRunning, detail)
	}
	return s, nil
}

// SnapshotCreate takes an internal snapshot, with memory, of the running domain.
func (d *Driver) SnapshotCreate(ctx context.Context, name string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
	const op = "snapshot create"
	if err := hypervisor.ValidateSnapshotRequest(req); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("libvirt: %s: %w", op, err)
	}
	if err := hypervisor.CheckSnapshotMode(d.SnapshotModes(), req); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("libvirt: %s: %w: libvirt makes a running domain's disk-only snapshots external, which it cannot revert to; ask for a snapshot with memory", op, err)
	}
	s, err := d.runningDomain(ctx, op, name)
	if err != nil {
		return hypervisor.Snapshot{}, err
	}
	desc, err := xml.Marshal(snapshotXML{Name: req.Name, Description: req.Description})
	if err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("libvirt: %s: %w", op, err)
	}
	h := s.handle()
	var out string
	exists := false
	err = d.snapCall(ctx, false, func(c snapConn) error {
		if _, err := c.DomainSnapshotLookupByName(h, req.Name, 0); err == nil {
			exists = true
			return nil
		} else if libvirtCode(err) != golibvirt.ErrNoDomainSnapshot {
			return err
		}
		snap, err := c.DomainSnapshotCreateXML(h, string(desc), uint32(golibvirt.DomainSnapshotCreateAtomic))
		if err != nil {
			return err
		}
		out, err = c.DomainSnapshotGetXMLDesc(snap, 0)
		return err
	})
	if err != nil {
		return hypervisor.Snapshot{}, d.snapError(op, s, req.Name, err)
	}
	if exists {
		return hypervisor.Snapshot{}, fmt.Errorf("libvirt: %s: %w: %q", op, hypervisor.ErrSnapshotExists, req.Name)
	}
	snap, err := toSnapshot(out)
	if err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("libvirt: %s: %w", op, err)
	}
	snap.Current = true // libvirt makes a new snapshot current
	return snap, nil
}

// SnapshotList returns the domain's snapshots, oldest first.
func (d *Driver) SnapshotList(ctx context.Context, name string) ([]hypervisor.Snapshot, error) {
	const op = "snapshot list"
	s, err := d.lookup(ctx, op, name)
	if err != nil {
		return nil, err
	}
	h := s.handle()
	var descs []string
	current := ""
	err = d.snapCall(ctx, true, func(c snapConn) error {
		descs = descs[:0]
		snaps, _, err := c.DomainListAllSnapshots(h, 1, 0)
		if err != nil {
			return err
		}
		for _, sn := range snaps {
			x, err := c.DomainSnapshotGetXMLDesc(sn, 0)
			if libvirtCode(err) == golibvirt.ErrNoDomainSnapshot {
				continue // deleted meanwhile
			}
			if err != nil {
				return err
			}
			descs = append(descs, x)
		}
		cur, err := c.DomainSnapshotCurrent(h, 0)
		switch {
		case err == nil:
			current = cur.Name
		case libvirtCode(err) != golibvirt.ErrNoDomainSnapshot:
			return err
		}
		return nil
	})
	if err != nil {
		return nil, d.snapError(op, s, "", err)
	}
	out := make([]hypervisor.Snapshot, 0, len(descs))
	for _, x := range descs {
		snap, err := toSnapshot(x)
		if err != nil {
			return nil, fmt.Errorf("libvirt: %s: %w", op, err)
		}
		snap.Current = snap.Name == current
		out = append(out, snap)
	}
	slices.SortStableFunc(out, func(a, b hypervisor.Snapshot) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// withSnapshot looks up the named snapshot of the domain and runs fn on it.
func (d *Driver) withSnapshot(ctx context.Context, op, name, snap string, fn func(c snapConn, sn golibvirt.DomainSnapshot) error) (*domState, error) {
	if err := hypervisor.ValidateSnapshotName(snap); err != nil {
		return nil, fmt.Errorf("libvirt: %s: %w", op, err)
	}
	s, err := d.lookup(ctx, op, name)
	if err != nil {
		return nil, err
	}
	h := s.handle()
	err = d.snapCall(ctx, false, func(c snapConn) error {
		sn, err := c.DomainSnapshotLookupByName(h, snap, 0)
		if err != nil {
			return err
		}
		return fn(c, sn)
	})
	if err != nil {
		return s, d.snapError(op, s, snap, err)
	}
	return s, nil
}

// SnapshotRevert returns the domain to the snapshot and leaves it running.
// The guest agent is back in the snapshot's state: the driver's cached
// guest-info and tracked commands are dropped.
func (d *Driver) SnapshotRevert(ctx context.Context, name, snap string) error {
	return d.revert(ctx, name, snap, nil)
}

// SnapshotRevertID implements hypervisor.SnapshotIDReverter: the snapshot
// the revert is given is the one whose description was just read and
// checked, on the same connection.
func (d *Driver) SnapshotRevertID(ctx context.Context, name, snap, id string) error {
	return d.revert(ctx, name, snap, &id)
}

// revert is SnapshotRevert, bound to identity *id when id is set.
func (d *Driver) revert(ctx context.Context, name, snap string, id *string) error {
	const op = "snapshot revert"
	var changed error
	s, err := d.withSnapshot(ctx, op, name, snap, func(c snapConn, sn golibvirt.DomainSnapshot) error {
		if id != nil {
			x, err := c.DomainSnapshotGetXMLDesc(sn, 0)
			if err != nil {
				return err
			}
			cur, err := toSnapshot(x)
			if err != nil {
				return err
			}
			if changed = hypervisor.CheckSnapshotID(cur, *id); changed != nil {
				return nil
			}
		}
		return c.DomainRevertToSnapshot(sn, uint32(golibvirt.DomainSnapshotRevertRunning))
	})
	if err == nil && changed != nil {
		return fmt.Errorf("libvirt: %s: %w", op, changed)
	}
	if s != nil {
		d.core.Forget(s.name)
	}
	return err
}

// SnapshotDelete deletes the snapshot (its children, if any, are kept and
// re-parented by libvirt).
func (d *Driver) SnapshotDelete(ctx context.Context, name, snap string) error {
	_, err := d.withSnapshot(ctx, "snapshot delete", name, snap, func(c snapConn, sn golibvirt.DomainSnapshot) error {
		return c.DomainSnapshotDelete(sn, 0)
	})
	return err
}
