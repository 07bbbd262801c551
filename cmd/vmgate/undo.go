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

An undo needs an approval: the first "vmgate undo CALL_ID" parks one and prints
its id; after "vmgate approvals grant ID", the same "vmgate undo CALL_ID"
reverts the VM. Everything since the snapshot is lost.`,
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
		fmt.Fprintf(out, "call %s undone: %s reverted to snapshot %s (approval %s, by %s)\n", u.Call, u.VM, u.Snapshot, u.ApprovalID, resp.Operator)
	default:
		fmt.Fprintf(out, "undo of call %s: reverting %s to snapshot %s (kept until %s) needs an approval:\n  vmgate approvals grant %s\nthen run vmgate undo %s again\n",
			u.Call, u.VM, u.Snapshot, u.Expires.Local().Format(time.DateTime), u.ApprovalID, u.Call)
	}
	return nil
}
