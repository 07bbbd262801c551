package vboxemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"sort"
	"time"
)

// gctlCtx is GCTLCMDCTX (VBoxManageGuestCtrl.cpp): the VM, the common
// options and the guest session of one guestcontrol command.
type gctlCtx struct {
	e         *emu
	vm        string
	sub       string
	anonymous bool // GCTLCMDCTX_F_SESSION_ANONYMOUS
	verbose   int
	user      string
	password  string
	domain    string

	m         *Machine
	g         *guest
	sessionID uint32
	session   bool // a guest session is registered and must be closed
	detach    bool // fDetachGuestSession
}

// gctlSub is one entry of handleGuestControl's s_aCmdDefs.
type gctlSub struct {
	name      string
	handler   func(c *gctlCtx, args []string) int
	anonymous bool
}

var gctlSubs = []gctlSub{
	{name: "run", handler: (*gctlCtx).handleRun},
	{name: "copyfrom", handler: func(c *gctlCtx, args []string) int { return c.handleCopy(args, false) }},
	{name: "copyto", handler: func(c *gctlCtx, args []string) int { return c.handleCopy(args, true) }},
	{name: "list", handler: (*gctlCtx).handleList, anonymous: true},
}

// commonOptions is GCTLCMD_COMMON_OPTION_DEFS (6.1 has no --user).
func (c *gctlCtx) commonOptions() []optDef {
	defs := []optDef{
		{long: "--username", id: "user", kind: reqString},
		{long: "--passwordfile", id: "passwordfile", kind: reqString},
		{long: "--password", id: "password", kind: reqString},
		{long: "--domain", id: "domain", kind: reqString},
		{long: "--quiet", short: 'q', id: "q"},
		{long: "--verbose", short: 'v', id: "v"},
	}
	if c.e.v.AtLeast(7, 0) {
		defs = append([]optDef{{long: "--user", id: "user", kind: reqString}}, defs...)
	}
	return defs
}

// setOption is gctlCtxSetOption; it reports whether r was a common option
// and the exit code when handling it failed.
func (c *gctlCtx) setOption(r *optResult) (bool, int) {
	if r.def == nil {
		return false, 0
	}
	switch r.def.id {
	case "user":
		c.user = r.value
	case "password":
		if c.password != "" {
			c.e.warningf("Password is given more than once.")
		}
		c.password = r.value
	case "passwordfile":
		pw, code := c.e.readPasswordFile(r.value)
		if code != exitSuccess {
			return true, code
		}
		c.password = pw
	case "domain":
		c.domain = r.value
	case "v":
		c.verbose++
	case "q":
		if c.verbose > 0 {
			c.verbose--
		}
	default:
		return false, 0
	}
	return true, exitSuccess
}

// readPasswordFile is src/VBox/Frontends/Common/PasswordInput.cpp
// readPasswordFile: the file's first bytes up to the first control
// character.
func (e *emu) readPasswordFile(name string) (string, int) {
	raw, err := os.ReadFile(name)
	if err != nil {
		rc := "VERR_FILE_NOT_FOUND"
		if errors.Is(err, os.ErrPermission) {
			rc = "VERR_ACCESS_DENIED"
		}
		e.errorf("Cannot open password file '%s' (%s)", name, rc)
		return "", exitFailure
	}
	if len(raw) > 511 {
		raw = raw[:511]
	}
	i := 0
	for i < len(raw) && raw[i] >= 0x20 && raw[i] != 0x7f {
		i++
	}
	if i >= 511 {
		e.errorf("Provided password in file '%s' is too long", name)
		return "", exitFailure
	}
	return string(raw[:i]), exitSuccess
}

// handleGuestControl is VBoxManageGuestCtrl.cpp handleGuestControl:
// common options and the VM name (no sorting) until the sub-command, whose
// handler gets the rest; gctlCtxTerm runs after it.
func (e *emu) handleGuestControl(args []string) int {
	e.legacySyntax = !e.v.AtLeast(7, 0)
	c := &gctlCtx{e: e}
	// gctrCmdCtxInit: the user name defaults to the host's (RTProcQueryUsername).
	if u, err := user.Current(); err == nil {
		c.user = u.Username
	}
	g := newGetopt(args, c.commonOptions(), false)
	if code := g.each(e.getoptError, func(r *optResult) int {
		if code, ok := c.common(r); ok {
			return code
		}
		if c.vm == "" {
			c.vm = r.value
			return -1
		}
		for _, s := range gctlSubs {
			if s.name == r.value {
				c.sub, c.anonymous = s.name, s.anonymous
				code := s.handler(c, args[g.i:])
				c.term()
				return code
			}
		}
		return e.syntaxError("Unknown sub-command: '%s'", r.value)
	}); code >= 0 {
		return code
	}
	if c.vm != "" {
		return e.syntaxError("Missing sub-command")
	}
	return e.syntaxError("Missing VM name and sub-command")
}

// subOptions parses a sub-command's options (RTGETOPTINIT_FLAGS_OPTS_FIRST)
// and hands each non-common one to f; f returns a non-negative exit code
// to stop.
func (c *gctlCtx) subOptions(args []string, defs []optDef, f func(r *optResult) int) int {
	g := newGetopt(args, append(c.commonOptions(), defs...), true)
	return g.each(c.e.getoptError, func(r *optResult) int {
		if code, ok := c.common(r); ok {
			return code
		}
		return f(r)
	})
}

// common handles a standard or a common option: (exit code, true) when
// it did, the code -1 when parsing goes on.
func (c *gctlCtx) common(r *optResult) (int, bool) {
	if code, done := c.e.stdOption(r); done {
		return code, true
	}
	if handled, code := c.setOption(r); handled {
		if code != exitSuccess {
			return code, true
		}
		return -1, true
	}
	return 0, false
}

// postOptionParsingInit is gctlCtxPostOptionParsingInit: the user name,
// the VM session and, unless anonymous, the guest session.
func (c *gctlCtx) postOptionParsingInit() int {
	if !c.anonymous && c.user == "" {
		return c.e.syntaxError("No user name specified!")
	}
	if code := c.initVMSession(); code != exitSuccess {
		return code
	}
	if c.anonymous {
		return exitSuccess
	}
	return c.initGuestSession()
}

// initVMSession is gctlCtxInitVmSession: the machine must be Running.
func (c *gctlCtx) initVMSession() int {
	w, err := c.e.h.read()
	if err != nil {
		c.e.errorf("emulator: %v", err)
		return exitFailure
	}
	m := w.find(c.vm)
	if m == nil {
		return c.e.notFound(c.vm, siteGctlFindMachine)
	}
	if m.State != "running" {
		c.e.errorf("Machine \"%s\" is not running (currently %s)!\n", c.vm, machineStateLong(m.State))
		return exitFailure
	}
	c.m = m
	if m.QGASocket != "" {
		c.g = newGuest(c.e.h, m)
	}
	return exitSuccess
}

// siteCreateSession is gctlCtxInitGuestSession's IGuest::CreateSession call.
var siteCreateSession = contextSite{"VBoxManageGuestCtrl.cpp",
	"CreateSession(Bstr(pCtx->strUsername).raw(), Bstr(pCtx->strPassword).raw(), Bstr(pCtx->strDomain).raw(), Bstr(pszSessionName).raw(), pCtx->pGuestSession.asOutParam())",
	map[string]int{"6.1": 868, "7.0": 747, "7.1": 747}}

// initGuestSession is gctlCtxInitGuestSession with what the session start
// does in Main and the host service:
//   - IGuest::CreateSession fails "Guest Additions are not installed or not
//     ready (yet)" when no Additions version was reported
//     (GuestSession::i_determineProtocolVersion: VERR_NOT_FOUND).
//   - the start (GuestSession::i_startSession) sends HOST_MSG_SESSION_CREATE:
//     without the host service HGCM answers VERR_HGCM_SERVICE_NOT_FOUND;
//     with no guest client connected the service answers VERR_NOT_FOUND
//     (VBoxGuestControlSvc.cpp hostProcessMessage); a wrong password is
//     VERR_AUTHENTICATION_FAILURE from the guest. WaitForArray then fails
//     with GuestSession::waitFor's "Waiting for guest process failed: ..."
//     and the session error text (GuestSession::i_guestErrorToString).
func (c *gctlCtx) initGuestSession() int {
	e := c.e
	name := fmt.Sprintf("[%d] VBoxManage Guest Control [%s] - %s", os.Getpid(), c.vm, c.sub)
	if c.verbose > 0 {
		e.printf("Creating guest session as user '%s'...\n", c.user)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c.m.gaVersion(e.v) == "" || c.g == nil || c.g.ping(ctx) != nil {
		e.comError("Guest Additions are not installed or not ready (yet)", comCode{"VBOX_E_GSTCTL_GUEST_ERROR", 0x80bb000f},
			"GuestWrap", "IGuest", siteCreateSession)
		return exitFailure
	}
	if c.verbose > 0 {
		e.printf("Waiting for guest session to start...\n")
	}
	reason := ""
	switch control, err := c.g.controlService(ctx); {
	case c.m.HostServiceMissing:
		reason = "The guest execution service is not available"
	case err != nil || !control:
		reason = "The guest execution service is not ready (yet)"
	case !c.credentialsOK():
		reason = "The specified user was not able to logon on guest"
	}
	if reason != "" {
		e.comError("Waiting for guest process failed: "+reason, codeIPRTError, "GuestSessionWrap", "IGuestSession", siteGctlWaitSession)
		return exitFailure
	}
	if err := c.registerSession(name); err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	if c.verbose > 0 {
		e.printf("Successfully started guest session (ID %d)\n", c.sessionID)
	}
	return exitSuccess
}

func (c *gctlCtx) credentialsOK() bool {
	pw, ok := c.e.w.Users[c.user]
	return ok && pw == c.password
}

// registerSession is Guest::i_sessionCreate: the lowest free session ID
// from VBOX_GUESTCTRL_SESSION_ID_BASE (1) (GuestCtrlImpl.cpp).
func (c *gctlCtx) registerSession(name string) error {
	return c.e.h.updateMachine(c.m.UUID, func(m *Machine) error {
		used := map[uint32]bool{}
		for _, s := range m.Sessions {
			used[s.ID] = true
		}
		id := uint32(1)
		for used[id] {
			id++
		}
		m.Sessions = append(m.Sessions, &GuestSession{ID: id, Name: name, User: c.user, Status: "started", OwnerPID: os.Getpid()})
		c.sessionID, c.session = id, true
		return nil
	})
}

// setProcess records a process of the session (IGuestSession::Processes).
func (c *gctlCtx) setProcess(pid int64, status, command string) {
	c.e.h.updateMachine(c.m.UUID, func(m *Machine) error {
		for _, s := range m.Sessions {
			if s.ID != c.sessionID {
				continue
			}
			for _, p := range s.Processes {
				if p.PID == pid {
					p.Status = status
					return nil
				}
			}
			s.Processes = append(s.Processes, &GuestProcess{PID: pid, Status: status, Command: command})
			return nil
		}
		return errNoChange
	})
}

// term is gctlCtxTerm: close the guest session (unless detached) and say so.
func (c *gctlCtx) term() {
	if !c.session {
		return
	}
	if c.detach {
		if c.verbose > 0 {
			c.e.printf("Guest session detached\n")
		}
		return
	}
	if c.verbose > 0 {
		c.e.printf("Closing guest session ...\n")
	}
	c.e.h.updateMachine(c.m.UUID, func(m *Machine) error {
		kept := m.Sessions[:0]
		for _, s := range m.Sessions {
			if s.ID != c.sessionID {
				kept = append(kept, s)
			}
		}
		m.Sessions = kept
		return nil
	})
}

// handleList is gctlHandleList (anonymous: no guest session): the sessions
// of the VM and, for "processes" and "all", their processes.
func (c *gctlCtx) handleList(args []string) int {
	e := c.e
	seen, procs := false, false
	code := c.subOptions(args, nil, func(r *optResult) int {
		if r.def != nil {
			return e.getoptError(&optError{rc: "VERR_GETOPT_UNKNOWN_OPTION", psz: r.def.long})
		}
		switch r.value {
		case "sessions", "sess", "files":
		case "processes", "procs", "all":
			procs = true
		default:
			return e.syntaxError("Unknown list: '%s'", r.value)
		}
		seen = true
		return -1
	})
	if code >= 0 {
		return code
	}
	if !seen {
		return e.syntaxError("Missing list name")
	}
	if code := c.postOptionParsingInit(); code != exitSuccess {
		return code
	}
	w, err := e.h.read()
	if err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	m := w.find(c.m.UUID)
	if m == nil || len(m.Sessions) == 0 {
		e.printf("No active guest sessions found\n")
		return exitSuccess
	}
	sessions := append([]*GuestSession(nil), m.Sessions...)
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].ID < sessions[j].ID })
	e.printf("Active guest sessions:\n")
	total := 0
	for i, s := range sessions {
		e.printf("\n\tSession #%-3d ID=%-3d User=%-16s Status=[%s] Name=%s", i, s.ID, s.User, s.Status, s.Name)
		if procs {
			for j, p := range s.Processes {
				e.printf("\n\t\tProcess #%-03d PID=%-6d Status=[%s] Command=%s", j, p.PID, p.Status, p.Command)
			}
			total += len(s.Processes)
		}
	}
	e.printf("\n\nTotal guest sessions: %d\n", len(sessions))
	if procs {
		e.printf("Total guest processes: %d\n", total)
	}
	return exitSuccess
}
