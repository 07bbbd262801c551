package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/guest/image"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/internal/lab"
)

func init() { commands = append(commands, newLabCmd) }

// newLabCmd is `vmgate lab up|status|down`: local QEMU (TCG) VMs running
// the lab image, daemonized, found again through <state>/lab/<name>/vm.json.
func newLabCmd() *cobra.Command {
	var stateDir string
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Run local lab VMs (QEMU with its guest agent) for vmgate to drive",
	}
	cmd.PersistentFlags().StringVar(&stateDir, "state-dir", "", "state directory (default $VMGATE_STATE_DIR, else $XDG_STATE_HOME/vmgate, else ~/.local/state/vmgate)")
	dir := func() (string, error) {
		if stateDir != "" {
			return stateDir, nil
		}
		return lab.DefaultStateDir()
	}
	cmd.AddCommand(newLabUpCmd(dir), newLabStatusCmd(dir), newLabDownCmd(dir))
	return cmd
}

// labUp is what `lab up` was asked for.
type labUp struct {
	n       int
	prefix  string
	memory  int
	cmdline map[string]string
}

func newLabUpCmd(stateDir func() (string, error)) *cobra.Command {
	var u labUp
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Build the lab image and boot N lab VMs (vm1..vmN)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return u.run(cmd, stateDir)
		},
	}
	cmd.Flags().IntVar(&u.n, "vms", 1, "number of VMs")
	cmd.Flags().StringVar(&u.prefix, "name-prefix", "vm", "VM names are <prefix>1..<prefix>N")
	cmd.Flags().IntVar(&u.memory, "memory", lab.DefaultMemoryMB, "guest memory in MiB")
	cmd.Flags().StringToStringVar(&u.cmdline, "cmdline", nil, "KEY=VALUE for the guest's /init (QGA_BLOCK=guest-exec, CGROUP2=0)")
	return cmd
}

// labStarted is one VM lab up started (or found running), or why not.
type labStarted struct {
	vm  *lab.VM
	err error
}

// run validates every VM's spec, builds the image and boots the VMs in
// parallel, then prints them.
func (u labUp) run(cmd *cobra.Command, stateDir func() (string, error)) error {
	if u.n < 1 || u.n > 32 {
		return fmt.Errorf("lab up: --vms %d: want 1..32", u.n)
	}
	dir, err := stateDir()
	if err != nil {
		return err
	}
	specs := make([]lab.Spec, u.n)
	for i := range specs {
		specs[i] = lab.Spec{Name: u.prefix + strconv.Itoa(i+1), StateDir: dir, MemoryMB: u.memory, Cmdline: u.cmdline, Daemonize: true}
	}
	// Validate every spec before building or booting anything.
	for _, s := range specs {
		if err := s.Validate(); err != nil {
			return fmt.Errorf("lab up: %w", err)
		}
	}
	stderr := cmd.ErrOrStderr()
	var outMu sync.Mutex
	step := func(s string) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintln(stderr, "lab:", s)
	}
	// Made 0700 with its files 0600, or tightened so when an older lab up
	// left it open: its disks hold the guests' files and, in their
	// snapshots, their memory.
	if err := lab.PrepareStateDir(dir); err != nil {
		return fmt.Errorf("lab up: %w", err)
	}
	step("state directory " + dir)
	img, err := image.Build(cmd.Context(), image.Options{StateDir: dir, Progress: step, Extra: guestHelperExtra(step)})
	if err != nil {
		return fmt.Errorf("lab up: %w", err)
	}
	results := startLabVMs(cmd.Context(), dir, specs, &img, step)
	if err := printLabVMs(cmd.OutOrStdout(), results); err != nil {
		return fmt.Errorf("lab up: %w", err)
	}
	return nil
}

// startLabVMs boots the VMs of specs from img in parallel; one already
// running is left as it is.
func startLabVMs(ctx context.Context, dir string, specs []lab.Spec, img *image.Image, step func(string)) []labStarted {
	results := make([]labStarted, len(specs))
	var wg sync.WaitGroup
	for i, s := range specs {
		s.Image, s.Progress = img, step
		wg.Go(func() {
			if old, err := lab.Get(dir, s.Name); err == nil && old.State == lab.StateRunning {
				step(s.Name + " is already running")
				results[i] = labStarted{vm: old}
				return
			}
			ctx, cancel := context.WithTimeout(ctx, lab.DefaultBootTimeout)
			defer cancel()
			v, err := lab.Start(ctx, s)
			results[i] = labStarted{v, err}
		})
	}
	wg.Wait()
	return results
}

// printLabVMs writes a table of the VMs started and returns the errors of
// those that were not.
func printLabVMs(out io.Writer, results []labStarted) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tPID\tBOOT\tQGA SOCKET\tQMP SOCKET")
	var errs []error
	for _, r := range results {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		boot := "-"
		if r.vm.BootTime > 0 {
			boot = r.vm.BootTime.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", r.vm.Name, lab.StateRunning, r.vm.PID, boot, r.vm.QGASocket, r.vm.QMPSocket)
	}
	tw.Flush()
	return errors.Join(errs...)
}

func newLabStatusCmd(stateDir func() (string, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the lab VMs, their state and guest agent",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := stateDir()
			if err != nil {
				return err
			}
			vms, err := lab.List(dir)
			if err != nil {
				return fmt.Errorf("lab status: %w", err)
			}
			if len(vms) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "lab: no lab VMs in", dir)
				return nil
			}
			agents := make([]string, len(vms))
			var wg sync.WaitGroup
			for i := range vms {
				agents[i] = "-"
				if vms[i].State != lab.StateRunning {
					continue
				}
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
					defer cancel()
					info, err := vms[i].AgentStatus(ctx)
					switch {
					case errors.Is(err, lab.ErrAgentBusy):
						agents[i] = "busy: another client (a running vmgate serve?) holds its only connection"
						return
					case err != nil:
						agents[i] = "not answering"
						return
					}
					agents[i] = "qemu-ga " + info.Version
					if !info.Enabled("guest-exec") {
						agents[i] += " (guest-exec disabled)"
					}
				})
			}
			wg.Wait()
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tPID\tAGENT\tQGA SOCKET\tQMP SOCKET")
			for i, v := range vms {
				pid := "-"
				if v.State == lab.StateRunning {
					pid = strconv.Itoa(v.PID)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, v.State, pid, agents[i], v.QGASocket, v.QMPSocket)
			}
			return tw.Flush()
		},
	}
}

func newLabDownCmd(stateDir func() (string, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "down [NAME...]",
		Short: "Stop lab VMs (all of them without names)",
		RunE: func(cmd *cobra.Command, names []string) error {
			dir, err := stateDir()
			if err != nil {
				return err
			}
			var vms []lab.VM
			if len(names) == 0 {
				if vms, err = lab.List(dir); err != nil {
					return fmt.Errorf("lab down: %w", err)
				}
			}
			for _, name := range names { // all names checked before anything stops
				v, err := lab.Get(dir, name)
				if err != nil {
					return fmt.Errorf("lab down: %w", err)
				}
				vms = append(vms, *v)
			}
			errs := make([]error, len(vms))
			var wg sync.WaitGroup
			for i := range vms {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(cmd.Context(), 15*time.Second)
					defer cancel()
					errs[i] = vms[i].Stop(ctx)
				})
			}
			wg.Wait()
			for i, v := range vms {
				if errs[i] == nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "lab: %s stopped\n", v.Name)
				}
			}
			if err := errors.Join(errs...); err != nil {
				return fmt.Errorf("lab down: %w", err)
			}
			return nil
		},
	}
}

// guestHelperExtra ships vmgate-guest in the lab image (the lab guest is
// x86_64): the build for amd64 found in $VMGATE_GUEST_DIR or beside this
// binary (make build puts it there). Without one the image has no helper,
// and the session tools say so.
func guestHelperExtra(step func(string)) []image.File {
	bin, err := guestctl.DefaultBinaries().Binary("amd64")
	if err != nil {
		step("no vmgate-guest build to ship (" + err.Error() + ")")
		return nil
	}
	src, err := filepath.Abs(bin.Source)
	if err != nil {
		step("no vmgate-guest build to ship (" + err.Error() + ")")
		return nil
	}
	step("shipping " + src + " as " + guestctl.GuestPath)
	return []image.File{{Src: src, Dst: guestctl.GuestPath, Mode: 0o755}}
}
