package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/operator"
)

func init() { commands = append(commands, newApprovalsCmd) }

type approvalsOptions struct {
	config string
	socket string
	json   bool
}

func newApprovalsCmd() *cobra.Command {
	var o approvalsOptions
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "List, show, grant or deny parked calls of the running server",
		Long: `approvals talks to the running vmgate server through its operator socket
(operator.sock in the state directory, mode 0600). The server identifies you
by your local user name (from the socket's peer credentials) and audits every
grant and deny.

A call that needs an operator's approval returns [APPROVAL REQUIRED] with an
approval id. "list" shows every argument the call will run with (stdin, file
content and env values included, the first 1024 bytes of each, with their
length; characters a terminal would not print as themselves are shown as
escapes, binary content as a hex dump); "show ID" shows all of it. After
"vmgate approvals grant ID", the same grant's retry with exactly these
arguments goes through once; a retry that differs in any byte needs an
approval of its own.`,
		Args: cobra.NoArgs,
	}
	cmd.PersistentFlags().StringVar(&o.config, "config", "", "config file (vmgate.yaml) whose state directory holds the socket; default: embedded defaults")
	cmd.PersistentFlags().StringVar(&o.socket, "socket", "", "operator socket path (default: operator.sock in the state directory)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List approvals (pending, granted, denied, used)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runApprovalsList(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	list.Flags().BoolVar(&o.json, "json", false, "print the approvals as JSON")
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one approval with all of its call's arguments",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runApprovalsShow(cmd.Context(), cmd.OutOrStdout(), o, args[0])
		},
	}
	show.Flags().BoolVar(&o.json, "json", false, "print the approval as JSON")
	decide := func(op, short string) *cobra.Command {
		var reason string
		c := &cobra.Command{
			Use:   op + " ID",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return runApprovalsDecide(cmd.Context(), cmd.OutOrStdout(), o, op, args[0], reason)
			},
		}
		c.Flags().StringVar(&reason, "reason", "", "why (recorded in the audit log)")
		return c
	}
	cmd.AddCommand(list, show,
		decide(operator.OpGrant, "Approve a parked call: its identical retry goes through once"),
		decide(operator.OpDeny, "Refuse a parked call"))
	return cmd
}

func operatorSocket(o approvalsOptions) (string, error) {
	if o.socket != "" {
		return o.socket, nil
	}
	cfg, err := loadConfig(o.config)
	if err != nil {
		return "", fmt.Errorf("approvals: %w", err)
	}
	return filepath.Join(cfg.StateDir, operator.SocketName), nil
}

func runApprovalsList(ctx context.Context, out io.Writer, o approvalsOptions) error {
	path, err := operatorSocket(o)
	if err != nil {
		return err
	}
	resp, err := operator.Call(ctx, path, operator.Request{Op: operator.OpList})
	if err != nil {
		return fmt.Errorf("approvals list: %w", err)
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if resp.Approvals == nil {
			return enc.Encode([]struct{}{})
		}
		return enc.Encode(resp.Approvals)
	}
	if len(resp.Approvals) == 0 {
		fmt.Fprintln(out, "no approvals")
		return nil
	}
	for i, a := range resp.Approvals {
		if i > 0 {
			fmt.Fprintln(out)
		}
		writeApproval(out, a)
	}
	return nil
}

func runApprovalsShow(ctx context.Context, out io.Writer, o approvalsOptions, id string) error {
	path, err := operatorSocket(o)
	if err != nil {
		return err
	}
	resp, err := operator.Call(ctx, path, operator.Request{Op: operator.OpShow, ID: id})
	if err != nil {
		return fmt.Errorf("approvals show: %w", err)
	}
	if resp.Approval == nil {
		return fmt.Errorf("approvals show: the server sent no approval")
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(resp.Approval)
	}
	writeApproval(out, *resp.Approval)
	return nil
}

func runApprovalsDecide(ctx context.Context, out io.Writer, o approvalsOptions, op, id, reason string) error {
	path, err := operatorSocket(o)
	if err != nil {
		return err
	}
	resp, err := operator.Call(ctx, path, operator.Request{Op: op, ID: id, Reason: reason})
	if err != nil {
		return fmt.Errorf("approvals %s: %w", op, err)
	}
	a := resp.Approval
	if a == nil {
		return fmt.Errorf("approvals %s: the server sent no approval", op)
	}
	fmt.Fprintf(out, "%s %s by %s: %s %s", a.ID, a.State, resp.Operator, a.Tool, orDash(a.VM))
	if a.State == "granted" {
		fmt.Fprintf(out, " (usable once until %s)", a.Expires.Local().Format(time.DateTime))
	}
	fmt.Fprintln(out)
	return nil
}

// startOperator serves the operator socket of srv in stateDir until ctx
// ends; stop closes it and waits for the serving goroutine.
func startOperator(ctx context.Context, srv *server.Server, stateDir string) (stop func(), err error) {
	o, err := operator.Listen(srv, filepath.Join(stateDir, operator.SocketName))
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := o.Serve(ctx); err != nil {
			slog.Error("vmgate: operator socket stopped", "err", err)
		}
	}()
	slog.Info("vmgate: operator socket", "path", o.Path())
	return func() {
		if err := o.Close(); err != nil {
			slog.Warn("vmgate: operator socket", "err", err)
		}
		<-done
	}, nil
}
