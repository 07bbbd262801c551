package libvirt

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/agentexec"
	"github.com/vmgate/vmgate/plugins/internal/helperchan"
)

// Driver is the libvirt backend. It is safe for concurrent use.
type Driver struct {
	// Exec is the exec road shared with the other guest-agent drivers:
	// AgentInfo, Run, ExecStart and ExecStatus (see agentexec.Core), every
	// agent command going through libvirt.
	agentexec.Exec

	cfg Config
	ep  endpoint
	log *slog.Logger

	// dial opens a new connection; tests replace it.
	dial func() (conn, error)
	// dialing is a one-slot semaphore held while a dial runs.
	dialing chan struct{}

	// core is the exec road; it tracks the commands ExecStart started and
	// caches guest-info per domain.
	core *agentexec.Core
	// helpers are the resident helpers' channels (helper.go).
	helpers *helperchan.Pool

	// mu guards conn, doms, destroyed and closed. It is never held across I/O.
	mu     sync.Mutex
	conn   conn
	doms   map[string]*domState
	closed bool
	// destroyed remembers transient domains this driver destroyed, by
	// name, so that starting one again says ErrNotSupported, not unknown VM.
	destroyed map[string]string // name -> UUID

	// dialConsole opens a connection for one console stream; tests
	// replace it. consMu guards consoles; consWG counts the streams'
	// goroutines (console.go).
	dialConsole func() (consoleConn, error)
	// streamDialer connects a screenshot's own RPC connection
	// (rpcstream.go); tests replace it.
	streamDialer socket.Dialer
	consMu       sync.Mutex
	consoles     map[string]*console
	consWG       sync.WaitGroup
}

var (
	_ hypervisor.Driver       = (*Driver)(nil)
	_ hypervisor.Runner       = (*Driver)(nil)
	_ hypervisor.Closer       = (*Driver)(nil)
	_ hypervisor.HelperCaller = (*Driver)(nil)
)

// domState is one domain's handle and caches.
type domState struct {
	name string
	// agentSlot is a one-slot semaphore: one agent call in flight per domain.
	agentSlot chan struct{}

	// mu guards dom, checkedAt and helper. Never held across I/O.
	mu        sync.Mutex
	dom       golibvirt.Domain
	checkedAt time.Time // when dom was looked up and found to pass the filters
	// helper is the resident helper's channel socket as the running
	// domain's XML gave it (helper.go), for the domain id it was read for.
	helper helperSocket
}

func (s *domState) handle() golibvirt.Domain {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dom
}

func (s *domState) agent(d *Driver) qga.Agent {
	return qga.Agent{Caller: agentCaller{d: d, dom: s}, ChunkBytes: maxFileChunk}
}

// domainName is what the driver accepts as a VM name: no slash (the server's
// ids are <backend>/<name>), no spaces or control characters.
var domainName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+:@-]{0,127}$`)

// New checks cfg and returns a Driver. Nothing is connected yet.
func New(cfg Config) (*Driver, error) {
	ep, err := cfg.check()
	if err != nil {
		return nil, fmt.Errorf("libvirt: config: %w", err)
	}
	if cfg.ExecTimeout == 0 {
		cfg.ExecTimeout = DefaultExecTimeout
	}
	if cfg.InfoTTL == 0 {
		cfg.InfoTTL = DefaultInfoTTL
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	d := &Driver{
		cfg:       cfg,
		ep:        ep,
		log:       log.With("driver", "libvirt"),
		dialing:   make(chan struct{}, 1),
		doms:      map[string]*domState{},
		destroyed: map[string]string{},
	}
	d.core = agentexec.NewCore(agentexec.CoreConfig{Driver: "libvirt", Reach: d.reach,
		ExecTimeout: cfg.ExecTimeout, InfoTTL: cfg.InfoTTL, Logger: d.log})
	d.Exec = d.core.Exec()
	d.helpers = helperchan.New(helperchan.Options{SilenceLimit: cfg.HelperSilenceLimit})
	d.dial = func() (conn, error) { return dialLibvirt(ep, cfg.DialTimeout) }
	d.consoles = map[string]*console{}
	d.streamDialer = dialer{ep: ep, timeout: cfg.DialTimeout}
	d.dialConsole = func() (consoleConn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.DialTimeout)
		defer cancel()
		return dialStream(ctx, d.streamDialer, ep.name)
	}
	return d, nil
}

// Close stops the exec watchdogs and closes the connection.
func (d *Driver) Close() error {
	d.mu.Lock()
	d.closed = true
	c := d.conn
	d.conn = nil
	d.doms = map[string]*domState{}
	d.mu.Unlock()
	d.core.Close()
	d.helpers.Close()
	consErr := d.closeConsoles()
	if c == nil {
		return consErr
	}
	done := make(chan error, 1)
	go func() { done <- c.Disconnect() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("libvirt: close: %w", err)
		}
		return consErr
	case <-time.After(5 * time.Second):
		return errors.New("libvirt: close: libvirtd did not answer the disconnect")
	}
}

// opError wraps a libvirt call's error for op: a deadline becomes
// ErrTimeout (once), "operation invalid" (domain not running) ErrVMNotRunning.
func opError(op string, err error) error {
	switch {
	case errors.Is(err, hypervisor.ErrTimeout):
		return fmt.Errorf("libvirt: %s: %w", op, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("libvirt: %s: %w: %w", op, hypervisor.ErrTimeout, err)
	case libvirtCode(err) == golibvirt.ErrOperationInvalid:
		return fmt.Errorf("libvirt: %s: %w: %w", op, hypervisor.ErrVMNotRunning, err)
	}
	return fmt.Errorf("libvirt: %s: %w", op, err)
}

// matches reports whether the domain passes the configured filters. The
// metadata check is a libvirt call.
func (d *Driver) matches(ctx context.Context, c conn, dom golibvirt.Domain) (bool, error) {
	if d.cfg.NameGlob != "" {
		if ok, _ := path.Match(d.cfg.NameGlob, dom.Name); !ok {
			return false, nil
		}
	}
	if d.cfg.MetadataURI == "" {
		return true, nil
	}
	_, err := c.DomainGetMetadata(dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{d.cfg.MetadataURI}, golibvirt.DomainAffectCurrent)
	switch {
	case err == nil:
		return true, nil
	case libvirtCode(err) == golibvirt.ErrNoDomainMetadata:
		return false, nil
	}
	return false, err
}

// lookup returns the state of the domain called name, looking it up in
// libvirt (and checking the filters) when the cached handle is older than
// lookupTTL.
func (d *Driver) lookup(ctx context.Context, op, name string) (*domState, error) {
	if !domainName.MatchString(name) {
		return nil, fmt.Errorf("libvirt: %s: %w: %q is not a valid domain name", op, hypervisor.ErrUnknownVM, name)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, fmt.Errorf("libvirt: %s: driver closed", op)
	}
	s := d.doms[name]
	d.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		fresh := time.Since(s.checkedAt) < lookupTTL
		s.mu.Unlock()
		if fresh {
			return s, nil
		}
	}
	var dom golibvirt.Domain
	var ok bool
	err := d.call(ctx, true, func(c conn) error {
		var err error
		if dom, err = c.DomainLookupByName(name); err != nil {
			return err
		}
		ok, err = d.matches(ctx, c, dom)
		return err
	})
	switch {
	case libvirtCode(err) == golibvirt.ErrNoDomain || (err == nil && !ok):
		if s != nil {
			d.forget(s)
		}
		return nil, fmt.Errorf("libvirt: %s: %w: %q", op, hypervisor.ErrUnknownVM, name)
	case err != nil:
		return nil, opError(op, err)
	}
	return d.remember(dom), nil
}

// remember records a looked-up domain, resetting the caches when the name
// now belongs to another domain (a new UUID).
func (d *Driver) remember(dom golibvirt.Domain) *domState {
	d.mu.Lock()
	s := d.doms[dom.Name]
	if s == nil {
		s = &domState{name: dom.Name, agentSlot: make(chan struct{}, 1)}
		d.doms[dom.Name] = s
	}
	d.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dom.UUID != dom.UUID {
		d.core.Forget(s.name) // another domain of the same name: its pids and guest are not ours
	}
	s.dom, s.checkedAt = dom, time.Now()
	return s
}

// forget drops a domain libvirt no longer has (or that no longer matches).
func (d *Driver) forget(s *domState) {
	d.mu.Lock()
	if d.doms[s.name] == s {
		delete(d.doms, s.name)
	}
	d.mu.Unlock()
	d.core.Forget(s.name)
}

// stateOf maps virDomainState to a hypervisor.State and a word for Detail.
func stateOf(st int32) (hypervisor.State, string) {
	switch golibvirt.DomainState(st) {
	case golibvirt.DomainRunning:
		return hypervisor.StateRunning, "running"
	case golibvirt.DomainBlocked:
		return hypervisor.StateRunning, "blocked"
	case golibvirt.DomainShutdown:
		return hypervisor.StateRunning, "shutting down"
	case golibvirt.DomainPaused:
		return hypervisor.StatePaused, "paused"
	case golibvirt.DomainPmsuspended:
		return hypervisor.StatePaused, "pmsuspended"
	case golibvirt.DomainShutoff:
		return hypervisor.StateStopped, "shut off"
	case golibvirt.DomainCrashed:
		return hypervisor.StateStopped, "crashed"
	}
	return hypervisor.StateUnknown, "no state"
}

// hasAgentChannel reports whether a domain's XML declares the guest agent channel.
func hasAgentChannel(domXML string) bool {
	_, ok := virtioChannel(domXML, "org.qemu.guest_agent.0")
	return ok
}

// virtioChannel finds the virtio-serial channel called name in a domain's
// XML and returns its unix socket's path ("" when it is no unix channel).
func virtioChannel(domXML, name string) (socket string, ok bool) {
	var v struct {
		Channels []struct {
			Type   string `xml:"type,attr"`
			Source struct {
				Path string `xml:"path,attr"`
			} `xml:"source"`
			Target struct {
				Type string `xml:"type,attr"`
				Name string `xml:"name,attr"`
			} `xml:"target"`
		} `xml:"devices>channel"`
	}
	if err := xml.Unmarshal([]byte(domXML), &v); err != nil {
		return "", false
	}
	for _, c := range v.Channels {
		if c.Target.Type == "virtio" && c.Target.Name == name {
			if c.Type == "unix" {
				return c.Source.Path, true
			}
			return "", true
		}
	}
	return "", false
}

// ListVMs returns the domains that pass the filters, sorted by name, with
// their state and whether they declare a guest agent channel.
func (d *Driver) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	var out []hypervisor.VM
	var found []golibvirt.Domain
	err := d.call(ctx, true, func(c conn) error {
		out, found = nil, nil
		doms, _, err := c.ConnectListAllDomains(1, 0)
		if err != nil {
			return err
		}
		for _, dom := range doms {
			if !domainName.MatchString(dom.Name) {
				d.log.Debug("domain name not usable as a VM name; skipped", "domain", dom.Name)
				continue
			}
			ok, err := d.matches(ctx, c, dom)
			if libvirtCode(err) == golibvirt.ErrNoDomain {
				continue // gone meanwhile
			}
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			vm := hypervisor.VM{Name: dom.Name, State: hypervisor.StateUnknown}
			st, _, err := c.DomainGetState(dom, 0)
			if libvirtCode(err) == golibvirt.ErrNoDomain {
				continue
			}
			if err != nil {
				return err
			}
			var detail string
			vm.State, detail = stateOf(st)
			persistent, err := c.DomainIsPersistent(dom)
			if err == nil {
				kind := "transient"
				if persistent == 1 {
					kind = "persistent"
				}
				vm.Info = "libvirt domain, " + kind + ", " + detail
			}
			if x, err := c.DomainGetXMLDesc(dom, 0); err == nil {
				vm.Agent = hasAgentChannel(x)
			}
			out = append(out, vm)
			found = append(found, dom)
		}
		return nil
	})
	if err != nil {
		return nil, opError("list", err)
	}
	for _, dom := range found {
		d.remember(dom)
	}
	slices.SortFunc(out, func(a, b hypervisor.VM) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// domainState returns the domain's state.
func (d *Driver) domainState(ctx context.Context, op string, s *domState) (hypervisor.State, string, error) {
	var st int32
	h := s.handle()
	err := d.call(ctx, true, func(c conn) error {
		var err error
		st, _, err = c.DomainGetState(h, 0)
		return err
	})
	if libvirtCode(err) == golibvirt.ErrNoDomain {
		d.forget(s)
		return "", "", fmt.Errorf("libvirt: %s: %w: %q", op, hypervisor.ErrUnknownVM, s.name)
	}
	if err != nil {
		return "", "", opError(op, err)
	}
	state, detail := stateOf(st)
	return state, detail, nil
}

// Status reports the domain's state and whether its agent answers a ping.
func (d *Driver) Status(ctx context.Context, name string) (hypervisor.Status, error) {
	s, err := d.lookup(ctx, "status", name)
	if err != nil {
		return hypervisor.Status{}, err
	}
	st := hypervisor.Status{Name: name}
	if st.State, st.Detail, err = d.domainState(ctx, "status", s); err != nil {
		return hypervisor.Status{}, err
	}
	if st.State != hypervisor.StateRunning {
		return st, nil // libvirt refuses agent calls to a domain that is not running
	}
	pctx, cancel := context.WithTimeout(ctx, statusPing)
	defer cancel()
	if err := s.agent(d).Ping(pctx); err != nil {
		if ctx.Err() != nil {
			return hypervisor.Status{}, d.core.Err(ctx, d.target(s), "status", err)
		}
		d.log.Debug("guest-ping failed", "vm", name, "err", err)
		return st, nil
	}
	st.AgentConnected = true
	if info, err := d.core.Info(pctx, d.target(s), false); err == nil {
		st.AgentVersion = info.Version
	}
	return st, nil
}

// reach is the core's way to a domain: the domain called name and its
// agent, through libvirt.
func (d *Driver) reach(ctx context.Context, op, name string) (agentexec.Target, error) {
	s, err := d.lookup(ctx, op, name)
	if err != nil {
		return agentexec.Target{}, err
	}
	return d.target(s), nil
}

// target is s as the core reaches it.
func (d *Driver) target(s *domState) agentexec.Target {
	return agentexec.Target{Key: s.name, Agent: s.agent(d), Why: notRunning}
}

// notRunning explains an agent libvirt refused because the domain is not
// running: the VM is not running either.
func notRunning(_ context.Context, err error) error {
	if errors.Is(err, errNotRunning) {
		return hypervisor.ErrVMNotRunning
	}
	return nil
}

// FileRead reads at most maxBytes of path in the guest (qga.Agent validates
// path and maxBytes before any agent command).
func (d *Driver) FileRead(ctx context.Context, name string, p string, maxBytes int64) (hypervisor.FileContent, error) {
	s, err := d.lookup(ctx, "file read", name)
	if err != nil {
		return hypervisor.FileContent{}, err
	}
	data, truncated, err := s.agent(d).FileRead(ctx, p, maxBytes)
	if err != nil {
		return hypervisor.FileContent{}, d.core.Err(ctx, d.target(s), "file read", err)
	}
	return hypervisor.FileContent{Data: data, Truncated: truncated}, nil
}

// FileWrite creates or replaces path in the guest (qga.Agent validates
// path and mode before any agent command).
func (d *Driver) FileWrite(ctx context.Context, name string, p string, data []byte, mode uint32) error {
	s, err := d.lookup(ctx, "file write", name)
	if err != nil {
		return err
	}
	if err := s.agent(d).FileWrite(ctx, p, data, mode); err != nil {
		return d.core.Err(ctx, d.target(s), "file write", err)
	}
	return nil
}

// Power performs action (see the package documentation).
func (d *Driver) Power(ctx context.Context, name string, action hypervisor.PowerAction) error {
	if !action.Valid() {
		return fmt.Errorf("libvirt: power: %w: unknown action %q", hypervisor.ErrInvalidArgument, action)
	}
	op := "power " + string(action)
	s, err := d.lookup(ctx, op, name)
	if errors.Is(err, hypervisor.ErrUnknownVM) && action == hypervisor.PowerStart {
		d.mu.Lock()
		_, gone := d.destroyed[name]
		d.mu.Unlock()
		if gone {
			return fmt.Errorf("libvirt: %s: %w: %s was a transient domain; destroying it removed it from libvirt", op, hypervisor.ErrNotSupported, name)
		}
	}
	if err != nil {
		return err
	}
	defer d.core.ForgetInfo(s.name)
	h := s.handle()
	switch action {
	case hypervisor.PowerShutdown:
		err = d.call(ctx, false, func(c conn) error {
			return c.DomainShutdownFlags(h, golibvirt.DomainShutdownGuestAgent|golibvirt.DomainShutdownAcpiPowerBtn)
		})
	case hypervisor.PowerReboot:
		err = d.call(ctx, false, func(c conn) error {
			return c.DomainReboot(h, golibvirt.DomainRebootGuestAgent|golibvirt.DomainRebootAcpiPowerBtn)
		})
	case hypervisor.PowerReset:
		err = d.call(ctx, false, func(c conn) error { return c.DomainReset(h, 0) })
	case hypervisor.PowerStop:
		return d.stop(ctx, op, s)
	default: // hypervisor.PowerStart
		return d.start(ctx, op, s)
	}
	if err != nil {
		return opError(op, err)
	}
	return nil
}

// stop destroys the domain; a transient one is remembered so that start
// can say why it cannot come back.
func (d *Driver) stop(ctx context.Context, op string, s *domState) error {
	h := s.handle()
	var persistent int32
	err := d.call(ctx, false, func(c conn) error {
		var err error
		if persistent, err = c.DomainIsPersistent(h); err != nil {
			return err
		}
		return c.DomainDestroy(h)
	})
	if err != nil {
		return opError(op, err)
	}
	d.core.Forget(s.name)
	if persistent != 1 {
		d.mu.Lock()
		d.destroyed[s.name] = fmt.Sprintf("%x", h.UUID)
		d.mu.Unlock()
		d.forget(s)
	}
	return nil
}

// start starts a defined (persistent) domain. A running or paused one is
// left alone (start does not resume a paused domain).
func (d *Driver) start(ctx context.Context, op string, s *domState) error {
	state, _, err := d.domainState(ctx, op, s)
	if err != nil {
		return err
	}
	if state == hypervisor.StateRunning || state == hypervisor.StatePaused {
		return nil
	}
	h := s.handle()
	var persistent int32
	err = d.call(ctx, false, func(c conn) error {
		var err error
		if persistent, err = c.DomainIsPersistent(h); err != nil || persistent != 1 {
			return err
		}
		return c.DomainCreate(h)
	})
	if err != nil {
		return opError(op, err)
	}
	if persistent != 1 {
		return fmt.Errorf("libvirt: %s: %w: %s is a transient domain", op, hypervisor.ErrNotSupported, s.name)
	}
	d.mu.Lock()
	delete(d.destroyed, s.name)
	d.mu.Unlock()
	return nil
}
