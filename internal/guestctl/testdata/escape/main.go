// Command escape is the lab sandbox test's probe: each subcommand tries one
// thing a confined process must not be able to do, prints what happened,
// and exits 0 only when the attempt succeeded.
//
//	escape ptrace PID    attach to PID with ptrace and leave it stopped
//	escape signal PID    send SIGTERM to PID
//	escape privs         report the uids, write /root/suid-escaped (a setuid copy tests no_new_privs)
//	escape connect ADDR  open a TCP connection to ADDR and send "escaped"
//	escape listen ADDR   accept one TCP connection on ADDR and print what it sends
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: escape ptrace|signal PID | privs | connect|listen ADDR")
	}
	switch os.Args[1] {
	case "ptrace":
		pid := pidArg()
		runtime.LockOSThread() // ptrace requests come from the attaching thread
		if err := syscall.PtraceAttach(pid); err != nil {
			fail("ptrace %d: %v", pid, err)
		}
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WALL, nil)
		// Exit without detaching: the tracee stays stopped, which shows from outside.
		fmt.Printf("ptrace %d: attached\n", pid)
	case "signal":
		pid := pidArg()
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			fail("signal %d: %v", pid, err)
		}
		fmt.Printf("signal %d: sent\n", pid)
	case "privs":
		r, e := syscall.Getuid(), syscall.Geteuid()
		fmt.Printf("uid %d euid %d\n", r, e)
		if err := os.WriteFile("/root/suid-escaped", []byte("x"), 0o644); err != nil {
			fail("write /root/suid-escaped: %v", err)
		}
		fmt.Println("wrote /root/suid-escaped")
	case "connect":
		if len(os.Args) < 3 {
			fail("connect: no address")
		}
		c, err := net.DialTimeout("tcp", os.Args[2], 3*time.Second)
		if err != nil {
			fail("connect %s: %v", os.Args[2], err)
		}
		fmt.Fprintln(c, "escaped")
		c.Close()
		fmt.Printf("connect %s: connected\n", os.Args[2])
	case "listen":
		if len(os.Args) < 3 {
			fail("listen: no address")
		}
		ln, err := net.Listen("tcp", os.Args[2])
		if err != nil {
			fail("listen %s: %v", os.Args[2], err)
		}
		c, err := ln.Accept()
		if err != nil {
			fail("accept: %v", err)
		}
		b, _ := io.ReadAll(c)
		os.Stdout.Write(b)
	default:
		fail("unknown subcommand %q", os.Args[1])
	}
}

func pidArg() int {
	if len(os.Args) < 3 {
		fail("no pid")
	}
	pid, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fail("pid: %v", err)
	}
	return pid
}

func fail(format string, args ...any) {
	fmt.Printf(format+"\n", args...)
	os.Exit(1)
}
