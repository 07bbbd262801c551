package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// errConnRefused: nothing listens on a socket that exists.
var errConnRefused = syscall.ECONNREFUSED

// labRecord is the part of a lab VM's vm.json the driver needs (the lab
// package owns the format).
type labRecord struct {
	Name string   `json:"name"`
	PID  int      `json:"pid"`
	Argv []string `json:"argv"`
}

func readLabRecord(dir string) (labRecord, error) {
	b, err := os.ReadFile(filepath.Join(dir, "vm.json"))
	if err != nil {
		return labRecord{}, err
	}
	var r labRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return labRecord{}, fmt.Errorf("%s: %w", filepath.Join(dir, "vm.json"), err)
	}
	return r, nil
}

// readArgv returns the stored QEMU argv of the lab VM in dir, refusing
// anything that is not a QEMU command line for that VM's QMP socket.
func readArgv(dir, qmpPath string) ([]string, error) {
	r, err := readLabRecord(dir)
	if err != nil {
		return nil, err
	}
	if len(r.Argv) == 0 {
		return nil, fmt.Errorf("vm.json has no argv")
	}
	if !strings.HasPrefix(filepath.Base(r.Argv[0]), "qemu-system-") {
		return nil, fmt.Errorf("vm.json argv[0] %q is not a qemu-system binary", r.Argv[0])
	}
	ownSocket := false
	for _, a := range r.Argv {
		if strings.Contains(a, qmpPath) {
			ownSocket = true
		}
	}
	if !ownSocket {
		return nil, fmt.Errorf("vm.json argv does not use this VM's QMP socket %s", qmpPath)
	}
	return r.Argv, nil
}

// readPID returns the lab VM's QEMU pid from qemu.pid (else vm.json), 0 if unknown.
func readPID(dir string) int {
	if b, err := os.ReadFile(filepath.Join(dir, "qemu.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			return pid
		}
	}
	if r, err := readLabRecord(dir); err == nil && r.PID > 1 {
		return r.PID
	}
	return 0
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// Format: pid (comm) S ...; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}

// startDaemonized runs argv (which has -daemonize) and waits for the
// launcher: QEMU forks the VM process, which outlives us, and the parent
// exits once the VM is set up. The VM's owner is then the lab (qemu.pid).
func startDaemonized(ctx context.Context, argv []string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 500 {
			msg = msg[:500]
		}
		if ctx.Err() != nil {
			err = errors.Join(err, ctx.Err())
		}
		return fmt.Errorf("start %s: %w: %s", filepath.Base(argv[0]), err, msg)
	}
	return nil
}
