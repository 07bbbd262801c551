package proxmox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// The cluster as the driver sees it: which node each VM is on, and which
// nodes are offline.
//
// One request gives both: GET /cluster/resources without a type (pve-manager
// PVE/API2/Cluster.pm "resources", permissions user => 'all') lists every
// QEMU VM the token has VM.Audit on, with its node, and every node with its
// state, whatever the token's other privileges (PVE/API2Tools.pm
// extract_node_stats leaves only a node's figures out without Sys.Audit on
// it): "online", "offline" (corosync lost it) or "unknown" (no status
// broadcast yet). Other entries (storage, pools, SDN) are skipped. A VM's
// own status there is what its node last broadcast, which pmxcfs keeps five
// minutes after the node went silent (pve-cluster src/pmxcfs/status.c,
// rrd_entry_is_old): a VM on an offline node may still say "running", so
// the node's state decides.
//
// The view is trusted for nodeTTL. Every request about a VM (a path
// /nodes/{node}/qemu/{vmid}...) goes through placement.do, which api.do
// calls: it is sent to the node the view puts the VM on, and when Proxmox
// answers that the VM's config is not on that node (the VM migrated, or HA
// moved it, since the view was read), the view is read again and the
// request sent once more, to the VM's node now.
//
// Which requests are sent again, and why that is safe: that answer comes
// from the handler's first look at the VM, before it does anything.
// PVE::AbstractConfig::load_config says "Configuration file
// 'nodes/N/qemu-server/V.conf' does not exist" (qemu-server
// API2/Qemu.pm vm_status, vm_config, update_vm, snapshot_list, snapshot,
// destroy_vm, and every agent endpoint, API2/Qemu/Agent.pm);
// PVE::QemuServer::check_running's assert_config_exists_on_node says
// "unable to find configuration file for VM V on node 'N'" (vm_reset,
// vm_reboot, clone_vm). So every request answered so is sent again, writes
// included. vm_start, vm_stop, vm_shutdown, rollback and delsnapshot look
// at the config only in their worker, whose first step (lock_config, then
// load_config or check_running) fails the same way before anything ran:
// runTask starts such a task once more on the VM's node. A request that
// failed otherwise (a timeout, a dropped connection, a node Proxmox could
// not reach) is never sent again: it may have run.
//
// Offline nodes: a call on a VM whose node the view lists offline fails at
// once with a *NodeError (hypervisor.ErrBackend) naming the node; Status and
// ListVMs report such a VM's state unknown, with the node. When Proxmox
// cannot forward a request to the VM's node (pve-http-server's
// proxy_request answers AnyEvent::HTTP's 595-599 pseudo statuses, "595 No
// route to host" for a node that is down), the call fails with a *NodeError
// too and the next call reads the view again.
//
// Concurrency: a placement is safe for concurrent use; mu guards the
// fields below it and is never held across I/O. Reads of the view are
// shared: a caller that needs a fresh view while one is being read waits
// for that read, unless it needs one begun after a wrong-node answer it got.

// nodeOffline is a node's state when corosync lost it.
const nodeOffline = "offline"

// readTimeout bounds one read of the view (callers wait on their own context).
const readTimeout = time.Minute

// resource is one entry of GET /cluster/resources: a VM (type qemu) or a
// node (type node).
type resource struct {
	ID     string `json:"id"`
	VMID   int    `json:"vmid"`
	Node   string `json:"node"`
	Name   string `json:"name"`
	Status string `json:"status"`
	Type   string `json:"type"`
}

// view is one read of /cluster/resources. It is never changed once made.
type view struct {
	vms   []resource       // QEMU VMs by vmid
	byID  map[int]resource // the same by vmid
	nodes map[string]string
	at    time.Time
	seq   uint64 // the read's number
}

// viewRead is a read in flight; done is closed when v or err is set.
type viewRead struct {
	seq  uint64
	done chan struct{}
	v    *view
	err  error
}

// placement is the driver's view of the cluster (see above).
type placement struct {
	api *api
	log *slog.Logger
	ttl time.Duration
	now func() time.Time
	// ctx bounds the reads; close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu  sync.Mutex
	cur *view
	// suspect: views from reads numbered up to it are not trusted (a
	// node could not be reached after they began).
	suspect uint64
	started uint64 // reads begun
	reading *viewRead
	waiting int // callers waiting for reading (tests look)
}

func newPlacement(a *api, log *slog.Logger) *placement {
	ctx, cancel := context.WithCancel(context.Background())
	return &placement{api: a, log: log, ttl: nodeTTL, now: time.Now, ctx: ctx, cancel: cancel}
}

func (p *placement) close() { p.cancel() }

// fetch reads /cluster/resources into a view (a VM or node whose vmid or
// name could not be in a URL is skipped, with a warning).
func (p *placement) fetch(ctx context.Context, seq uint64) (*view, error) {
	v := &view{byID: map[int]resource{}, nodes: map[string]string{}, at: p.now(), seq: seq}
	var rs []resource
	if err := p.api.send(ctx, "GET", "/cluster/resources", nil, nil, &rs); err != nil {
		return nil, err
	}
	for _, r := range rs {
		switch {
		case r.Type == "node" && CheckNode(r.Node) == nil:
			v.nodes[r.Node] = r.Status
		case r.Type == "node":
			p.log.Warn("skipping a cluster node with an invalid name", "node", r.Node)
		case r.Type != "qemu":
			// Containers have no guest agent; storage, pools, SDN are not VMs.
		case r.VMID < MinVMID || r.VMID > MaxVMID || CheckNode(r.Node) != nil:
			p.log.Warn("skipping a cluster resource with an invalid vmid or node", "vmid", r.VMID, "node", r.Node)
		default:
			v.byID[r.VMID] = r
		}
	}
	for _, r := range v.byID {
		v.vms = append(v.vms, r)
	}
	slices.SortFunc(v.vms, func(a, b resource) int { return a.VMID - b.VMID })
	return v, nil
}

// read returns a view read after read number after: the one in flight
// if it is, else a new one.
func (p *placement) read(ctx context.Context, after uint64) (*view, error) {
	for {
		p.mu.Lock()
		r := p.reading
		if r == nil {
			r = p.startRead()
		}
		p.waiting++
		p.mu.Unlock()
		var err error
		select {
		case <-r.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		p.mu.Lock()
		p.waiting--
		p.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if r.seq > after {
			return r.v, r.err
		}
	}
}

// waiters is how many callers wait for the read in flight.
func (p *placement) waiters() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiting
}

// startRead begins read number started+1 (mu held).
func (p *placement) startRead() *viewRead {
	p.started++
	r := &viewRead{seq: p.started, done: make(chan struct{})}
	p.reading = r
	go func() {
		ctx, cancel := context.WithTimeout(p.ctx, readTimeout)
		defer cancel()
		v, err := p.fetch(ctx, r.seq)
		p.mu.Lock()
		if err == nil && (p.cur == nil || v.seq > p.cur.seq) {
			p.cur = v
		}
		p.reading = nil
		r.v, r.err = v, err
		p.mu.Unlock()
		close(r.done)
	}()
	return r
}

// list reads the view (sharing a read in flight that began after the
// current view's and after any node was found unreachable).
func (p *placement) list(ctx context.Context) (*view, error) {
	p.mu.Lock()
	after := p.suspect
	if p.cur != nil {
		after = max(after, p.cur.seq)
	}
	p.mu.Unlock()
	return p.read(ctx, after)
}

// locate is VM vmid's entry and its node's state, from the view while it
// is fresh and knows the VM, else from a new read; ok is false for a VM the
// cluster does not list (to this token).
func (p *placement) locate(ctx context.Context, vmid int) (r resource, nodeState string, ok bool, err error) {
	p.mu.Lock()
	v := p.cur
	fresh := v != nil && v.seq > p.suspect && p.now().Sub(v.at) < p.ttl
	p.mu.Unlock()
	if !fresh || v.byID[vmid].VMID == 0 {
		if v, err = p.list(ctx); err != nil {
			return resource{}, "", false, err
		}
	}
	r, ok = v.byID[vmid]
	return r, v.nodes[r.Node], ok, nil
}

// nodeOf is the node the view puts vmid on.
func (p *placement) nodeOf(vmid int) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return "", false
	}
	r, ok := p.cur.byID[vmid]
	return r.Node, ok
}

// isAt reports whether the view puts vmid on node.
func (p *placement) isAt(vmid int, node string) bool {
	n, ok := p.nodeOf(vmid)
	return ok && n == node
}

// relocate reads the view again after a wrong-node answer from node from
// and returns the VM's node now: "" when the cluster no longer lists the
// VM or still puts it on from, a *NodeError when its node is offline.
func (p *placement) relocate(ctx context.Context, vmid int, from string) (string, error) {
	p.mu.Lock()
	after := p.started // the answer is in: a read begun from now on sees the move
	p.mu.Unlock()
	v, err := p.read(ctx, after)
	if err != nil {
		return "", err
	}
	r, ok := v.byID[vmid]
	switch {
	case !ok || r.Node == from:
		return "", nil
	case v.nodes[r.Node] == nodeOffline:
		return "", &NodeError{Node: r.Node, VMID: vmid}
	}
	p.log.Info("VM moved to another node; following it", "vmid", vmid, "from", from, "to", r.Node)
	return r.Node, nil
}

// do sends a request (api.do): one about a VM to the node the view puts it
// on, and once more to its new node after a wrong-node answer.
func (p *placement) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	m := vmReqRE.FindStringSubmatch(path)
	if m == nil {
		node := ""
		if n := nodeReqRE.FindStringSubmatch(path); n != nil {
			node = n[1]
		}
		return p.reached(node, 0, p.api.send(ctx, method, path, query, body, out))
	}
	node, rest := m[1], m[3]
	vmid, _ := strconv.Atoi(m[2])
	if cur, ok := p.nodeOf(vmid); ok {
		node = cur
	}
	err := p.api.send(ctx, method, vmPath(node, vmid)+rest, query, body, out)
	if !wrongNode(err, node, vmid) {
		return p.reached(node, vmid, err)
	}
	to, rerr := p.relocate(ctx, vmid, node)
	var ne *NodeError
	switch {
	case errors.As(rerr, &ne):
		return ne
	case rerr != nil || to == "":
		return err
	}
	return p.reached(to, vmid, p.api.send(ctx, method, vmPath(to, vmid)+rest, query, body, out))
}

// reached turns pveproxy's failure to forward a request to node (the
// AnyEvent::HTTP statuses 595 to 599 it passes on) into a *NodeError and
// has the view read again, by a read begun from now on, at the next call.
func (p *placement) reached(node string, vmid int, err error) error {
	var ae *APIError
	if node == "" || !errors.As(err, &ae) || ae.StatusCode < 595 || ae.StatusCode > 599 {
		return err
	}
	p.mu.Lock()
	p.suspect = p.started
	p.mu.Unlock()
	return &NodeError{Node: node, VMID: vmid, Err: ae}
}

var (
	// vmReqRE is a request path about a VM: node, vmid, the rest.
	vmReqRE = regexp.MustCompile(`^/nodes/([a-zA-Z0-9-]+)/qemu/([0-9]+)(/.*)?$`)
	// nodeReqRE is a request path a node answers (proxyto => 'node').
	nodeReqRE = regexp.MustCompile(`^/nodes/([a-zA-Z0-9-]+)/`)
	// PVE::AbstractConfig::load_config (pve-guest-common).
	loadConfigRE = regexp.MustCompile(`^Configuration file 'nodes/([^/']+)/qemu-server/([0-9]+)\.conf' does not exist$`)
	// PVE::QemuConfig::assert_config_exists_on_node (qemu-server).
	notOnNodeRE = regexp.MustCompile(`^unable to find configuration file for VM ([0-9]+) on node '([^']+)'$`)
)

// vmPath is the path prefix of VM vmid's calls on node.
func vmPath(node string, vmid int) string { return "/nodes/" + node + "/qemu/" + strconv.Itoa(vmid) }

// wrongNode reports whether err is Proxmox saying that VM vmid's config is
// not on node (HTTP 500 with load_config's or
// assert_config_exists_on_node's words naming them both).
func wrongNode(err error, node string, vmid int) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.StatusCode == http.StatusInternalServerError && wrongNodeMessage(ae.Message, node, vmid)
}

// wrongNodeMessage reports whether msg (an error message or a task's exit
// status) says that VM vmid's config is not on node.
func wrongNodeMessage(msg, node string, vmid int) bool {
	id := strconv.Itoa(vmid)
	if m := loadConfigRE.FindStringSubmatch(msg); m != nil {
		return m[1] == node && m[2] == id
	}
	if m := notOnNodeRE.FindStringSubmatch(msg); m != nil {
		return m[1] == id && m[2] == node
	}
	return false
}

// NodeError is a call that could not reach the node its VM is on: the
// cluster lists the node offline (Err nil), or Proxmox failed to forward a
// request to it (Err: its answer, such as HTTP 595 No route to host). It is
// a hypervisor.ErrBackend.
type NodeError struct {
	Node string
	VMID int // 0 when the call was not about a VM
	Err  error
}

func (e *NodeError) Error() string {
	switch {
	case e.Err == nil && e.VMID != 0:
		return fmt.Sprintf("VM %d is on node %s, which is offline (the cluster lists it so): calls on the VM fail until the node is back or HA moves the VM", e.VMID, e.Node)
	case e.Err == nil:
		return fmt.Sprintf("node %s is offline (the cluster lists it so)", e.Node)
	case e.VMID != 0:
		return fmt.Sprintf("Proxmox could not reach node %s, where VM %d is (%v): the node is offline or unreachable; try again once it is back", e.Node, e.VMID, e.Err)
	}
	return fmt.Sprintf("Proxmox could not reach node %s (%v): the node is offline or unreachable; try again once it is back", e.Node, e.Err)
}

// detail is the node's state in a VM's Status.Detail.
func (e *NodeError) detail() string {
	if e.Err == nil {
		return "node " + e.Node + " offline"
	}
	return "node " + e.Node + " unreachable: " + e.Err.Error()
}

// Unwrap makes a NodeError an ErrBackend and keeps the API's answer.
func (e *NodeError) Unwrap() []error {
	if e.Err == nil {
		return []error{hypervisor.ErrBackend}
	}
	return []error{hypervisor.ErrBackend, e.Err}
}
