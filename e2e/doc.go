// Package e2e holds vmgate's end-to-end test with a real MCP client: the
// official MCP TypeScript SDK (pinned in package.json) drives `vmgate serve`
// over stdio and over streamable HTTP against a real lab VM.
//
// The Go test in this package (TestNodeSDKEndToEnd) owns everything the
// Node tests touch: it boots the lab VM (internal/lab/labtest), builds the
// vmgate binary, writes the config and policy, plants a sentinel file and a
// sleeping sentinel process in the guest, runs stdio.test.mjs, starts the
// HTTP server and runs http.test.mjs, stops it, verifies the audit log, and
// checks that the sentinels are unchanged. agent.test.mjs (grant agentside)
// covers the agent's side of every call: each result validated against its
// tool's outputSchema, the annotations of every tool, and the guest's own
// reasons in errors. TestNodeSDKUndo runs undo.test.mjs against a server of
// its own (snapshot_before and an operator's undo, the session trash,
// vm_network, vm_metrics under load). TestNodeSDKUndoTwoGrants runs
// undo-grants.test.mjs: two grants and two lab VMs, a restart, and undo
// snapshots another grant or QEMU directly tries to replace. TestNodeSDKLifecycle and
// TestNodeSDKLifecycleLibvirt run lifecycle.test.mjs (VMs on demand:
// vm_create, quota, vm_delete, lease end) through the QEMU lab and through
// libvirt on a real libvirtd, and check that nothing is left.
// TestConformanceSuite runs the official MCP conformance suite (pinned in
// conformance/package-lock.json with the Node 22 binary it needs) against
// `vmgate serve --http` with a bearer grant: conformance/bearer.mjs, loaded
// with `node --import`, adds the token to the suite's requests. Run
// scripts/deps.sh (npm ci in e2e and in e2e/conformance) first.
package e2e
