// Package chaos is vmgate's reliability campaign: tests that start real
// `vmgate serve` processes (built once per run), real lab VMs and real
// redis-server and redis-sentinel processes, drive them with many concurrent
// MCP clients over streamable HTTP and stdio, and check the promises from
// the outside: limits hold (recomputed from the audit logs), no allowed call
// lacks its records, the audit chain verifies, kill -9 loses no
// reservation, a Redis failover allows no call beyond a limit and no
// approval twice, faults deny and then recover, and hostile input (testdata/hostile at the repository root) is
// refused without touching the guest.
//
// The short form runs in `go test ./...`. VMGATE_CHAOS=long selects the long
// form (more clients, longer load, more kills). Each test prints a line of
// the report table; TestMain prints the table at the end.
//
// The package has no API: everything lives in its tests.
package chaos
