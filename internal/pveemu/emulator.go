package pveemu

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"time"
)

// Options configures an Emulator.
type Options struct {
	// Version is the Proxmox VE the emulator is. Required (see PVE84 ...).
	Version Version
	// Nodes are the cluster's node names; empty means ["pve"]. The first
	// serves the API; requests for the others are forwarded to them as
	// pveproxy does (nodes.go). Every node starts online (SetNodeOnline).
	Nodes []string
	// NewMachine, when set, makes the Machine of a VM that clone creates
	// (the new VM's vmid and name); nil: clones have no Machine and their
	// start task fails saying so.
	NewMachine func(ctx context.Context, vmid int, name string) (Machine, error)
	// Logger; nil discards.
	Logger *slog.Logger
}

// VMSpec describes a VM to add.
type VMSpec struct {
	VMID int
	Node string
	Name string
	// Machine is the QEMU behind the VM; nil makes a VM whose power state
	// is only recorded and whose guest agent never answers.
	Machine Machine
	// Running is the initial state of a VM without a Machine.
	Running bool
	// NoAgent leaves "agent" out of the VM's config (the agent endpoints
	// then fail "No QEMU guest agent configured").
	NoAgent bool
	// Template marks the VM as a template.
	Template bool
	// MemoryMB and Cores are the config's memory and cores (defaults 512, 1).
	MemoryMB int
	Cores    int
}

// Emulator is a Proxmox VE API server (HTTPS, /api2/json) rebuilt from the
// upstream sources, with real QEMU guests behind its VMs. It is safe for
// concurrent use.
type Emulator struct {
	srv     *httptest.Server
	version Version
	nodes   []string
	log     *slog.Logger
	opts    Options
	routes  []route

	// mu guards tokens, vms, tasks, transcript, nextPID, lastSample/rrd,
	// offline/nodeSeen, skew and pidStat.
	mu         sync.Mutex
	tokens     map[string]*Token
	vms        map[int]*vm
	tasks      map[string]*task
	transcript []Exchange
	nextPID    int
	rrd        map[int]rrdEntry // vmid -> status as pvestatd last broadcast it
	lastSample time.Time
	offline    map[string]bool      // members whose corosync link is down
	nodeSeen   map[string]time.Time // a node's last status broadcast
	skew       time.Duration        // how far tests moved the broadcasts' clock
	pidStat    map[int]pidCPU       // vmstatus's $last_proc_pid_stat, by QEMU pid

	// vncKey signs the console tickets (console.go).
	vncKey ticketKey

	// wg counts running tasks and background work.
	wg     sync.WaitGroup
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
}

// statInterval is how often pvestatd refreshes the status that
// /cluster/resources reports (pve-manager PVE/Service/pvestatd.pm, $updatetime).
const statInterval = 10 * time.Second

// authFailureDelay: PVE::APIServer::AnyEvent delays every refused
// authentication by 3 seconds.
const authFailureDelay = 3 * time.Second

// New starts an emulator on a loopback TLS listener.
func New(opts Options) (*Emulator, error) {
	if err := opts.Version.Validate(); err != nil {
		return nil, err
	}
	nodes := opts.Nodes
	if len(nodes) == 0 {
		nodes = []string{"pve"}
	}
	for _, n := range nodes {
		if !nodeRE.MatchString(n) {
			return nil, fmt.Errorf("pveemu: node name %q", n)
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Emulator{version: opts.Version, nodes: nodes, log: log, opts: opts,
		tokens: map[string]*Token{}, vms: map[int]*vm{}, tasks: map[string]*task{}, rrd: map[int]rrdEntry{},
		offline: map[string]bool{}, nodeSeen: map[string]time.Time{}, nextPID: 4000, ctx: ctx, cancel: cancel}
	e.routes = e.routeTable()
	e.srv = httptest.NewUnstartedServer(http.HandlerFunc(e.serveHTTP))
	e.srv.Config.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	e.srv.StartTLS()
	return e, nil
}

// Close stops the server, waits for running tasks and closes the guest
// agent connections and the Machines the emulator made (clones'); Machines
// handed in through VMSpec stay with their owner.
func (e *Emulator) Close() error {
	e.srv.Close()
	e.cancel()
	e.wg.Wait()
	e.mu.Lock()
	vms := make([]*vm, 0, len(e.vms))
	for _, v := range e.vms {
		vms = append(vms, v)
	}
	e.mu.Unlock()
	var errs []error
	for _, v := range vms {
		errs = append(errs, v.close())
	}
	return errors.Join(errs...)
}

// URL is the server's base URL (https://127.0.0.1:PORT).
func (e *Emulator) URL() string { return e.srv.URL }

// CACertPEM is the server certificate, to trust it.
func (e *Emulator) CACertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: e.srv.Certificate().Raw})
}

// CertPool holds the server certificate.
func (e *Emulator) CertPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(e.srv.Certificate())
	return p
}

// Version is the emulated version.
func (e *Emulator) Version() Version { return e.version }

// AddToken registers an API token.
func (e *Emulator) AddToken(t Token) error {
	if !tokenFullRE.MatchString(t.ID) {
		return fmt.Errorf("pveemu: %q is not a token id", t.ID)
	}
	if t.Secret == "" {
		return errors.New("pveemu: empty token secret")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c := t
	c.ACL = append([]ACL(nil), t.ACL...)
	e.tokens[t.ID] = &c
	return nil
}

// AddVM adds a VM.
func (e *Emulator) AddVM(s VMSpec) error {
	if !vmidRE.MatchString(fmt.Sprint(s.VMID)) {
		return fmt.Errorf("pveemu: vmid %d", s.VMID)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.vms[s.VMID]; dup {
		return fmt.Errorf("pveemu: vmid %d exists", s.VMID)
	}
	v := newVM(s)
	e.vms[s.VMID] = v
	return nil
}

// Running reports whether VM vmid's QEMU runs (for tests).
func (e *Emulator) Running(vmid int) bool {
	e.mu.Lock()
	v := e.vms[vmid]
	e.mu.Unlock()
	return v != nil && v.machine.PID() != 0
}

// Exchange is one request and its answer, as the emulator saw them.
type Exchange struct {
	Request  string // "METHOD /path?query", then the body when there is one
	Response string // "CODE REASON", then the body
}

// Transcript returns the exchanges since the last ResetTranscript.
func (e *Emulator) Transcript() []Exchange {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Exchange(nil), e.transcript...)
}

// ResetTranscript forgets the recorded exchanges.
func (e *Emulator) ResetTranscript() {
	e.mu.Lock()
	e.transcript = nil
	e.mu.Unlock()
}

func (e *Emulator) record(req string, code int, reason string, body []byte) {
	e.mu.Lock()
	e.transcript = append(e.transcript, Exchange{Request: req, Response: fmt.Sprintf("%d %s\n%s", code, reason, body)})
	e.mu.Unlock()
}

// vmByID returns the VM or nil.
func (e *Emulator) vmByID(vmid int) *vm {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.vms[vmid]
}

func (e *Emulator) hasNode(n string) bool {
	for _, x := range e.nodes {
		if x == n {
			return true
		}
	}
	return false
}

// sortedVMIDs lists the vmids, ascending.
func (e *Emulator) sortedVMIDs() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := make([]int, 0, len(e.vms))
	for id := range e.vms {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

// readBody reads at most limit+1 bytes.
func readBody(r io.Reader, limit int64) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r, limit+1))
}
