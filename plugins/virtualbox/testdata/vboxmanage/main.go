// Command vboxmanage is a VBoxManage stand-in for the virtualbox driver's
// tests. It accepts the real argv grammar of the subcommands the driver
// uses (list vms, showvminfo --machinereadable, guestcontrol run|copyto|
// copyfrom, controlvm, startvm), prints VBoxManage's output formats and
// error lines, exits with VBoxManage's codes (2 for a syntax error, 1 for a
// failure, the `run` mapping of guest exit codes), and forwards guest
// operations to a lab VM's real qemu-ga through guest/qga.
//
// Its world comes from vbox.json next to its own executable (user,
// password, VMs with their qemu-ga sockets and states; power actions
// rewrite the states there), so each test copies the binary into its own
// directory and nothing depends on the environment (a plugin process does
// not inherit it). Every invocation appends one JSON line (argv, exit code,
// stdout, stderr) to vbox.log in the same directory.
//
// Like VirtualBox, it treats guest control as one service: a guest whose
// qemu-ga has guest-exec blocked has "no guest execution service" for run,
// copyto and copyfrom alike. Like VBoxService, a --timeout kills the guest
// process itself, not its children.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
)

type vmConfig struct {
	Name      string `json:"name"`
	UUID      string `json:"uuid"`
	State     string `json:"state"` // running, poweroff, paused
	QGASocket string `json:"qga_socket,omitempty"`
}

type config struct {
	Username string     `json:"username"`
	Password string     `json:"password"`
	VMs      []vmConfig `json:"vms"`
}

type emu struct {
	cfgPath string
	cfg     config
	stdout  *bytes.Buffer // copy of what was written, for the log
	stderr  *bytes.Buffer
	out     io.Writer
	errw    io.Writer
}

func main() {
	var so, se bytes.Buffer
	dir := "."
	if exe, err := os.Executable(); err == nil {
		dir = filepath.Dir(exe)
	}
	e := &emu{cfgPath: filepath.Join(dir, "vbox.json"), stdout: &so, stderr: &se}
	e.out = io.MultiWriter(os.Stdout, &so)
	e.errw = io.MultiWriter(os.Stderr, &se)
	code := e.run(os.Args[1:])
	appendLog(filepath.Join(dir, "vbox.log"), os.Args[1:], code, so.String(), se.String())
	os.Exit(code)
}

func appendLog(p string, argv []string, code int, stdout, stderr string) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	line, _ := json.Marshal(map[string]any{"argv": argv, "code": code, "stdout": stdout, "stderr": stderr})
	f.Write(append(line, '\n'))
}

func (e *emu) errorf(format string, args ...any) {
	fmt.Fprintf(e.errw, "VBoxManage: error: "+format+"\n", args...)
}

func (e *emu) syntax(format string, args ...any) int {
	e.errorf(format, args...)
	return 2
}

func (e *emu) run(args []string) int {
	raw, err := os.ReadFile(e.cfgPath)
	if err == nil {
		err = json.Unmarshal(raw, &e.cfg)
	}
	if err != nil {
		e.errorf("emulator: %s: %v", e.cfgPath, err)
		return 1
	}
	if len(args) == 0 {
		return e.syntax("No command given")
	}
	switch args[0] {
	case "list":
		return e.list(args[1:])
	case "showvminfo":
		return e.showvminfo(args[1:])
	case "guestcontrol":
		return e.guestcontrol(args[1:])
	case "controlvm":
		return e.controlvm(args[1:])
	case "startvm":
		return e.startvm(args[1:])
	}
	return e.syntax("Invalid command '%s'", args[0])
}

func (e *emu) find(name string) *vmConfig {
	for i := range e.cfg.VMs {
		if e.cfg.VMs[i].Name == name || e.cfg.VMs[i].UUID == name {
			return &e.cfg.VMs[i]
		}
	}
	return nil
}

func (e *emu) notFound(name, file string, line int) int {
	e.errorf("Could not find a registered machine named '%s'", name)
	e.errorf("Details: code VBOX_E_OBJECT_NOT_FOUND (0x80bb0001), component VirtualBoxWrap, interface IVirtualBox, callee nsISupports")
	e.errorf("Context: \"FindMachine(Bstr(VMNameOrUuid).raw(), machine.asOutParam())\" at line %d of file %s", line, file)
	return 1
}

func (e *emu) save() error {
	raw, err := json.MarshalIndent(e.cfg, "", "  ")
	if err != nil {
		return err
	}
	tmp := e.cfgPath + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, e.cfgPath)
}

func (e *emu) list(args []string) int {
	if len(args) != 1 || (args[0] != "vms" && args[0] != "runningvms") {
		return e.syntax("Invalid parameter '%s'", strings.Join(args, " "))
	}
	for _, vm := range e.cfg.VMs {
		if args[0] == "runningvms" && vm.State != "running" && vm.State != "paused" {
			continue
		}
		fmt.Fprintf(e.out, "\"%s\" {%s}\n", vm.Name, vm.UUID)
	}
	return 0
}

// perCall is a qga.Caller that connects for each call and disconnects
// after: QEMU's agent socket takes one client at a time, and several
// emulator processes (a run and the driver's kill of its process tree)
// share it, as VBoxService serves several sessions.
// Calls of all emulator processes to one socket are serialised with a
// flock on lock, so none finds the socket's backlog full.
type perCall struct{ socket, lock string }

func (p perCall) Call(ctx context.Context, command string, args, result any) error {
	f, err := os.OpenFile(p.lock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	c := qga.New(p.socket, qga.WithCallTimeout(30*time.Second))
	defer c.Close()
	return c.Call(ctx, command, args, result)
}

// agent is the guest agent of vm, nil when it has none.
type agent = *qga.Agent

func agentOf(cfgPath string, vm *vmConfig) agent {
	if vm.QGASocket == "" {
		return nil
	}
	return &qga.Agent{Caller: perCall{socket: vm.QGASocket, lock: filepath.Join(filepath.Dir(cfgPath), "qga.lock-"+vm.UUID)}}
}

func (e *emu) showvminfo(args []string) int {
	if len(args) == 0 {
		return e.syntax("Missing VM name")
	}
	name, machine := args[0], false
	for _, a := range args[1:] {
		switch a {
		case "--machinereadable":
			machine = true
		default:
			return e.syntax("Unknown option: %s", a)
		}
	}
	if !machine {
		return e.syntax("emulator: only --machinereadable output is emulated")
	}
	vm := e.find(name)
	if vm == nil {
		return e.notFound(name, "VBoxManageInfo.cpp", 2955)
	}
	runLevel, version := 0, ""
	if vm.State == "running" {
		if a := agentOf(e.cfgPath, vm); a != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if info, err := a.Info(ctx); err == nil {
				runLevel, version = 2, info.Version+" (qemu-ga behind the vmgate emulator)"
			}
			cancel()
		}
	}
	fmt.Fprintf(e.out, "name=\"%s\"\nUUID=\"%s\"\nostype=\"Linux (64-bit)\"\nmemory=256\nVMState=\"%s\"\nVMStateChangeTime=\"2024-01-01T00:00:00.000000000\"\n", vm.Name, vm.UUID, vm.State)
	fmt.Fprintf(e.out, "GuestAdditionsRunLevel=%d\n", runLevel)
	if version != "" {
		fmt.Fprintf(e.out, "GuestAdditionsVersion=\"%s\"\n", version)
	}
	return 0
}

// options is what the common guestcontrol options set.
type options struct {
	username, password, passwordFile string
	verbose                          bool
}

// optValue splits "--opt=value" or takes the next argument.
func optValue(args []string, i int) (name, value string, next int, ok bool) {
	a := args[i]
	if n, v, found := strings.Cut(a, "="); found && strings.HasPrefix(a, "--") {
		return n, v, i + 1, true
	}
	if i+1 >= len(args) {
		return a, "", i + 1, false
	}
	return a, args[i+1], i + 2, true
}

var commonWithValue = map[string]bool{"--username": true, "-u": true, "--password": true, "--passwordfile": true, "--domain": true}

func (e *emu) guestcontrol(args []string) int {
	if len(args) < 2 {
		return e.syntax("Missing VM name or sub-command")
	}
	name, sub, rest := args[0], args[1], args[2:]
	var valued, flags map[string]bool
	switch sub {
	case "run":
		valued = map[string]bool{"--exe": true, "--timeout": true, "--putenv": true, "-E": true, "--arg0": true}
		flags = map[string]bool{"--wait-stdout": true, "--wait-stderr": true, "--no-wait-stdout": true, "--no-wait-stderr": true,
			"--unquoted-args": true, "--ignore-orphaned-processes": true, "--profile": true, "--no-profile": true, "--dos2unix": true, "--unix2dos": true}
	case "copyto", "copyfrom":
		valued = map[string]bool{"--target-directory": true}
		flags = map[string]bool{"--follow": true, "--recursive": true, "-R": true, "--dryrun": true}
	default:
		return e.syntax("Unknown sub-command: '%s'", sub)
	}
	var o options
	vals := map[string][]string{}
	set := map[string]bool{}
	var pos []string
	for i := 0; i < len(rest); {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, rest[i:]...) // options come first
			break
		}
		base, _, _ := strings.Cut(a, "=")
		switch {
		case base == "--verbose" || base == "-v":
			o.verbose = true
			i++
		case base == "--quiet" || base == "-q":
			i++
		case commonWithValue[base] || valued[base]:
			n, v, next, ok := optValue(rest, i)
			if !ok {
				return e.syntax("Option '%s' requires a value", n)
			}
			switch n {
			case "--username", "-u":
				o.username = v
			case "--password":
				o.password = v
			case "--passwordfile":
				o.passwordFile = v
			default:
				vals[n] = append(vals[n], v)
			}
			i = next
		case flags[a]:
			set[a] = true
			i++
		default:
			return e.syntax("Unknown option: %s", a)
		}
	}
	if o.username == "" {
		return e.syntax("No user name specified!")
	}
	if o.passwordFile != "" {
		raw, err := os.ReadFile(o.passwordFile)
		if err != nil {
			e.errorf("Cannot open password file '%s' (VERR_FILE_NOT_FOUND)", o.passwordFile)
			return 1
		}
		o.password = strings.TrimRight(string(raw), "\r\n")
	}
	vm := e.find(name)
	if vm == nil {
		return e.notFound(name, "VBoxManageGuestCtrl.cpp", 484)
	}
	if vm.State != "running" {
		e.errorf("Machine \"%s\" is not running (currently \"%s\")!", vm.Name, stateText(vm.State))
		return 1
	}
	if o.verbose {
		fmt.Fprintf(e.out, "Creating guest session as user '%s'...\n", o.username)
		fmt.Fprintf(e.out, "Waiting for guest session to start...\n")
	}
	if o.username != e.cfg.Username || o.password != e.cfg.Password {
		e.errorf("The guest session could not be started: The user \"%s\" was not able to logon on guest", o.username)
		return 1
	}
	a := agentOf(e.cfgPath, vm)
	if a == nil {
		e.errorf("The guest execution service is not ready (yet)")
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	info, err := a.Info(ctx)
	if err != nil {
		e.errorf("The guest execution service is not ready (yet)")
		e.errorf("Details: code VBOX_E_IPRT_ERROR (0x80bb0005), component GuestSessionWrap, interface IGuestSession, callee nsISupports")
		return 1
	}
	if o.verbose {
		fmt.Fprintf(e.out, "Successfully started guest session (ID 1)\n")
	}
	code := 0
	if !info.Enabled("guest-exec") {
		e.errorf("The guest execution service is not available")
		e.errorf("Details: code VBOX_E_IPRT_ERROR (0x80bb0005), component GuestProcessWrap, interface IGuestProcess, callee nsISupports")
		code = 1
	} else {
		switch sub {
		case "run":
			code = e.runCmd(ctx, a, o, vals, pos)
		case "copyto":
			code = e.copyTo(ctx, a, vals, pos)
		case "copyfrom":
			code = e.copyFrom(ctx, a, vals, pos)
		}
	}
	if o.verbose {
		fmt.Fprintf(e.out, "Closing guest session ...\n")
	}
	return code
}

func stateText(s string) string {
	switch s {
	case "poweroff":
		return "powered off"
	}
	return s
}

func (e *emu) runCmd(ctx context.Context, a agent, o options, vals map[string][]string, pos []string) int {
	exe := ""
	if v := vals["--exe"]; len(v) > 0 {
		exe = v[len(v)-1]
	}
	if exe == "" && len(pos) > 0 {
		exe = pos[0]
	}
	if exe == "" {
		return e.syntax("No executable specified!")
	}
	var timeout time.Duration
	if v := vals["--timeout"]; len(v) > 0 {
		ms, err := strconv.ParseUint(v[len(v)-1], 10, 32)
		if err != nil {
			return e.syntax("Invalid timeout value '%s'", v[len(v)-1])
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	env := append(vals["--putenv"], vals["-E"]...)
	for _, kv := range env {
		if kv == "" || kv[0] == '=' {
			return e.syntax("Invalid argument variable[=value]: '%s'", kv)
		}
	}
	var args []string
	if len(pos) > 1 {
		args = pos[1:]
	}
	if o.verbose {
		if timeout == 0 {
			fmt.Fprintf(e.out, "Starting guest process ...\n")
		} else {
			fmt.Fprintf(e.out, "Starting guest process (within %dms)\n", timeout.Milliseconds())
		}
	}
	pid, err := a.ExecStart(ctx, qga.ExecRequest{Path: exe, Args: args, Env: env})
	if err != nil {
		var qe *qga.Error
		if errors.As(err, &qe) && strings.Contains(qe.Desc, "No such file") {
			e.errorf("No such file or directory \"%s\" on guest", exe)
		} else {
			e.errorf("Error starting guest process: %v", err)
		}
		e.errorf("Details: code VBOX_E_IPRT_ERROR (0x80bb0005), component GuestProcessWrap, interface IGuestProcess, callee nsISupports")
		return 1
	}
	if o.verbose {
		fmt.Fprintf(e.out, "Process '%s' (PID %d) started\n", exe, pid)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	wait := time.Millisecond
	timedOut := false
	for {
		st, err := a.ExecStatus(ctx, pid, qga.AgentOutputLimit)
		if err != nil {
			e.errorf("Waiting for guest process failed: %v", err)
			return 1
		}
		if st.Exited {
			e.out.Write(st.Stdout)
			e.errw.Write(st.Stderr)
			switch {
			case timedOut:
				if o.verbose {
					fmt.Fprintf(e.out, "Process timed out (guest side) and was terminated\n")
				}
				return 20
			case st.Signal != 0:
				if o.verbose {
					fmt.Fprintf(e.out, "Process terminated\nExit code=%d (Status=510 [terminated by signal])\n", st.Signal)
				}
				return 18
			}
			if o.verbose {
				fmt.Fprintf(e.out, "Process terminated\nExit code=%d (Status=500 [successfully terminated])\n", st.ExitCode)
			}
			switch {
			case st.ExitCode == 0:
				return 0
			case st.ExitCode <= 93:
				return st.ExitCode + 32
			}
			return 126
		}
		select {
		case <-deadline:
			// VBoxService terminates the process itself (not its children).
			timedOut = true
			a.Kill(ctx, pid)
			deadline = nil
		case <-sigs:
			a.Kill(ctx, pid)
			if o.verbose {
				fmt.Fprintf(e.out, "Process execution aborted!\n")
			}
			return 22
		case <-time.After(wait):
			wait = min(2*wait, 200*time.Millisecond)
		}
	}
}

func (e *emu) copyTo(ctx context.Context, a agent, vals map[string][]string, pos []string) int {
	var dst string
	srcs := pos
	if v := vals["--target-directory"]; len(v) > 0 {
		dst = strings.TrimSuffix(v[len(v)-1], "/") + "/"
	} else if len(pos) >= 2 {
		srcs, dst = pos[:len(pos)-1], pos[len(pos)-1]
	}
	if len(srcs) == 0 || dst == "" {
		return e.syntax("No source(s) or destination specified!")
	}
	for _, src := range srcs {
		data, err := os.ReadFile(src)
		if err != nil {
			e.errorf("Source \"%s\" does not exist or is not accessible", src)
			return 1
		}
		target := dst
		if len(srcs) > 1 || strings.HasSuffix(dst, "/") {
			target = strings.TrimSuffix(dst, "/") + "/" + filepath.Base(src)
		}
		if err := a.FileWrite(ctx, target, data, 0); err != nil {
			e.errorf("Copying \"%s\" to guest failed: %v", src, err)
			return 1
		}
	}
	return 0
}

func (e *emu) copyFrom(ctx context.Context, a agent, vals map[string][]string, pos []string) int {
	var dir string
	srcs := pos
	if v := vals["--target-directory"]; len(v) > 0 {
		dir = v[len(v)-1]
	} else if len(pos) >= 2 {
		srcs, dir = pos[:len(pos)-1], pos[len(pos)-1]
	}
	if len(srcs) == 0 || dir == "" {
		return e.syntax("No source(s) or destination specified!")
	}
	for _, src := range srcs {
		data, truncated, err := a.FileRead(ctx, src, 1<<30)
		if err != nil {
			var qe *qga.Error
			if errors.As(err, &qe) && strings.Contains(qe.Desc, "No such file") {
				e.errorf("No such file or directory \"%s\" on guest", src)
			} else {
				e.errorf("Copying \"%s\" from guest failed: %v", src, err)
			}
			return 1
		}
		if truncated {
			e.errorf("emulator: \"%s\" is over 1 GiB", src)
			return 1
		}
		if err := os.WriteFile(filepath.Join(dir, path.Base(src)), data, 0o600); err != nil {
			e.errorf("Destination \"%s\" could not be written: %v", dir, err)
			return 1
		}
	}
	return 0
}

func (e *emu) controlvm(args []string) int {
	if len(args) < 2 {
		return e.syntax("Not enough parameters")
	}
	vm := e.find(args[0])
	if vm == nil {
		return e.notFound(args[0], "VBoxManageControlVM.cpp", 118)
	}
	action := args[1]
	switch action {
	case "poweroff", "acpipowerbutton", "reset", "pause", "resume":
	default:
		return e.syntax("Invalid parameter '%s'", action)
	}
	if vm.QGASocket != "" {
		e.errorf("emulator: power actions are emulated only for VMs without a lab VM behind them")
		return 1
	}
	if vm.State != "running" && vm.State != "paused" {
		e.errorf("Machine '%s' is not currently running", vm.Name)
		return 1
	}
	switch action {
	case "poweroff", "acpipowerbutton":
		vm.State = "poweroff"
	case "pause":
		vm.State = "paused"
	case "resume":
		vm.State = "running"
	}
	if action == "poweroff" {
		fmt.Fprintf(e.errw, "0%%...10%%...20%%...30%%...40%%...50%%...60%%...70%%...80%%...90%%...100%%\n")
	}
	if err := e.save(); err != nil {
		e.errorf("emulator: %v", err)
		return 1
	}
	return 0
}

func (e *emu) startvm(args []string) int {
	if len(args) == 0 {
		return e.syntax("Missing VM name")
	}
	name := args[0]
	for i := 1; i < len(args); i++ {
		n, v, next, ok := optValue(args, i)
		if n != "--type" || !ok {
			return e.syntax("Unknown option: %s", args[i])
		}
		switch v {
		case "gui", "headless", "sdl", "separate":
		default:
			return e.syntax("Invalid session type '%s'", v)
		}
		i = next - 1
	}
	vm := e.find(name)
	if vm == nil {
		return e.notFound(name, "VBoxManageMisc.cpp", 862)
	}
	if vm.QGASocket != "" {
		e.errorf("emulator: power actions are emulated only for VMs without a lab VM behind them")
		return 1
	}
	if vm.State == "running" || vm.State == "paused" {
		e.errorf("The machine '%s' is already locked for a session (or being unlocked)", vm.Name)
		return 1
	}
	fmt.Fprintf(e.out, "Waiting for VM \"%s\" to power on...\nVM \"%s\" has been successfully started.\n", vm.Name, vm.Name)
	vm.State = "running"
	if err := e.save(); err != nil {
		e.errorf("emulator: %v", err)
		return 1
	}
	return 0
}
