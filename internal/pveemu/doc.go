// Package pveemu is a Proxmox VE API emulator rebuilt from the upstream
// sources, with real guests behind it: each emulated VM is a QEMU process
// (a lab VM, package lab) whose guest agent answers the agent endpoints and
// whose monitor carries out the power and snapshot actions.
//
// It serves HTTPS on a loopback port, authenticates API tokens and checks
// privileges as Proxmox does, and answers with Proxmox's envelopes, status
// lines and error bodies. Every behaviour cites the upstream file and
// function it follows:
//
//   - pve-http-server src/PVE/APIServer/AnyEvent.pm and Formatter/Standard.pm:
//     the envelope ({"data": ...}, "message" and "errors" on failure), the
//     status line (the first line of the message), the 3 s delay and empty
//     body of a refused login, parameter extraction, body limits,
//     proxy_request's answer when a node cannot be reached (AnyEvent::HTTP's
//     595);
//   - pve-manager PVE/HTTPServer.pm: authentication, rest_handler (method
//     lookup, permission check before parameter validation, proxyto);
//     PVE/API2.pm (/version), PVE/API2/Cluster.pm (/cluster/resources,
//     /cluster/status), PVE/API2/Nodes.pm (/nodes), PVE/API2/Tasks.pm (task
//     status and log), PVE/API2Tools.pm (extract_vm_stats,
//     extract_node_stats), PVE/Service/pvestatd.pm (status broadcasts);
//   - pve-cluster src/PVE/Cluster.pm (members, check_node_exists,
//     check_cfs_quorum), src/pmxcfs/status.c (how long a silent node's
//     status is kept);
//   - pve-access-control src/PVE/AccessControl.pm (tokens, ACL roles),
//     src/PVE/RPCEnvironment.pm (permissions, check, check_any),
//     src/PVE/API2/AccessControl.pm (/access/permissions);
//   - pve-common src/PVE/Exception.pm (403 and 400 messages),
//     src/PVE/JSONSchema.pm (parameter validation messages),
//     src/PVE/RESTEnvironment.pm (fork_worker), src/PVE/UPID.pm (UPIDs and
//     task exit status);
//   - qemu-server src/PVE/API2/Qemu.pm (status, power, snapshots, clone,
//     destroy, migrate_vm, rrddata), src/PVE/API2/Qemu/Agent.pm (agent
//     endpoints and their privileges), src/PVE/QemuServer.pm (vm_start,
//     _do_vm_stop, vm_reboot, vm_reset, vmstatus, check_running),
//     src/PVE/QemuConfig.pm (assert_config_exists_on_node),
//     src/PVE/QemuMigrate.pm (the migration phases),
//     src/PVE/QemuServer/Agent.pm, src/PVE/QMPClient.pm (timeouts and error
//     wording);
//   - pve-guest-common src/PVE/AbstractConfig.pm (load_config, snapshot
//     create, rollback and delete, locks, move_config_to_node),
//     src/PVE/AbstractMigrate.pm (migrate and its task log).
//
// Options.Nodes makes a cluster: the first node serves the API and
// forwards the rest (nodes.go); SetNodeOnline takes a node offline, and
// migrate_vm moves a VM's config between nodes while its QEMU runs on
// (migrate.go).
//
// The version is a parameter (Options.Version; presets PVE84 ... PVE92): it
// decides the agent privileges (VM.Monitor before qemu-server 9.0.3, the
// VM.GuestAgent.* privileges since), the agent failure wording ("qmp
// command" before 9.0.26, "qga command" since) and file-read's count and
// offset (9.1.5).
//
// What is emulated rather than real is said where it is done: the RRD
// history (rrddata), storage, HA (never managed), pools and the owning
// user's ACL of a token (assumed to hold the token's privileges).
//
// Concurrency: an Emulator is safe for concurrent use. Each VM has a config
// lock (held by tasks, as lock_config is upstream) and a monitor lock (QMP
// takes one client at a time); worker tasks run in goroutines that Close
// waits for.
package pveemu
