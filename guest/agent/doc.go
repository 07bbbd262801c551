// Package agent is what runs inside the guest as vmgate-guest: the process
// table (gopsutil v4 and /proc), runs with a timeout that kills the whole
// process tree, guarded kills, and sessions (a workdir plus every process
// started in it, tracked by a cgroup v2 group or, without one, by the
// session's uid or a secret VMGATE_SESSION marker found through /proc; see
// membership.go).
//
// A session created with a wire.Sandbox is confined, without eBPF: every
// process started in it is forked by a thread of its run that first
// gives itself a mount namespace, opens the session's own paths once
// without following symlinks (rulepaths.go), builds a Landlock ruleset
// from them (go-landlock; read and execute the system, write the
// session's directories), enters the session's network namespace, mounts
// everything read-only but the write paths and the session's private
// /tmp (mounts.go), sets no_new_privs, drops the capabilities a child
// could keep and enforces the ruleset; the child switches to the
// session's own uid and gid (which clears its capabilities) and execs the
// command, confined from its first instruction (runSetup.startConfined). A session whose limits
// are rlimits (no cgroup v2) uses the sandbox shim instead (SandboxMain,
// a re-exec of vmgate-guest that does the same to itself, rlimits last).
// Session create decides what this kernel can give (plan), refuses what a
// request requires and the kernel lacks, and reports what holds
// (wire.Enforced, with what denies each right outside the session's
// paths) in create's reply and in list.
//
// Root-side work on a session's files (restore, destroy, the trash) goes
// by file descriptor, never by a name a session controls, with a bounded
// number of descriptors however deep the tree (fdwalk.go); restore
// freezes the receiving session while it moves files in (freeze.go).
//
// The host runs one vmgate-guest process per command through the guest
// agent's exec channel: arguments as flags, the run request as JSON on stdin,
// and exactly one JSON reply (wire.Reply) on stdout. Logs go to stderr only.
// Concurrent vmgate-guest processes serialise session changes with an
// flock on <Root>/lock; nothing else is shared between them. The resident
// helper (`vmgate-guest serve`, resident.go) serves the same commands
// without a process per command, keeps jobs (jobs.go), and keeps a few
// sandboxed sessions ready for one-shot runs (pool.go).
//
// Where gopsutil is used, and where /proc is read directly: gopsutil v4
// lists the pids for ps, and it is the reference the ps rows are tested
// against (TestPSMatchesGopsutil: ppid, name, cmdline, user, start time).
// The per-process hot loop reads /proc itself: one open /proc/P directory
// per process (so a row never mixes two processes that shared a pid), raw
// open/read/close into one reused buffer, only the fields a row needs
// (stat, cgroup, environ only when the cgroup names no session, cmdline,
// the Uid line of status), /etc/passwd parsed once per scan. gopsutil's
// per-process accessors cost an os.File, a whole-file parse and fresh
// allocations per field (and its CPU percent samples with a sleep), which
// made ps with 1,000 processes take seconds on an emulated (TCG) guest.
// CPU percent here is CPU time over the process's lifetime, without
// sleeping. Boot time comes from /proc/stat's btime (procFS.bootTime), not
// gopsutil's BootTime: kill's started_at guard compares against ps's
// start times to the millisecond, so both must use the same btime, and
// gopsutil switches to /proc/uptime (which drifts) inside containers.
//
// metrics (metrics.go) reads the guest's CPU, memory, load, filesystems,
// block devices and interfaces with gopsutil v4's cpu, mem, load, disk and
// net packages, so every backend reports the same figures.
//
// Everything but this comment is Linux-only.
package agent
