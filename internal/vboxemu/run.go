package vboxemu

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
)

// WaitResult is ProcessWaitResult (VirtualBox.xidl).
type WaitResult int

// ProcessWaitResult values.
const (
	waitStart                WaitResult = 1
	waitTerminate            WaitResult = 2
	waitTimeout              WaitResult = 5
	waitFlagNotSupported     WaitResult = 9
	statusTerminatedNormally            = 500
	statusTerminatedSignal              = 510
)

// text is gctlProcessWaitResultToText.
func (r WaitResult) text() string {
	switch r {
	case waitStart:
		return "started"
	case waitTerminate:
		return "terminated"
	case waitTimeout:
		return "timed out"
	case waitFlagNotSupported:
		return "waiting flag not supported"
	}
	return "unknown"
}

// Exit codes of run (VBoxManageGuestCtrl.cpp EXITCODEEXEC_*).
const (
	exitExecTermSignal = 18
	exitExecTimeout    = 20
	exitExecCanceled   = 22
	exitMappedBig      = 126
)

// runExitCode is gctlRunCalculateExitCode for a normal exit: 0, the code
// displaced by 32 up to 93, 126 above; a signal is 18.
func runExitCode(st qga.ExecStatus) int {
	switch {
	case st.Signal != 0:
		return exitExecTermSignal
	case st.ExitCode == 0:
		return exitSuccess
	case st.ExitCode <= 93:
		return st.ExitCode + 32
	}
	return exitMappedBig
}

// runOpts are gctlHandleRunCommon's parsed options.
type runOpts struct {
	image, arg0, cwd string
	args             []string // aArgs as handed to ProcessCreate, argv[0] first
	env              []string
	timeout          time.Duration
	waitStdout       bool
	waitStderr       bool
}

// runOptionDefs is gctlHandleRunCommon's s_aOptions for the version.
func (c *gctlCtx) runOptionDefs() []optDef {
	v := c.e.v
	defs := []optDef{
		{long: "--putenv", short: 'E', id: "E", kind: reqString},
		{long: "--exe", short: 'e', id: "e", kind: reqString},
		{long: "--timeout", short: 't', id: "t", kind: reqUint32},
		{long: "--unquoted-args", short: 'u', id: "u"},
		{long: "--no-profile", id: "no-profile"},
		{long: "--profile", id: "profile"},
		{long: "--dos2unix", id: "dos2unix"},
		{long: "--unix2dos", id: "unix2dos"},
		{long: "--no-wait-stdout", id: "no-wait-stdout"},
		{long: "--wait-stdout", id: "wait-stdout"},
		{long: "--no-wait-stderr", id: "no-wait-stderr"},
		{long: "--wait-stderr", id: "wait-stderr"},
	}
	if v.AtLeast(7, 0) {
		defs = append(defs, optDef{long: "--ignore-orphaned-processes", id: "ignore-orphaned"},
			optDef{long: "--arg0", short: '0', id: "0", kind: reqString})
	} else {
		// 6.1 spells it this way (VBoxManageGuestCtrl.cpp s_aOptions).
		defs = append(defs, optDef{long: "--ignore-operhaned-processes", id: "ignore-orphaned"})
	}
	if v.HasRunCwd() {
		defs = append(defs, optDef{long: "--cwd", short: 'C', id: "C", kind: reqString})
	}
	return defs
}

// parseRun parses run's options and positional arguments. 7.x: the first
// positional argument is the image unless --exe gave it, every other one
// goes to aArgs, and the image (or --arg0) is pushed in front; 6.1: every
// positional argument goes to aArgs and the first becomes the image when
// --exe is absent.
func (c *gctlCtx) parseRun(args []string) (runOpts, int) {
	e := c.e
	o := runOpts{waitStdout: true, waitStderr: true}
	code := c.subOptions(args, c.runOptionDefs(), func(r *optResult) int {
		if r.def == nil {
			switch {
			case e.v.ArgvImageFirst() && o.image == "":
				o.image = r.value
			case e.v.ArgvImageFirst():
				o.args = append(o.args, r.value)
			default:
				o.args = append(o.args, r.value)
				if o.image == "" {
					o.image = r.value
				}
			}
			return -1
		}
		return c.runOption(&o, r)
	})
	if code >= 0 {
		return o, code
	}
	if o.image == "" {
		return o, e.syntaxError("No executable specified!")
	}
	if e.v.ArgvImageFirst() {
		first := o.image
		if o.arg0 != "" {
			first = o.arg0
		}
		o.args = append([]string{first}, o.args...)
		if c.verbose > 0 {
			e.printf("Executing:\n  Image : %s\n", o.image)
			for i, a := range o.args {
				e.printf("  arg[%d]: %s\n", i, a)
			}
		}
	}
	return o, -1
}

// runOption handles one of run's own options.
func (c *gctlCtx) runOption(o *runOpts, r *optResult) int {
	e := c.e
	switch r.def.id {
	case "E":
		if r.value == "" || r.value[0] == '=' {
			return e.syntaxError("Invalid argument variable[=value]: '%s'", r.value)
		}
		o.env = append(o.env, r.value)
	case "e":
		o.image = r.value
	case "0":
		o.arg0 = r.value
	case "C":
		o.cwd = r.value
	case "t":
		o.timeout = time.Duration(r.u32) * time.Millisecond
	case "no-profile":
		e.printf("Warning: Deprecated option \"--no-profile\" specified\n")
	case "dos2unix", "unix2dos":
		// gctlRunSetupHandle: "Unsupported %s line ending conversion" per handle.
		e.warningf("Unsupported stdout line ending conversion")
		e.warningf("Unsupported stderr line ending conversion")
	case "wait-stdout":
		o.waitStdout = true
	case "no-wait-stdout":
		o.waitStdout = false
	case "wait-stderr":
		o.waitStderr = true
	case "no-wait-stderr":
		o.waitStderr = false
	}
	return -1
}

// handleRun is gctlHandleRunCommon for `run`.
func (c *gctlCtx) handleRun(args []string) int {
	o, code := c.parseRun(args)
	if code >= 0 {
		return code
	}
	if code := c.postOptionParsingInit(); code != exitSuccess {
		return code
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	r := &runner{c: c, o: o, sigs: sigs}
	return r.run()
}

// runner is one guest process of `run`.
type runner struct {
	c    *gctlCtx
	o    runOpts
	sigs chan os.Signal

	start    time.Time // msStart
	started  time.Time // the guest process's start (VBoxService's clock)
	pid      int64
	spinned  float64 // loop iterations already printed while running
	canceled bool
}

func (r *runner) verbose() bool { return r.c.verbose > 0 }

// remaining is gctlRunGetRemainingTime; ok false once the deadline passed.
func (r *runner) remaining() (time.Duration, bool) {
	if r.o.timeout == 0 {
		return time.Hour, true
	}
	left := r.o.timeout - time.Since(r.start)
	return left, left > 0
}

func (r *runner) run() int {
	e := r.c.e
	r.start = time.Now()
	if r.verbose() {
		if r.o.timeout == 0 {
			e.printf("Starting guest process ...\n")
		} else {
			e.printf("Starting guest process (within %dms)\n", r.o.timeout.Milliseconds())
		}
	}
	if code, ok := r.create(); !ok {
		return code
	}
	if r.verbose() {
		e.printf("Process '%s' (PID %d) started\n", r.o.image, r.pid)
	}
	r.c.setProcess(r.pid, "started", r.o.image)
	return r.loop()
}

// create is IGuestSession::ProcessCreate and the wait for the start.
func (r *runner) create() (int, bool) {
	e, c := r.c.e, r.c
	if r.o.cwd != "" && !gaAtLeast(c.m.gaVersion(e.v), 7, 1) {
		// GuestSession::processCreateEx: no VBOX_GUESTCTRL_GF_0_PROCESS_CWD.
		e.comError("Setting the current working directory is not supported by the installed Guest Addtions!",
			comCode{"VBOX_E_NOT_SUPPORTED", 0x80bb0009}, "GuestSessionWrap", "IGuestSession", r.processCreateSite())
		return exitFailure, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid, err := r.c.g.start(ctx, procSpec{image: r.o.image, argv: r.o.args, env: r.o.env, cwd: r.o.cwd})
	switch {
	case errors.Is(err, errImageNotFound):
		// GuestProcess::waitFor on a process in status Error (VERR_FILE_NOT_FOUND).
		e.comError("Waiting for guest process (flags 0x1) failed: No such file or directory \""+r.o.image+"\" on guest",
			codeIPRTError, "GuestProcessWrap", "IGuestProcess", siteGctlWaitStart)
		return exitFailure, false
	case err != nil:
		e.comError("Waiting for guest process (flags 0x1) failed: Error "+err.Error()+" for guest process \""+r.o.image+"\" occurred",
			codeIPRTError, "GuestProcessWrap", "IGuestProcess", siteGctlWaitStart)
		return exitFailure, false
	}
	r.pid, r.started = pid, time.Now()
	return 0, true
}

func (r *runner) processCreateSite() contextSite {
	if r.c.e.v.HasRunCwd() {
		return siteGctlProcessCreate71
	}
	return siteGctlProcessCreate61
}

// gaAtLeast reports whether an Additions version string is major.minor or
// newer.
func gaAtLeast(ga string, major, minor int) bool {
	var a, b int
	if n, _ := sscanVersion(ga, &a, &b); n < 2 {
		return false
	}
	return a > major || (a == major && b >= minor)
}
