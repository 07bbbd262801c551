package vboxemu

import (
	"bytes"
	"encoding/xml"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/qmp"
	"github.com/vmgate/vmgate/internal/testload"
)

func TestMain(m *testing.M) {
	os.Exit(labtest.Main(m, lab.Spec{Name: "emu"}))
}

// host is an emulated host in a temp dir, run in process.
type testHost struct {
	t   *testing.T
	dir string
	env []string
}

func newTestHost(t *testing.T, w *World) *testHost {
	t.Helper()
	dir := t.TempDir()
	if w.Users == nil {
		w.Users = map[string]string{"vagrant": "pw"}
	}
	if err := WriteWorld(filepath.Join(dir, WorldFile), w); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte("pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/bin:/bin"}
	if u, err := user.Current(); err == nil {
		env = append(env, "USER="+u.Username, "LOGNAME="+u.Username)
	}
	return &testHost{t: t, dir: dir, env: env}
}

// run runs one invocation in process.
func (h *testHost) run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb, filepath.Join(h.dir, "VBoxManage"), h.env)
	return code, out.String(), errb.String()
}

func (h *testHost) world() *World {
	w, err := ReadWorld(filepath.Join(h.dir, WorldFile))
	if err != nil {
		h.t.Fatal(err)
	}
	return w
}

func offMachine(name, uuid string) *Machine {
	return &Machine{Name: name, UUID: uuid, State: "poweroff", StateChange: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)}
}

const uuid1 = "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f0001"

func TestVersionLineAndLogo(t *testing.T) {
	for _, tc := range []struct {
		version, line, logo string
	}{
		{"6.1", "6.1.38r153438\n", "Oracle VM VirtualBox Command Line Management Interface Version 6.1.38\n(C) 2005-2022 Oracle Corporation\nAll rights reserved.\n\n"},
		{"7.0", "7.0.18r162988\n", "Oracle VM VirtualBox Command Line Management Interface Version 7.0.18\nCopyright (C) 2005-2024 Oracle and/or its affiliates\n\n"},
		{"7.1", "7.1.6r167084\n", "Oracle VirtualBox Command Line Management Interface Version 7.1.6\nCopyright (C) 2005-2025 Oracle and/or its affiliates\n\n"},
	} {
		h := newTestHost(t, &World{Version: tc.version})
		if code, out, _ := h.run("--version"); code != 0 || out != tc.line {
			t.Errorf("%s: --version = %d, %q; want 0, %q", tc.version, code, out, tc.line)
		}
		if code, _, errs := h.run("bogus"); code != 2 || !strings.HasPrefix(errs, tc.logo) || !strings.Contains(errs, "VBoxManage: error: Invalid command 'bogus'") {
			t.Errorf("%s: bogus = %d, %q; want 2, the logo and the error", tc.version, code, errs)
		}
	}
}

func TestBufferedStdout(t *testing.T) {
	var pipe bytes.Buffer
	b := newBufferedStdout(&pipe, 8)
	b.Write([]byte("abc"))
	b.Write([]byte("defgh")) // exactly fills: stays buffered
	if pipe.Len() != 0 {
		t.Fatalf("after 8 bytes the pipe has %q; want nothing (glibc flushes when the next write does not fit)", pipe.String())
	}
	b.Write([]byte("i"))
	if pipe.String() != "abcdefgh" {
		t.Fatalf("pipe = %q; want the first block", pipe.String())
	}
	b.Write([]byte("jklmnopqrstuvwxyz0123")) // fills, flushes, writes whole blocks, keeps the rest
	if pipe.String() != "abcdefghijklmnopqrstuvwx" {
		t.Fatalf("pipe = %q; want block-aligned output", pipe.String())
	}
	b.Flush()
	if pipe.String() != "abcdefghijklmnopqrstuvwxyz0123" {
		t.Fatalf("pipe after exit = %q; want everything", pipe.String())
	}
}

func TestGetopt(t *testing.T) {
	defs := []optDef{{long: "--timeout", short: 't', id: "t", kind: reqUint32}, {long: "--exe", short: 'e', id: "e", kind: reqString}, {long: "--verbose", short: 'v', id: "v"}}
	for _, tc := range []struct {
		args      []string
		optsFirst bool
		want      string
	}{
		{[]string{"--timeout=5", "--exe:x", "-v", "pos", "--", "-a", "b"}, true, "t=5 e=x v pos -a b"},
		{[]string{"pos", "--verbose", "-t", "7", "pos2", "--", "--exe"}, true, "v t=7 pos pos2 --exe"},
		{[]string{"-t7", "-ey"}, true, "t=7 e=y"},
		{[]string{"a", "--exe", "y", "b"}, false, "a e=y b"},
		{[]string{"--bogus"}, true, "!VERR_GETOPT_UNKNOWN_OPTION --bogus"},
		{[]string{"--timeout"}, true, "!VERR_GETOPT_REQUIRED_ARGUMENT_MISSING"},
		{[]string{"--timeout", "soon"}, true, "!VERR_GETOPT_INVALID_ARGUMENT_FORMAT soon"},
		{[]string{"-c"}, true, "!VERR_GETOPT_UNKNOWN_OPTION -c"},
	} {
		g := newGetopt(tc.args, defs, tc.optsFirst)
		var got []string
		for {
			r, oe, ok := g.next()
			if !ok {
				break
			}
			if oe != nil {
				got = append(got, strings.TrimSpace("!"+oe.rc+" "+oe.psz))
				break
			}
			switch {
			case r.def == nil:
				got = append(got, r.value)
			case r.def.kind == reqNothing:
				got = append(got, r.def.id)
			default:
				got = append(got, r.def.id+"="+r.value)
			}
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("getopt(%q, optsFirst %v) = %q; want %q", tc.args, tc.optsFirst, strings.Join(got, " "), tc.want)
		}
	}
}

// TestRunArgv: how run turns its arguments into the image and argv, per
// release (gctlHandleRunCommon), and which options exist.
func TestRunArgv(t *testing.T) {
	for _, tc := range []struct {
		version string
		args    []string
		image   string
		argv    string
		code    int // -1: parsed
	}{
		{"7.1", []string{"--exe", "/bin/sh", "--", "sh", "-c", "x"}, "/bin/sh", "/bin/sh|sh|-c|x", -1},
		{"7.0", []string{"--exe", "/bin/sh", "--", "sh", "-c", "x"}, "/bin/sh", "/bin/sh|sh|-c|x", -1},
		{"6.1", []string{"--exe", "/bin/sh", "--", "sh", "-c", "x"}, "/bin/sh", "sh|-c|x", -1},
		{"7.1", []string{"--", "/bin/sh", "-c", "x"}, "/bin/sh", "/bin/sh|-c|x", -1},
		{"6.1", []string{"--", "/bin/sh", "-c", "x"}, "/bin/sh", "/bin/sh|-c|x", -1},
		{"7.1", []string{"--exe", "/usr/bin/busybox", "--arg0", "ls", "--", "-l", "/usr"}, "/usr/bin/busybox", "ls|-l|/usr", -1},
		// The manuals' example (6.1 user_VBoxManage.xml, 7.1
		// man_VBoxManage-guestcontrol.xml): `run --exe "/bin/ls" --username
		// user1 --passwordfile pw.txt --wait-stdout -- -l /usr`. 7.x runs
		// ls -l /usr; 6.1's code makes "-l" argv[0].
		{"7.1", []string{"--exe", "/bin/ls", "--username", "user1", "--passwordfile", "pw.txt", "--wait-stdout", "--", "-l", "/usr"}, "/bin/ls", "/bin/ls|-l|/usr", -1},
		{"6.1", []string{"--exe", "/bin/ls", "--username", "user1", "--passwordfile", "pw.txt", "--wait-stdout", "--", "-l", "/usr"}, "/bin/ls", "-l|/usr", -1},
		{"6.1", []string{"--arg0", "ls", "--", "/bin/ls"}, "", "", 2},
		{"7.1", []string{"--cwd", "/tmp", "--", "/bin/pwd"}, "/bin/pwd", "/bin/pwd", -1},
		{"7.0", []string{"--cwd", "/tmp", "--", "/bin/pwd"}, "", "", 2},
		{"6.1", []string{"--ignore-operhaned-processes", "--", "/bin/true"}, "/bin/true", "/bin/true", -1},
		{"7.1", []string{"--ignore-operhaned-processes", "--", "/bin/true"}, "", "", 2},
		{"7.1", []string{"--putenv", "=x", "--", "/bin/true"}, "", "", 2},
		{"7.1", []string{"--timeout", "10"}, "", "", 2},
	} {
		h := newTestHost(t, &World{Version: tc.version})
		e := &emu{h: host{path: filepath.Join(h.dir, WorldFile)}, rawOut: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
		e.v, _ = LookupVersion(tc.version)
		e.w = h.world()
		e.stdout = newBufferedStdout(e.rawOut, 0)
		c := &gctlCtx{e: e}
		args := slices.Clone(tc.args)
		if i := slices.Index(args, "pw.txt"); i >= 0 {
			args[i] = filepath.Join(h.dir, "pw")
		}
		o, code := c.parseRun(args)
		if code != tc.code || code < 0 && (o.image != tc.image || strings.Join(o.args, "|") != tc.argv) {
			t.Errorf("%s run %q: image %q, argv %q, code %d; want %q, %q, %d", tc.version, tc.args, o.image, strings.Join(o.args, "|"), code, tc.image, tc.argv, tc.code)
		}
	}
}

func TestBuildDestinationPath(t *testing.T) {
	for _, tc := range []struct {
		src, dst, want string
		ok             bool
	}{
		{"/guest/file", "/host/dir/", "/host/dir/file", true},
		{"/guest/file", "/host/dir", "/host/dir", true},
		{"/guest/dir/", "/host/dir/", "/host/dir/", true},
		{"/guest/..", "/host/dir/", "/host/dir/..", false},
		{"/guest/file", "/host/../x", "/host/../x", false},
	} {
		got, ok := buildDestinationPath(tc.src, tc.dst)
		if got != tc.want || ok != tc.ok {
			t.Errorf("buildDestinationPath(%q, %q) = %q, %v; want %q, %v", tc.src, tc.dst, got, ok, tc.want, tc.ok)
		}
	}
}

// TestMachineCommands drives the commands that need no guest.
func TestMachineCommands(t *testing.T) {
	h := newTestHost(t, &World{Version: "7.1", VMs: []*Machine{offMachine("vm1", uuid1)}})
	steps := []struct {
		args []string
		code int
		out  string // a regexp the stdout must match
		err  string // a substring of stderr
	}{
		{[]string{"list", "vms"}, 0, `^"vm1" \{` + uuid1 + `\}\n$`, ""},
		{[]string{"list", "runningvms"}, 0, `^$`, ""},
		{[]string{"showvminfo", "vm1", "--machinereadable"}, 0, `(?m)^VMState="poweroff"$`, ""},
		{[]string{"showvminfo", "nope", "--machinereadable"}, 1, `^$`, "Could not find a registered machine named 'nope'"},
		{[]string{"snapshot", "vm1", "list"}, 1, `^This machine does not have any snapshots\n$`, ""},
		{[]string{"snapshot", "vm1", "take", "base", "--description", "first"}, 0, `^Snapshot taken\. UUID: [0-9a-f-]{36}\n$`, "100%"},
		{[]string{"snapshot", "vm1", "take", "second"}, 0, `^Snapshot taken`, ""},
		{[]string{"snapshot", "vm1", "list", "--machinereadable"}, 0, `(?s)^SnapshotName="base"\n.*SnapshotDescription="first"\nSnapshotName-1="second"\n.*CurrentSnapshotName="second"\n.*CurrentSnapshotNode="SnapshotName-1"\n$`, ""},
		{[]string{"snapshot", "vm1", "restore", "nope"}, 1, `^$`, "Could not find a snapshot named 'nope'"},
		{[]string{"snapshot", "vm1", "restore", "base"}, 0, `^Restoring snapshot 'base' \(`, ""},
		{[]string{"showvminfo", "vm1", "--machinereadable"}, 0, `(?m)^CurrentSnapshotName="base"$`, ""},
		{[]string{"clonevm", "vm1", "--name", "c1", "--register", "--options", "link"}, 1, `^$`, "Linked clone can only be created from a snapshot"},
		{[]string{"clonevm", "vm1", "--name", "c1", "--register", "--snapshot", "second", "--options", "link"}, 0, `^Machine has been successfully cloned as "c1"\n$`, ""},
		{[]string{"clonevm", "vm1", "--name", "c1", "--register"}, 1, `^$`, "already exists"},
		{[]string{"list", "vms"}, 0, `^"vm1" \{.*\}\n"c1" \{.*\}\n$`, ""},
		{[]string{"startvm", "c1", "--type", "headless"}, 0, `^Waiting for VM "c1" to power on\.\.\.\nVM "c1" has been successfully started\.\n$`, ""},
		{[]string{"unregistervm", "c1", "--delete"}, 1, `^$`, "Cannot unregister the machine 'c1' while it is locked"},
		{[]string{"controlvm", "c1", "poweroff"}, 0, `^$`, "0%...10%"},
		{[]string{"unregistervm", "c1", "--delete"}, 0, `^$`, "100%"},
		{[]string{"snapshot", "vm1", "delete", "base"}, 1, `^Deleting snapshot 'base'`, "current snapshot and has one child snapshot"},
		{[]string{"snapshot", "vm1", "delete", "second"}, 0, `^Deleting snapshot 'second'`, ""},
		{[]string{"guestproperty", "get", "vm1", "/VirtualBox/GuestInfo/Net/Count"}, 0, `^No value set!\n$`, ""},
		{[]string{"guestproperty", "enumerate", "vm1"}, 0, `^No properties found\.\n$`, ""},
		{[]string{"guestcontrol", "vm1", "run", "--username", "vagrant", "--", "/bin/true"}, 1, `^$`, `Machine "vm1" is not running (currently powered off)!`},
		{[]string{"controlvm", "vm1", "poweroff"}, 1, `^$`, "Machine 'vm1' is not currently running."},
	}
	for _, s := range steps {
		code, out, errs := h.run(s.args...)
		if code != s.code || !regexp.MustCompile(s.out).MatchString(out) || !strings.Contains(errs, s.err) {
			t.Fatalf("VBoxManage %q = %d\nstdout %q\nstderr %q\nwant %d, stdout ~ %q, stderr containing %q", s.args, code, out, errs, s.code, s.out, s.err)
		}
	}
}

// TestVMProcessTeardown: after `controlvm poweroff` returns, the VM
// process holds the machine's session until it has ended
// (World.VMProcessTeardownMS): unregistervm, modifyvm and startvm are
// refused with VirtualBox's own words meanwhile, snapshot restore (a
// shared lock) is not; once the VM process has ended they run.
func TestVMProcessTeardown(t *testing.T) {
	for _, v := range []string{"6.1", "7.0", "7.1"} {
		t.Run(v, func(t *testing.T) {
			h := newTestHost(t, &World{Version: v, VMs: []*Machine{offMachine("vm1", uuid1)}, VMProcessTeardownMS: int(time.Hour / time.Millisecond)})
			steps := []struct {
				args []string
				code int
				err  string // a substring of stderr
			}{
				{[]string{"snapshot", "vm1", "take", "base"}, 0, ""},
				{[]string{"startvm", "vm1", "--type", "headless"}, 0, ""},
				{[]string{"controlvm", "vm1", "poweroff"}, 0, "100%"},
				{[]string{"unregistervm", "vm1", "--delete"}, 1, "Cannot unregister the machine 'vm1' while it is locked"},
				{[]string{"modifyvm", "vm1", "--memory", "512"}, 1, "The machine 'vm1' is already locked for a session (or being unlocked)"},
				{[]string{"startvm", "vm1", "--type", "headless"}, 1, "The machine 'vm1' is already locked by a session (or being locked or unlocked)"},
				{[]string{"snapshot", "vm1", "restore", "base"}, 0, ""},
			}
			for _, s := range steps {
				if code, out, errs := h.run(s.args...); code != s.code || !strings.Contains(errs, s.err) {
					t.Fatalf("VBoxManage %q = %d\nstdout %q\nstderr %q\nwant %d, stderr containing %q", s.args, code, out, errs, s.code, s.err)
				}
			}
			if w := h.world(); w.VMs[0].State != "poweroff" || w.VMs[0].MemoryMB == 512 {
				t.Fatalf("after the refusals vm1 = %+v; want powered off and unchanged", w.VMs[0])
			}
			// The VM process ends.
			if err := UpdateWorld(filepath.Join(h.dir, WorldFile), func(w *World) error {
				w.VMs[0].SessionLockedUntil = time.Time{}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"modifyvm", "vm1", "--memory", "512"}, {"startvm", "vm1", "--type", "headless"}} {
				if code, out, errs := h.run(args...); code != 0 {
					t.Fatalf("VBoxManage %q once the VM process ended = %d, %q, %q; want 0", args, code, out, errs)
				}
			}
			if w := h.world(); w.VMs[0].State != "running" || w.VMs[0].MemoryMB != 512 {
				t.Errorf("vm1 = %+v; want running with 512 MB", w.VMs[0])
			}
		})
	}
}

// TestHostFailures: VBoxSVC down and the wrapper's warnings.
func TestHostFailures(t *testing.T) {
	h := newTestHost(t, &World{Version: "7.0", VMs: []*Machine{offMachine("vm1", uuid1)}, COMServerDown: true, VBoxDrvMissing: true})
	code, out, errs := h.run("list", "vms")
	if code != 1 || !strings.HasPrefix(out, "WARNING: The vboxdrv kernel module is not loaded.") ||
		!strings.Contains(errs, "Most likely, the VirtualBox COM server is not running or failed to start.") {
		t.Errorf("list vms with VBoxSVC down = %d, %q, %q; want 1, the wrapper's warning, the COM server error", code, out, errs)
	}
	h.env = []string{"PATH=/usr/bin:/bin"}
	if _, out, _ := h.run("--version"); !strings.Contains(out, "WARNING: Environment variable LOGNAME or USER does not correspond to effective user id.\n") {
		t.Errorf("--version without USER and LOGNAME: stdout %q; want the wrapper's warning", out)
	}
}

// TestGuestCommands runs guest control against a lab VM: the 7.1 --exe
// pitfall, verbose output, a session listing during a run, guest
// properties and file copies.
func TestGuestCommands(t *testing.T) {
	vm := labtest.VM(t, "emu")
	m := &Machine{Name: "g", UUID: uuid1, State: "running", StateChange: time.Now(), QGASocket: vm.QGASocket, QMPSocket: vm.QMPSocket}
	h := newTestHost(t, &World{Version: "7.1", VMs: []*Machine{m}})
	pw := filepath.Join(h.dir, "pw")
	code, _, errs := h.run("guestcontrol", "g", "run", "--username", "vagrant", "--passwordfile", pw, "--exe", "/bin/sh", "--", "sh", "-c", "echo hi")
	if code != 2+32 || !strings.Contains(errs, "can't open 'sh'") {
		t.Errorf("7.1 run --exe /bin/sh -- sh -c: exit %d, stderr %q; want exit 34 (sh's 2) and sh opening the script 'sh'", code, errs)
	}
	code, out, _ := h.run("guestcontrol", "g", "run", "--username", "vagrant", "--passwordfile", pw, "--verbose", "--", "/bin/sh", "-c", "exit 255")
	if code != 126 || !strings.Contains(out, "Exit code=255 (Status=500 [successfully terminated])\nClosing guest session ...\n") || !strings.HasPrefix(out, "Executing:\n  Image : /bin/sh\n") {
		t.Errorf("run --verbose exit 255: exit %d, stdout %q; want 126 and the verbose trailer", code, out)
	}
	checkPropsAndCopies(t, h, pw)
}

func checkPropsAndCopies(t *testing.T, h *testHost, pw string) {
	code, out, _ := h.run("guestproperty", "enumerate", "g", "--old-format", "/VirtualBox/GuestInfo/Net/*")
	if code != 0 || !regexp.MustCompile(`(?m)^Name: /VirtualBox/GuestInfo/Net/Count, value: [0-9]+, timestamp: [0-9]+, flags: $`).MatchString(out) {
		t.Errorf("guestproperty enumerate Net: %d, %q; want Net/Count", code, out)
	}
	dir := t.TempDir()
	if code, _, errs := h.run("guestcontrol", "g", "copyfrom", "--username", "vagrant", "--passwordfile", pw, "/proc/version", dir+"/"); code != 0 {
		t.Fatalf("copyfrom into DIR/: %d, %q", code, errs)
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "version")); err != nil || !bytes.HasPrefix(raw, []byte("Linux version")) {
		t.Errorf("copied file: %q, %v; want the kernel's version", raw, err)
	}
	code, _, errs := h.run("guestcontrol", "g", "copyfrom", "--username", "vagrant", "--passwordfile", pw, "/proc/version", dir)
	if code != 1 || !strings.Contains(errs, "on the host already exists and is a directory") {
		t.Errorf("copyfrom into DIR without slash: %d, %q; want 1, already exists and is a directory", code, errs)
	}
	code, _, errs = h.run("guestcontrol", "g", "copyfrom", "--username", "vagrant", "--passwordfile", pw, "/nonexistent", dir+"/")
	if code != 1 || !strings.Contains(errs, `No such file or directory "/nonexistent"`) {
		t.Errorf("copyfrom of a missing file: %d, %q; want 1 and the guest's error", code, errs)
	}
}

// TestSnapshotHoldsGuest: a snapshot keeps the lab VM's disk and, taken
// online, its memory. After a power off and a restore of the online one the
// machine is saved and starts where the snapshot was taken (a file in /tmp,
// which lives in memory, is back); a restore of the offline one brings the
// disk (/data) back and the guest boots afresh. Deleting the snapshots
// drops QEMU's copies.
func TestSnapshotHoldsGuest(t *testing.T) {
	vm := labtest.Start(t, lab.Spec{Name: "vboxsnap"})
	m := &Machine{Name: "s", UUID: uuid1, State: "running", StateChange: time.Now(), QGASocket: vm.QGASocket, QMPSocket: vm.QMPSocket}
	h := newTestHost(t, &World{Version: "7.1", VMs: []*Machine{m}})
	pw := filepath.Join(h.dir, "pw")
	guest := func(script string) string {
		t.Helper()
		code, out, errs := h.run("guestcontrol", "s", "run", "--username", "vagrant", "--passwordfile", pw, "--", "/bin/sh", "-c", script)
		if code != 0 {
			t.Fatalf("guest %q: exit %d, %q, %q", script, code, out, errs)
		}
		return out
	}
	vbox := func(want string, args ...string) {
		t.Helper()
		if code, out, errs := h.run(args...); code != 0 || !strings.Contains(out, want) {
			t.Fatalf("VBoxManage %q = %d, %q, %q; want 0 and %q", args, code, out, errs, want)
		}
	}
	// booted waits for a guest that boots afresh to answer, as a client of
	// VirtualBox would: "not ready (yet)" until VBoxService is up.
	booted := func() {
		t.Helper()
		deadline := time.Now().Add(testload.Scale(labtest.BootTimeout))
		for {
			code, _, errs := h.run("guestcontrol", "s", "run", "--username", "vagrant", "--passwordfile", pw, "--", "/bin/true")
			if code == 0 {
				return
			}
			if !strings.Contains(errs, "not ready (yet)") || time.Now().After(deadline) {
				t.Fatalf("waiting for the guest to boot: exit %d, %q", code, errs)
			}
		}
	}
	const marks = "cat /tmp/mark /data/mark 2>&1; exit 0"
	guest("echo before | tee /tmp/mark >/data/mark && sync")
	vbox("Snapshot taken", "snapshot", "s", "take", "online", "--live")
	guest("echo after | tee /tmp/mark >/data/mark && sync")
	vbox("", "controlvm", "s", "poweroff")
	vbox("Restoring snapshot 'online'", "snapshot", "s", "restore", "online")
	vbox(`VMState="saved"`, "showvminfo", "s", "--machinereadable")
	vbox("has been successfully started", "startvm", "s", "--type", "headless")
	if out := guest(marks); out != "before\nbefore\n" {
		t.Errorf("marks after restoring the online snapshot and starting: %q; want both \"before\"", out)
	}

	vbox("", "controlvm", "s", "poweroff")
	vbox("Snapshot taken", "snapshot", "s", "take", "offline")
	vbox("has been successfully started", "startvm", "s")
	booted()
	guest("echo later >/data/mark && sync")
	vbox("", "controlvm", "s", "poweroff")
	vbox("Restoring snapshot 'offline'", "snapshot", "s", "restore", "offline")
	vbox(`VMState="poweroff"`, "showvminfo", "s", "--machinereadable")
	vbox("has been successfully started", "startvm", "s")
	booted()
	if out := guest(marks); !strings.HasSuffix(out, "\nbefore\n") || strings.HasPrefix(out, "before") {
		t.Errorf("marks after restoring the offline snapshot and starting: %q; want /tmp's gone (a fresh boot) and /data's \"before\"", out)
	}

	var tags []string
	for _, s := range h.world().VMs[0].Snapshots {
		tags = append(tags, s.QEMUTag)
	}
	vbox("Deleting snapshot 'offline'", "snapshot", "s", "delete", "offline")
	vbox("Deleting snapshot 'online'", "snapshot", "s", "delete", "online")
	raw, err := qmp.Call(t.Context(), vm.QMPSocket, "human-monitor-command", map[string]any{"command-line": "info snapshots"})
	if err != nil || len(tags) != 2 || slices.Contains(tags, "") {
		t.Fatalf("QEMU's snapshots: %s, %v, tags %q; want two tags", raw, err, tags)
	}
	for _, tag := range tags {
		if strings.Contains(string(raw), tag) {
			t.Errorf("QEMU's snapshots after delete: %s; want no %q", raw, tag)
		}
	}
}

// TestSettingsFile: the machine's settings file (CfgFile) holds the
// snapshot tree with each snapshot's timeStamp, its Description, and a
// stateFile for a snapshot taken online only (Settings.cpp
// buildSnapshotXML); a delete takes the snapshot out.
func TestSettingsFile(t *testing.T) {
	m := &Machine{Name: "x", UUID: uuid1, State: "running", StateChange: time.Now()}
	h := newTestHost(t, &World{Version: "7.1", VMs: []*Machine{m}})
	for _, args := range [][]string{
		{"snapshot", "x", "take", "online", "--description=two\nlines"},
		{"controlvm", "x", "poweroff"},
		{"snapshot", "x", "take", "offline"},
	} {
		if code, out, errs := h.run(args...); code != 0 {
			t.Fatalf("VBoxManage %q = %d, %q, %q; want 0", args, code, out, errs)
		}
	}
	raw, err := os.ReadFile(filepath.Join(h.dir, "x", "x.vbox"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Machine struct {
			Current  string `xml:"currentSnapshot,attr"`
			Snapshot struct {
				Name        string `xml:"name,attr"`
				TimeStamp   string `xml:"timeStamp,attr"`
				StateFile   string `xml:"stateFile,attr"`
				Description string `xml:"Description"`
				Children    []struct {
					Name      string `xml:"name,attr"`
					StateFile string `xml:"stateFile,attr"`
					UUID      string `xml:"uuid,attr"`
				} `xml:"Snapshots>Snapshot"`
			}
		}
	}
	if err := xml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("settings file: %v\n%s", err, raw)
	}
	s := doc.Machine.Snapshot
	if _, err := time.Parse("2006-01-02T15:04:05Z", s.TimeStamp); err != nil || s.Description != "two\nlines" || s.StateFile == "" {
		t.Errorf("online snapshot in the settings file: %+v; want a timeStamp, its description and a stateFile\n%s", s, raw)
	}
	if len(s.Children) != 1 || s.Children[0].Name != "offline" || s.Children[0].StateFile != "" || doc.Machine.Current != s.Children[0].UUID {
		t.Errorf("offline snapshot in the settings file: %+v (current %s); want the current child without stateFile\n%s", s.Children, doc.Machine.Current, raw)
	}
	if code, out, errs := h.run("snapshot", "x", "delete", "offline"); code != 0 {
		t.Fatalf("snapshot delete = %d, %q, %q", code, out, errs)
	}
	if bytes.Contains(raw, []byte("<Snapshots></Snapshots>")) {
		t.Errorf("settings file has an empty Snapshots element (only a snapshot with children has one):\n%s", raw)
	}
	if raw, _ := os.ReadFile(filepath.Join(h.dir, "x", "x.vbox")); bytes.Contains(raw, []byte(`name="offline"`)) {
		t.Errorf("settings file after deleting the snapshot still has it:\n%s", raw)
	}
}
