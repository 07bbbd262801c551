package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/policy/audit"
)

func init() { commands = append(commands, newAuditCmd) }

func newAuditCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Work with the audit log",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newAuditVerifyCmd(), newAuditSearchCmd(), newAuditTailCmd(), newAuditShowCmd())
	return cmd
}

func newAuditVerifyCmd() *cobra.Command {
	var keyFile string
	var strict bool
	cmd := &cobra.Command{
		Use:   "verify FILE",
		Short: "Check the audit log's hash chain",
		Long: `Verify checks every record of the audit log FILE against the HMAC chain and
prints "ok" with the record count, or the first bad record (altered, inserted,
removed, reordered or malformed) with its line and seq, and exits 1.

Torn lines (a write cut short by a crash: the record in it was never
acknowledged) are reported as warnings and are not an error unless --strict.
Removing whole records from the end of a log cannot be detected by a chain:
compare the last seq printed with one kept elsewhere.

The key defaults to the file audit.key in FILE's directory.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAuditVerify(cmd.OutOrStdout(), args[0], keyFile, strict)
		},
	}
	cmd.Flags().StringVar(&keyFile, "key", "", "HMAC key file (default: audit.key next to FILE)")
	cmd.Flags().BoolVar(&strict, "strict", false, "treat torn lines as bad")
	return cmd
}

func runAuditVerify(out io.Writer, path, keyFile string, strict bool) error {
	// The log first: a wrong path is the likelier mistake, and the key
	// next to a log that is not there is missing too.
	f, err := openLog("audit verify", path)
	if err != nil {
		return err
	}
	defer f.Close()
	if keyFile == "" {
		keyFile = audit.DefaultKeyFile(path)
	}
	key, err := audit.LoadKey(keyFile)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("audit verify: the log %s is there but its key %s is not (the key is where audit.key_file in vmgate.yaml says; pass it with --key)", path, keyFile)
	}
	if err != nil {
		return fmt.Errorf("audit verify: %w", err)
	}
	rep, err := audit.Verify(f, key)
	var ce *audit.ChainError
	if err != nil && !errors.As(err, &ce) {
		return fmt.Errorf("audit verify: %s: %w", path, err)
	}
	for _, t := range rep.Torn {
		where := "in the middle; the chain continues after it"
		if t.Last {
			where = "the last line (truncated tail)"
		}
		fmt.Fprintf(out, "warning: %s: torn line %d at offset %d (record seq %d never completed), %s\n", path, t.Line, t.Offset, t.Seq, where)
	}
	if ce != nil {
		p := ce.Problem
		fmt.Fprintf(out, "bad: %s: %s\n", path, ce.Error())
		fmt.Fprintf(out, "%d records verified before it (last good seq %d)\n", rep.Records, rep.LastSeq)
		return &exitError{code: 1, msg: fmt.Sprintf("audit verify: %s: first bad record at line %d (%s)", path, p.Line, p.Kind)}
	}
	if strict && len(rep.Torn) > 0 {
		return &exitError{code: 1, msg: fmt.Sprintf("audit verify: %s: %d torn line(s) (--strict)", path, len(rep.Torn))}
	}
	fmt.Fprintf(out, "ok: %s: %d records, last seq %d\n", path, rep.Records, rep.LastSeq)
	return nil
}

// defaultLogHint names the log `vmgate serve` writes without a config, when
// there is one, so a user who guessed the path learns the right one.
func defaultLogHint() string {
	dir, err := lab.DefaultStateDir()
	if err != nil {
		return ""
	}
	p := filepath.Join(dir, "audit.log")
	if _, err := os.Stat(p); err != nil {
		return " (the log is audit.path in vmgate.yaml, by default audit.log in the state directory)"
	}
	return " (the default log is " + p + ")"
}
