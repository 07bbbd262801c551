package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/server/operator"
)

func init() { commands = append(commands, newUndoCmd) }

func newUndoCmd() *cobra.Command {
	var o approvalsOptions
	var lo undoListOptions
	var list bool
	cmd := &cobra.Command{
		Use:   "undo CALL_ID | undo --list [--grant G] [--vm V] [--json]",
		Short: "Revert a VM to the snapshot a call took before it ran (snapshot_before)",
		Long: `undo reverts the VM of a call to the undo snapshot the server took before
the call ran (a tool whose policy says snapshot_before; the call id is in the
call's result and in the audit log). It talks to the running server through its
operator socket, like "vmgate approvals".

The server finds the call in its audit log: the snapshot, its identity as the
backend gave it, and the VM of the call. It reverts that VM only, and only to
that very snapshot: one deleted and made anew under the name since is refused,
and nothing is reverted.

An undo needs an approval: the first "vmgate undo CALL_ID" parks one and prints
its id; "vmgate approvals show ID" shows when the snapshot was taken and the
call it undoes (tool, grant, VM, time, arguments as the audit log has them);
after "vmgate approvals grant ID", the same "vmgate undo CALL_ID" reverts the
VM. Everything since the snapshot is lost.

undo --list lists the calls that can still be undone, newest first, from the
audit log (--log, else the config's audit.path): call id, time, grant, tool,
VM, the snapshot and its identity, when its retention ends, and when it was
last undone (the snapshot stays: a call can be undone again until then).
--grant and --vm narrow the list, --json prints it as a JSON array. It reads
the log while the server writes it, and needs no server.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if list {
				return cobra.NoArgs(cmd, args)
			}
			if lo.grant != "" || lo.vm != "" || lo.json || lo.log != "" {
				return errors.New("undo: --grant, --vm, --json and --log go with --list")
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if list {
				return runUndoList(cmd.OutOrStdout(), o.config, lo, time.Now())
			}
			return runUndo(cmd.Context(), cmd.OutOrStdout(), o, args[0])
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&list, "list", false, "list the calls that can still be undone, from the audit log")
	fl.StringVar(&lo.grant, "grant", "", "with --list: only this grant's calls")
	fl.StringVar(&lo.vm, "vm", "", "with --list: only calls on this VM (lab/vm1)")
	fl.BoolVar(&lo.json, "json", false, "with --list: print a JSON array")
	fl.StringVar(&lo.log, "log", "", "with --list: the audit log (default: audit.path of --config)")
	cmd.Flags().StringVar(&o.config, "config", "", "config file (vmgate.yaml) whose state directory holds the socket; default: embedded defaults")
	cmd.Flags().StringVar(&o.socket, "socket", "", "operator socket path (default: operator.sock in the state directory)")
	return cmd
}

// runUndoList is `vmgate undo --list`.
func runUndoList(out io.Writer, configPath string, o undoListOptions, now time.Time) error {
	path := o.log
	if path == "" {
		cfg, err := loadConfig(configPath)
		if err != nil {
			return fmt.Errorf("undo --list: %w", err)
		}
		path = cfg.Audit.Path
	}
	list, err := listUndoable(path, o, now)
	if err != nil {
		return err
	}
	return writeUndoable(out, list, o.json)
}

func runUndo(ctx context.Context, out io.Writer, o approvalsOptions, callID string) error {
	path, err := operatorSocket(o)
	if err != nil {
		return err
	}
	resp, err := operator.Call(ctx, path, operator.Request{Op: operator.OpUndo, ID: callID})
	if err != nil {
		return fmt.Errorf("undo %s: %w", callID, err)
	}
	u := resp.Undo
	switch {
	case u == nil:
		return fmt.Errorf("undo %s: the server sent no answer", callID)
	case u.Reverted:
		fmt.Fprintf(out, "call %s undone: %s reverted to snapshot %s, taken %s (approval %s, by %s)\n",
			u.Call, u.VM, u.Snapshot, u.Taken.Local().Format(time.DateTime), u.ApprovalID, resp.Operator)
	default:
		fmt.Fprintf(out, "undo of call %s (%s by grant %s on %s at %s):\n", u.Call, u.Tool, u.Grant, u.VM, u.CallTime.Local().Format(time.DateTime))
		fmt.Fprintf(out, "  reverting %s to snapshot %s, taken %s (identity %s, kept until %s), needs an approval:\n",
			u.VM, u.Snapshot, u.Taken.Local().Format(time.DateTime), u.SnapshotID, u.Expires.Local().Format(time.DateTime))
		fmt.Fprintf(out, "  vmgate approvals show %s   (the call's arguments)\n  vmgate approvals grant %s\nthen run vmgate undo %s again\n",
			u.ApprovalID, u.ApprovalID, u.Call)
	}
	return nil
}
