// Package agent is what runs inside the guest as vmgate-guest: the process
// table (gopsutil v4 and /proc), runs with a timeout that kills the whole
// process tree, guarded kills, and sessions (a workdir plus every process
// started in it, tracked by a cgroup v2 group or, without one, by the
// VMGATE_SESSION environment marker found through /proc).
//
// The host runs one vmgate-guest process per command through the guest
// agent's exec channel: arguments as flags, the run request as JSON on stdin,
// and exactly one JSON reply (wire.Reply) on stdout. Logs go to stderr only.
// Concurrent vmgate-guest processes serialise session changes with an
// flock on <Root>/lock; nothing else is shared between them.
//
// Everything but this comment is Linux-only.
package agent
