package vboxemu

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// emu is one VBoxManage invocation.
type emu struct {
	v    *Version
	h    host
	w    *World // the world as read at the start
	args []string
	env  map[string]string

	stdout *bufferedStdout // RTPrintf: glibc's buffered stdout
	rawOut io.Writer       // fd 1 written directly (guest output)
	stderr io.Writer       // unbuffered

	logoShown bool
	// legacySyntax: 6.1's guestcontrol reports syntax errors the legacy
	// way (errorSyntaxEx: "Syntax error: ...").
	legacySyntax bool
	// canceled is set by SIGINT/SIGTERM (gctlSignalHandler).
	canceled chan struct{}
}

// Main runs one emulated VBoxManage invocation: args without the program
// name, the process's stdout and stderr, the executable's path (vbox.json
// and vbox.log are next to it) and the environment. It returns the exit
// code.
func Main(args []string, stdout, stderr io.Writer, exe string, environ []string) int {
	dir := filepath.Dir(exe)
	outTee, errTee := &tee{w: stdout}, &tee{w: stderr}
	e := &emu{h: host{path: filepath.Join(dir, WorldFile)}, args: args, env: envMap(environ),
		rawOut: outTee, stderr: errTee, canceled: make(chan struct{})}
	code := e.main()
	if e.stdout != nil {
		e.stdout.Flush() // exit() flushes stdio
	}
	appendLog(filepath.Join(dir, LogFile), args, code, outTee.String(), errTee.String())
	return code
}

func envMap(environ []string) map[string]string {
	m := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func appendLog(p string, argv []string, code int, stdout, stderr string) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	line, _ := json.Marshal(LogEntry{Argv: argv, Code: code, Stdout: stdout, Stderr: stderr})
	f.Write(append(line, '\n'))
}

// LogEntry is one line of vbox.log.
type LogEntry struct {
	Argv   []string `json:"argv"`
	Code   int      `json:"code"`
	Stdout string   `json:"stdout"`
	Stderr string   `json:"stderr"`
}

func (e *emu) main() int {
	w, err := e.h.read()
	if err == nil {
		e.v, err = LookupVersion(w.Version)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "VBoxManage: error: emulator: %v\n", err)
		return exitFailure
	}
	e.w = w
	e.stdout = newBufferedStdout(e.rawOut, w.StdoutBuffer)
	e.wrapperWarnings()
	return e.dispatch(e.args)
}

// wrapperWarnings is what /usr/bin/VBoxManage, the Linux wrapper script,
// prints on stdout (cat << EOF) before it execs the real VBoxManage
// (src/VBox/Installer/linux/VBox.sh).
func (e *emu) wrapperWarnings() {
	if e.w.VBoxDrvMissing {
		io.WriteString(e.rawOut, `WARNING: The vboxdrv kernel module is not loaded. Either there is no module
         available for the current kernel (`+kernelRelease()+`) or it failed to
         load. Please recompile the kernel module and install it by

           sudo /sbin/vboxconfig

         You will not be able to start VMs until this problem is fixed.
`)
	}
	eff := e.w.EffectiveUser
	if eff == "" {
		if u, err := user.Current(); err == nil {
			eff = u.Username
		}
	}
	// [ -n "$LOGNAME" ] && [ "$LOGNAME" = "$VBOX_EFFECTIVE_USER" ] || vbox_override_env="1" (and USER)
	if e.env["LOGNAME"] == "" || e.env["LOGNAME"] != eff || e.env["USER"] == "" || e.env["USER"] != eff {
		io.WriteString(e.rawOut, "WARNING: Environment variable LOGNAME or USER does not correspond to effective user id.\n")
	}
}

func kernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return ""
	}
	var b []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// command is one entry of VBoxManage.cpp's g_aCommands that the emulator
// implements; noCOM is VBMG_CMD_F_NO_COM.
type command struct {
	name    string
	handler func(e *emu, args []string) int
	noCOM   bool
}

var commands = []command{
	{name: "list", handler: (*emu).handleList},
	{name: "showvminfo", handler: (*emu).handleShowVMInfo},
	{name: "unregistervm", handler: (*emu).handleUnregisterVM},
	{name: "clonevm", handler: (*emu).handleCloneVM},
	{name: "startvm", handler: (*emu).handleStartVM},
	{name: "modifyvm", handler: (*emu).handleModifyVM},
	{name: "getextradata", handler: (*emu).handleGetExtraData},
	{name: "setextradata", handler: (*emu).handleSetExtraData},
	{name: "controlvm", handler: (*emu).handleControlVM},
	{name: "snapshot", handler: (*emu).handleSnapshot},
	{name: "guestproperty", handler: (*emu).handleGuestProperty},
	{name: "guestcontrol", handler: (*emu).handleGuestControl},
}

// dispatch is VBoxManage.cpp main after RTR3InitExe: the global options,
// the command lookup, COM and the handler.
func (e *emu) dispatch(args []string) int {
	i := 0
	for ; i < len(args); i++ {
		switch args[i] {
		case "help", "--help", "-?", "-h", "-help":
			// The logo and the usage (left out: generated from the manual).
			e.showLogo(e.stdout)
			return exitSuccess
		case "-V", "--version", "-v", "-version", "-Version":
			e.printf("%s", e.v.VersionLine())
			return exitSuccess
		case "--dump-build-type":
			e.printf("release\n")
			return exitSuccess
		case "--nologo", "-q", "-nologo", "--detailed-progress", "-d":
			continue
		}
		break
	}
	if i >= len(args) {
		e.showLogo(e.stdout)
		return exitSuccess
	}
	name, rest := args[i], args[i+1:]
	var cmd *command
	for j := range commands {
		if commands[j].name == name {
			cmd = &commands[j]
		}
	}
	if cmd == nil {
		if name == "commands" {
			e.printf("commands:\n")
			names := make([]string, 0, len(commands))
			for _, c := range commands {
				names = append(names, c.name)
			}
			sort.Strings(names)
			for _, n := range names {
				e.printf("    %s\n", n)
			}
			return exitSuccess
		}
		return e.syntaxError("Invalid command '%s'", name)
	}
	if len(rest) == 0 {
		// printUsage of the command (left out: generated from the manual),
		// and failure.
		return exitFailure
	}
	if !cmd.noCOM && e.w.COMServerDown {
		return e.comServerDown()
	}
	return cmd.handler(e, rest)
}

// comServerDown is VBoxManage.cpp main when IVirtualBoxClient cannot hand
// out IVirtualBox and there is no extended error info: "Failed to create
// the VirtualBox object!", GluePrintRCMessage, and the hint. The status is
// the one XPCOM's IPC client returns when VBoxSVC cannot be reached.
func (e *emu) comServerDown() int {
	e.errorf("Failed to create the VirtualBox object!")
	e.errorf("Code NS_ERROR_ABORT (0x80004004) - Operation aborted (extended info not available)")
	e.errorf("Most likely, the VirtualBox COM server is not running or failed to start.")
	return exitFailure
}

// notFound is CHECK_ERROR's report of a failed IVirtualBox::FindMachine.
func (e *emu) notFound(name string, site contextSite) int {
	e.comError(notFoundText(name), codeObjectNotFound, "VirtualBoxWrap", "IVirtualBox", site)
	return exitFailure
}

// machineState is machineStateToName(state, fShort=false)
// (VBoxManageInfo.cpp), for the states the emulator uses.
func machineStateLong(short string) string {
	switch short {
	case "poweroff":
		return "powered off"
	}
	return short
}
