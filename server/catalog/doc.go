// Package catalog is the contract between the gate (package server) and the
// tools: how a tool is described (Tool, Field: one description from which
// the published JSON Schema and the strict validator are both made), its
// typed arguments (NewTool checks the argument struct against the fields),
// the shapes of its results (OObject, …: the published outputSchema), what
// a handler gets (an Env shared by every call, and the Call the gate let
// through, never the gate itself) and what it returns (Result, with the
// mapping of driver and guest errors to what an agent reads).
//
// The tool families themselves live in server/tools; the services they
// share live here (Guest: the vmgate-guest helpers and the session store;
// ExecTable; SnapOwners) or below (server/lease). The gate asks each
// argument struct's optional capabilities (ArgChecker, Completer,
// Deadliner, Undoable) before any side effect, and answers a handler's
// Env.Redecide through the Decider it installs.
//
// The package imports neither the gate nor a transport.
package catalog
