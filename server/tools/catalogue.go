// Package tools holds every tool family of vmgate: each file describes its
// tools (a catalog.Tool with its arguments, annotations and result shapes),
// their typed argument structs and their handlers, which get a catalog.Env
// and a catalog.Call and nothing of the gate. Catalogue lists them in
// tools/list order.
//
// A handler reaches a VM through its call's driver (hypervisor.Driver and
// its optional capabilities) or, for what runs through vmgate-guest
// (sessions, processes, files, a command in a session), through
// Env.Guest; what it derives in the guest that the policy must see again
// (a path a symlink led to) goes through Env.Redecide. Argument checks that
// need no guest are the argument struct's (catalog.ArgChecker,
// catalog.Completer): the gate runs them before the policy decides.
//
// The package imports neither the gate nor a transport.
package tools

import "github.com/vmgate/vmgate/server/catalog"

// Catalogue returns the tools for limits, in tools/list order. Each tool
// is defined in the file of its family, with its argument struct and
// handler:
//
//	vms.go        list_vms, vm_status
//	exec.go       vm_agent_exec, vm_agent_exec_status
//	processes.go  list_processes, kill_process
//	sessions.go   create_session, list_sessions, destroy_session
//	files.go      vm_file_read, vm_file_write
//	archive.go    vm_dir_list, vm_archive_read, vm_archive_write (entries.go: the policy on every entry)
//	power.go      vm_power
//	snapshots.go  snapshot_create, snapshot_list, snapshot_revert, snapshot_delete
//	observe.go    vm_network, vm_metrics
//	trash.go      restore_session_files
//	lifecycle.go  vm_create, vm_delete
//	screen.go     vm_screenshot, vm_send_keys
//	console.go    vm_console_read, vm_console_write
//
// A new tool goes into the file of its family (a new family into a file
// of its own) and gets its entry here. The family to come: exec's
// sandbox one-shot, wait: false in sessions and since cursor in exec.go
// and exec_result.go.
func Catalogue(l catalog.Limits) []*catalog.Tool {
	return []*catalog.Tool{
		listVMsTool(),
		vmStatusTool(),
		listProcessesTool(),
		listSessionsTool(),
		execTool(l),
		execStatusTool(),
		createSessionTool(),
		killProcessTool(),
		destroySessionTool(),
		fileReadTool(l),
		fileWriteTool(),
		dirListTool(),
		archiveReadTool(),
		archiveWriteTool(),
		powerTool(),
		snapshotListTool(),
		snapshotCreateTool(),
		snapshotRevertTool(),
		snapshotDeleteTool(),
		vmNetworkTool(),
		vmMetricsTool(),
		restoreSessionFilesTool(),
		createTool(),
		deleteTool(),
		screenshotTool(l),
		sendKeysTool(),
		consoleReadTool(),
		consoleWriteTool(),
	}
}

// ArgsWithDefaults is args of tool with every left-out argument that has a
// default set to it (the default limits' timeout), as the server's policy
// conditions see them; args of a tool that is none come back as they are.
func ArgsWithDefaults(tool string, args map[string]any) map[string]any {
	for _, t := range Catalogue(catalog.DefaultLimits()) {
		if t.Name == tool {
			return t.WithDefaults(args)
		}
	}
	return args
}

// Names returns the names of every tool of the catalogue, in catalogue
// order: the closed set of tool label values server/metrics counts by (a
// name outside it is counted as "other").
func Names() []string {
	list := Catalogue(catalog.DefaultLimits())
	names := make([]string, len(list))
	for i, t := range list {
		names[i] = t.Name
	}
	return names
}
