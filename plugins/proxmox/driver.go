package proxmox

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/agentexec"
)

// Driver defaults.
const (
	// DefaultExecTimeout bounds a command whose request sets no Timeout.
	DefaultExecTimeout = agentexec.DefaultExecTimeout
	// nodeTTL is how long a vmid's node from cluster/resources is trusted.
	nodeTTL = 5 * time.Second
	// infoTTL is how long agent/info is trusted for the exec preflight.
	infoTTL = 5 * time.Second
	// statusPing bounds the agent ping of Status.
	statusPing = 3 * time.Second
	// MaxFileWriteContent is Proxmox's limit on file-write's content (characters).
	MaxFileWriteContent = 61440
	// writeChunk is the raw bytes per file-write: base64 of it is exactly MaxFileWriteContent.
	writeChunk = MaxFileWriteContent / 4 * 3
	// MaxFileRead is what Proxmox's file-read returns at most.
	MaxFileRead = 16 << 20
)

// Config configures the Driver.
type Config struct {
	// URL of the API, https://host:8006 (the /api2/json suffix is optional).
	URL string
	// TokenID is USER@REALM!TOKENID.
	TokenID string
	// TokenSecretFile holds the token's secret (one line).
	TokenSecretFile string
	// CAFile is a PEM bundle to verify the server with; empty: the system roots.
	CAFile string
	// InsecureSkipVerify turns TLS verification off (logged with slog.Warn).
	InsecureSkipVerify bool
	// ExecTimeout bounds a command whose request has no Timeout.
	ExecTimeout time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Driver is the Proxmox VE backend. It is safe for concurrent use.
type Driver struct {
	// Exec is the exec road shared with the other guest-agent drivers:
	// AgentInfo, Run, ExecStart and ExecStatus (see agentexec.Core), over
	// Proxmox's agent endpoints (agentOf).
	agentexec.Exec

	api     *api
	log     *slog.Logger
	tokenID string
	// core is the exec road; it tracks the commands ExecStart started and
	// caches agent/info per VM.
	core *agentexec.Core

	// place is the view of the cluster: the node of each VM, the state of
	// each node (cluster.go). Every request goes through it (api.route).
	place *placement

	// mu guards the fields below. Never held across I/O.
	mu sync.Mutex
	// major and minor are the Proxmox VE version CheckAccess read (0: unknown).
	major, minor int
	// noCount: file-read refused "count" (qemu-server before 9.1.5).
	noCount bool

	// cons are the open serial consoles (console.go).
	cons consoles
}

var (
	_ hypervisor.Driver = (*Driver)(nil)
	_ hypervisor.Runner = (*Driver)(nil)
	_ hypervisor.Closer = (*Driver)(nil)
)

// New checks cfg, reads the token secret and CA file, and returns a Driver.
// Nothing is contacted yet (Open also checks the version and privileges).
func New(cfg Config) (*Driver, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("proxmox: config: %w", err)
	}
	if cfg.ExecTimeout == 0 {
		cfg.ExecTimeout = DefaultExecTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("driver", "proxmox")
	a, err := newAPI(cfg, log)
	if err != nil {
		return nil, err
	}
	d := &Driver{api: a, log: log, tokenID: cfg.TokenID, place: newPlacement(a, log)}
	d.cons.byID = map[int]*termSession{}
	a.route = d.place.do
	d.core = agentexec.NewCore(agentexec.CoreConfig{Driver: "proxmox", Reach: d.reach, MapErr: d.classify,
		ExecTimeout: cfg.ExecTimeout, InfoTTL: infoTTL, MaxStdin: MaxInputData, Logger: log})
	d.Exec = d.core.Exec()
	return d, nil
}

// Close stops the exec watchdogs and the view's reads and drops idle
// connections.
func (d *Driver) Close() error {
	d.closeConsoles()
	d.core.Close()
	d.place.close()
	d.api.client.CloseIdleConnections()
	return nil
}

// resources reads the cluster's QEMU VMs, by vmid (a new read of the
// view, or the one in flight).
func (d *Driver) resources(ctx context.Context) ([]resource, error) {
	v, err := d.place.list(ctx)
	if err != nil {
		return nil, err
	}
	return v.vms, nil
}

// vmRef is a validated VM: the path prefix of its API calls, on the node
// the view put it on when the call began (the placement sends each request
// to the node the view gives at that time).
type vmRef struct {
	vmid int
	node string
	path string // /nodes/{node}/qemu/{vmid}
}

// lookup validates name and resolves its node, which must not be offline.
func (d *Driver) lookup(ctx context.Context, op, name string) (vmRef, error) {
	v, offline, err := d.locate(ctx, op, name)
	if err != nil {
		return vmRef{}, err
	}
	if offline {
		return vmRef{}, fmt.Errorf("proxmox: %s: %w", op, &NodeError{Node: v.node, VMID: v.vmid})
	}
	return v, nil
}

// locate validates name and resolves its node, saying whether the node is
// offline.
func (d *Driver) locate(ctx context.Context, op, name string) (vmRef, bool, error) {
	vmid, err := ParseVMID(name)
	if err != nil {
		return vmRef{}, false, fmt.Errorf("proxmox: %s: %w: %w", op, hypervisor.ErrUnknownVM, err)
	}
	if err := ctx.Err(); err != nil {
		return vmRef{}, false, d.classify(op, err)
	}
	r, state, ok, err := d.place.locate(ctx, vmid)
	switch {
	case err != nil:
		return vmRef{}, false, d.classify(op, err)
	case !ok:
		return vmRef{}, false, fmt.Errorf("proxmox: %s: %w: %d", op, hypervisor.ErrUnknownVM, vmid)
	}
	if err := CheckNode(r.Node); err != nil {
		return vmRef{}, false, fmt.Errorf("proxmox: %s: %w", op, err)
	}
	return vmRef{vmid: vmid, node: r.Node, path: vmPath(r.Node, vmid)}, state == nodeOffline, nil
}

// agentOf is how the driver reaches v's guest agent: qga's command logic
// over Proxmox's agent/* endpoints (agentCaller).
func (d *Driver) agentOf(v vmRef) qga.Agent {
	return qga.Agent{Caller: agentCaller{api: d.api, path: v.path + "/agent"}}
}

// reach is the core's way to a VM: the VM called name and its agent.
func (d *Driver) reach(ctx context.Context, op, name string) (agentexec.Target, error) {
	v, err := d.lookup(ctx, op, name)
	if err != nil {
		return agentexec.Target{}, err
	}
	return d.target(v), nil
}

// target is v as the core reaches it.
func (d *Driver) target(v vmRef) agentexec.Target {
	return agentexec.Target{Key: strconv.Itoa(v.vmid), Agent: d.agentOf(v)}
}

func stateOf(status, qmpstatus string) hypervisor.State {
	switch {
	case qmpstatus == "paused" || qmpstatus == "suspended" || qmpstatus == "prelaunch":
		return hypervisor.StatePaused
	case status == "running":
		return hypervisor.StateRunning
	case status == "stopped":
		return hypervisor.StateStopped
	}
	return hypervisor.StateUnknown
}

// ListVMs lists the cluster's QEMU VMs by vmid. A VM on a node the cluster
// lists offline has state unknown (its own status there is its node's last
// broadcast), and its info says so.
func (d *Driver) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	v, err := d.place.list(ctx)
	if err != nil {
		return nil, d.classify("list vms", err)
	}
	vms := make([]hypervisor.VM, 0, len(v.vms))
	for _, r := range v.vms {
		vm := hypervisor.VM{Name: strconv.Itoa(r.VMID), State: stateOf(r.Status, ""), Info: "node " + r.Node}
		if v.nodes[r.Node] == nodeOffline {
			vm.State, vm.Info = hypervisor.StateUnknown, vm.Info+" (offline)"
		}
		if r.Name != "" {
			vm.Info += ", " + r.Name
		}
		vms = append(vms, vm)
	}
	return vms, nil
}

// Status reads status/current and, for a running VM, pings the agent. A VM
// whose node is offline, or that Proxmox cannot reach, has state unknown
// with the node in Detail.
func (d *Driver) Status(ctx context.Context, name string) (hypervisor.Status, error) {
	v, offline, err := d.locate(ctx, "status", name)
	if err != nil {
		return hypervisor.Status{}, err
	}
	if offline {
		return hypervisor.Status{Name: name, State: hypervisor.StateUnknown, Detail: (&NodeError{Node: v.node}).detail()}, nil
	}
	var cur struct {
		Status    string `json:"status"`
		QMPStatus string `json:"qmpstatus"`
	}
	if err := d.api.do(ctx, "GET", v.path+"/status/current", nil, nil, &cur); err != nil {
		if ne := (*NodeError)(nil); errors.As(err, &ne) {
			return hypervisor.Status{Name: name, State: hypervisor.StateUnknown, Detail: ne.detail()}, nil
		}
		return hypervisor.Status{}, d.classify("status", err)
	}
	st := hypervisor.Status{Name: name, State: stateOf(cur.Status, cur.QMPStatus), Detail: cur.Status}
	if cur.QMPStatus != "" {
		st.Detail = cur.QMPStatus
	}
	if st.State == hypervisor.StateRunning {
		pctx, cancel := context.WithTimeout(ctx, statusPing)
		defer cancel()
		err := d.agentOf(v).Ping(pctx)
		switch {
		case err == nil:
			st.AgentConnected = true
		case ctx.Err() != nil:
			return hypervisor.Status{}, d.classify("status", ctx.Err())
		case errors.Is(err, ErrAuth):
			// Without the agent privilege the answer would be a lie.
			return hypervisor.Status{}, d.classify("status: agent ping", err)
		}
	}
	return st, nil
}

// checkPath refuses a guest path that is not absolute or holds NUL or a newline.
func checkPath(op, path string) error {
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("proxmox: %s: %w: path %q must be absolute", op, hypervisor.ErrInvalidArgument, path)
	}
	if strings.ContainsAny(path, "\x00\n\r") {
		return fmt.Errorf("proxmox: %s: %w: path contains NUL or a line break", op, hypervisor.ErrInvalidArgument)
	}
	return nil
}

// FileRead reads path with agent/file-read and keeps at most maxBytes.
// Since qemu-server 9.1.5 file-read takes count, so only maxBytes+1 bytes
// are read (the extra byte tells a file of exactly maxBytes from a longer
// one); before, Proxmox reads the whole file, up to 16 MiB.
func (d *Driver) FileRead(ctx context.Context, name string, path string, maxBytes int64) (hypervisor.FileContent, error) {
	v, err := d.lookup(ctx, "file read", name)
	if err != nil {
		return hypervisor.FileContent{}, err
	}
	if err := checkPath("file read", path); err != nil {
		return hypervisor.FileContent{}, err
	}
	if maxBytes < 0 {
		return hypervisor.FileContent{}, fmt.Errorf("proxmox: file read: %w: negative max bytes", hypervisor.ErrInvalidArgument)
	}
	if maxBytes == 0 || maxBytes > MaxFileRead {
		maxBytes = MaxFileRead
	}
	r, err := d.fileRead(ctx, v, path, maxBytes)
	if err != nil {
		return hypervisor.FileContent{}, d.classify("file read", agentErr("guest-file-read", err))
	}
	if r.Content == nil {
		return hypervisor.FileContent{}, fmt.Errorf("proxmox: file read: %w: answer has no content", qga.ErrProtocol)
	}
	data, err := bytesString(*r.Content)
	if err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("proxmox: file read: %w: %w", qga.ErrProtocol, err)
	}
	fc := hypervisor.FileContent{Data: data, Truncated: bool(r.Truncated)}
	if int64(len(fc.Data)) > maxBytes {
		fc.Data, fc.Truncated = fc.Data[:maxBytes], true
	}
	return fc, nil
}

// FileWrite writes data with agent/file-write (base64, encode=0). Data over
// one request's limit is written as part files joined in the guest by cat
// through agent/exec; a mode is applied with chmod through agent/exec.
func (d *Driver) FileWrite(ctx context.Context, name string, path string, data []byte, mode uint32) error {
	v, err := d.lookup(ctx, "file write", name)
	if err != nil {
		return err
	}
	if err := checkPath("file write", path); err != nil {
		return err
	}
	if mode > 0o7777 {
		return fmt.Errorf("proxmox: file write: %w: mode %#o", hypervisor.ErrInvalidArgument, mode)
	}
	write := func(p string, b []byte) error {
		body := map[string]any{"file": p, "content": base64.StdEncoding.EncodeToString(b), "encode": 0}
		if err := d.api.do(ctx, "POST", v.path+"/agent/file-write", nil, body, nil); err != nil {
			return d.classify("file write", agentErr("guest-file-write", err))
		}
		return nil
	}
	if len(data) <= writeChunk {
		if err := write(path, data); err != nil {
			return err
		}
	} else {
		if err := d.core.Preflight(ctx, d.target(v), "file write"); err != nil {
			return err
		}
		// The parts are joined (and, on failure, removed) through agent/exec:
		// a token that may write files but not exec would leave them behind,
		// so exec is tried before the first part is written.
		if err := d.guestRun(ctx, v, []string{"/bin/true"}); err != nil {
			return fmt.Errorf("proxmox: file write: %d bytes are written in parts joined by agent/exec, which is refused: %w", len(data), err)
		}
		var rb [8]byte
		rand.Read(rb[:])
		prefix := path + ".vmgate-part-" + hex.EncodeToString(rb[:]) + "-"
		var parts []string
		for i := 0; i*writeChunk < len(data); i++ {
			p := prefix + strconv.Itoa(i)
			parts = append(parts, p)
			if err := write(p, data[i*writeChunk:min(len(data), (i+1)*writeChunk)]); err != nil {
				d.removeParts(v, parts)
				return err
			}
		}
		const join = `o=$1; shift; cat -- "$@" >"$o"; s=$?; rm -f -- "$@"; exit $s`
		if err := d.guestRun(ctx, v, append([]string{"/bin/sh", "-c", join, "sh", path}, parts...)); err != nil {
			d.removeParts(v, parts)
			return fmt.Errorf("proxmox: file write: joining %d parts: %w", len(parts), err)
		}
	}
	if mode != 0 {
		if err := d.guestRun(ctx, v, []string{"chmod", strconv.FormatUint(uint64(mode), 8), "--", path}); err != nil {
			return fmt.Errorf("proxmox: file write: chmod: %w", err)
		}
	}
	return nil
}

// fileReadAnswer is agent/file-read's answer.
type fileReadAnswer struct {
	Content   *string  `json:"content"`
	Truncated flexBool `json:"truncated"`
}

// fileRead asks for maxBytes+1 bytes with count where Proxmox may take it
// (PVE 9 and later, until it refuses count once: qemu-server before 9.1.5),
// else for the whole file.
func (d *Driver) fileRead(ctx context.Context, v vmRef, path string, maxBytes int64) (fileReadAnswer, error) {
	d.mu.Lock()
	useCount := !d.noCount && (d.major == 0 || d.major >= 9)
	d.mu.Unlock()
	var r fileReadAnswer
	q := url.Values{"file": {path}}
	if useCount {
		q.Set("count", strconv.FormatInt(min(maxBytes+1, MaxFileRead), 10))
	}
	err := d.api.do(ctx, "GET", v.path+"/agent/file-read", q, nil, &r)
	var ae *APIError
	if useCount && errors.As(err, &ae) && ae.StatusCode == http.StatusBadRequest && ae.Errors["count"] != "" {
		d.log.Info("this Proxmox VE reads files whole (no file-read count); reading up to 16 MiB", "vmid", v.vmid)
		d.mu.Lock()
		d.noCount = true
		d.mu.Unlock()
		q.Del("count")
		err = d.api.do(ctx, "GET", v.path+"/agent/file-read", q, nil, &r)
	}
	return r, err
}

// guestRun runs argv to completion and wants exit 0.
func (d *Driver) guestRun(ctx context.Context, v vmRef, argv []string) error {
	st, err := d.agentOf(v).Exec(ctx, qga.ExecRequest{Path: argv[0], Args: argv[1:], Timeout: time.Minute, MaxOutputBytes: 4096})
	if err != nil {
		return d.classify("exec", err)
	}
	if st.ExitCode != 0 || st.Signal != 0 || st.TimedOut {
		return fmt.Errorf("%s: exit %d, signal %d: %s", argv[0], st.ExitCode, st.Signal, strings.TrimSpace(string(st.Stderr)))
	}
	return nil
}

func (d *Driver) removeParts(v vmRef, parts []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.guestRun(ctx, v, append([]string{"rm", "-f", "--"}, parts...)); err != nil {
		d.log.Warn("removing file-write parts failed", "vmid", v.vmid, "err", err)
	}
}

// Power posts status/{shutdown,reboot,reset,stop,start}, a worker task,
// and waits for it: Proxmox answers the UPID at once, also for an action
// that will fail (start of a running VM), whose error is only in the
// task's exit status.
func (d *Driver) Power(ctx context.Context, name string, action hypervisor.PowerAction) error {
	if !action.Valid() {
		return fmt.Errorf("proxmox: power: %w: unknown action %q", hypervisor.ErrInvalidArgument, action)
	}
	v, err := d.lookup(ctx, "power", name)
	if err != nil {
		return err
	}
	op := "power " + string(action)
	if err := d.runTask(ctx, v, op, "POST", v.path+"/status/"+string(action), nil, struct{}{}); err != nil {
		return d.classify(op, err)
	}
	return nil
}
