// Command escape is the lab sandbox test's probe: each subcommand tries one
// thing a confined process must not be able to do, prints what happened,
// and exits 0 only when the attempt succeeded.
//
//	escape ptrace PID    attach to PID with ptrace and leave it stopped
//	escape signal PID    send SIGTERM to PID
//	escape privs         report the uids, write /root/suid-escaped (a setuid copy tests no_new_privs)
//	escape connect ADDR  open a TCP connection to ADDR and send "escaped"
//	escape listen ADDR   accept one TCP connection on ADDR and print what it sends
//	escape race          in the working directory, poll lstat("a") until its owner is
//	                     this process's uid, then put symlinks d -> /etc and e -> /root
//	                     in place of d and e, and write "raced" (the restore race)
//	escape fs OP ARGS    one file system call: truncate PATH SIZE, setxattr PATH NAME VALUE,
//	                     chmod PATH OCTAL, chown PATH UID GID, link OLD NEW, rename OLD NEW,
//	                     utime PATH
//	escape listxattr PATH  print PATH's extended attribute names, one a line
//	escape open PATH     open PATH for reading and writing (a device node)
//	escape dial-unix PATH  connect to the unix socket PATH
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
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
	case "open":
		if len(os.Args) < 3 {
			fail("open: no path")
		}
		f, err := os.OpenFile(os.Args[2], os.O_RDWR|syscall.O_NONBLOCK, 0)
		if err != nil {
			fail("open %s: %v", os.Args[2], err)
		}
		f.Close()
		fmt.Printf("open %s: opened\n", os.Args[2])
	case "dial-unix":
		if len(os.Args) < 3 {
			fail("dial-unix: no path")
		}
		c, err := net.DialTimeout("unix", os.Args[2], 3*time.Second)
		if err != nil {
			fail("dial-unix %s: %v", os.Args[2], err)
		}
		c.Close()
		fmt.Printf("dial-unix %s: connected\n", os.Args[2])
	case "race":
		race()
	case "fs":
		if len(os.Args) < 4 {
			fail("fs: want OP PATH ...")
		}
		if err := fsOp(os.Args[2], os.Args[3:]); err != nil {
			fail("fs %s: %v", os.Args[2], err)
		}
		fmt.Printf("fs %s: done\n", os.Args[2])
	case "listxattr":
		if len(os.Args) < 3 {
			fail("listxattr: no path")
		}
		buf := make([]byte, 64<<10)
		n, err := syscall.Listxattr(os.Args[2], buf)
		if err != nil {
			fail("listxattr %s: %v", os.Args[2], err)
		}
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				fmt.Println(name)
			}
		}
	default:
		fail("unknown subcommand %q", os.Args[1])
	}
}

// race waits for the restore to give "a" this uid, then swaps d and e
// for symlinks to /etc and /root, as fast as it can.
func race() {
	uid := uint32(os.Getuid())
	deadline := time.Now().Add(5 * time.Minute)
	var st syscall.Stat_t
	for syscall.Lstat("a", &st) != nil || st.Uid != uid {
		if time.Now().After(deadline) {
			fail("race: a never became uid %d's", uid)
		}
	}
	for _, s := range [][2]string{{"d", "/etc"}, {"e", "/root"}} {
		if err := os.Rename(s[0], s[0]+".old"); err != nil {
			fail("race: %v", err)
		}
		if err := os.Symlink(s[1], s[0]); err != nil {
			fail("race: %v", err)
		}
	}
	if err := os.WriteFile("raced", []byte("swapped\n"), 0o644); err != nil {
		fail("race: %v", err)
	}
	fmt.Println("race: swapped")
}

// fsOp makes one file system call.
func fsOp(op string, args []string) error {
	num := func(i, base int) int {
		if len(args) <= i {
			fail("fs %s: missing argument %d", op, i+1)
		}
		n, err := strconv.ParseInt(args[i], base, 64)
		if err != nil {
			fail("fs %s: %v", op, err)
		}
		return int(n)
	}
	arg := func(i int) string {
		if len(args) <= i {
			fail("fs %s: missing argument %d", op, i+1)
		}
		return args[i]
	}
	switch op {
	case "truncate":
		return syscall.Truncate(arg(0), int64(num(1, 10)))
	case "setxattr":
		return syscall.Setxattr(arg(0), arg(1), []byte(arg(2)), 0)
	case "chmod":
		return syscall.Chmod(arg(0), uint32(num(1, 8)))
	case "chown":
		return syscall.Chown(arg(0), num(1, 10), num(2, 10))
	case "link":
		return syscall.Link(arg(0), arg(1))
	case "rename":
		return syscall.Rename(arg(0), arg(1))
	case "utime":
		t := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
		return os.Chtimes(arg(0), t, t)
	}
	return fmt.Errorf("unknown op %q", op)
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
