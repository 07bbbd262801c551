package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/server"
)

func init() { commands = append(commands, newUndoCmd) }

func newUndoCmd() *cobra.Command {
	var o approvalsOptions
	cmd := &cobra.Command{
		Use:   "undo CALL_ID",
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
VM. Everything since the snapshot is lost.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runUndo(cmd.Context(), cmd.OutOrStdout(), o, args[0])
		},
	}
	cmd.Flags().StringVar(&o.config, "config", "", "config file (vmgate.yaml) whose state directory holds the socket; default: embedded defaults")
	cmd.Flags().StringVar(&o.socket, "socket", "", "operator socket path (default: operator.sock in the state directory)")
	return cmd
}

func runUndo(ctx context.Context, out io.Writer, o approvalsOptions, callID string) error {
	path, err := operatorSocket(o)
	if err != nil {
		return err
	}
	resp, err := server.OperatorCall(ctx, path, server.OperatorRequest{Op: server.OpUndo, ID: callID})
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
