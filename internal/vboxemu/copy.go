package vboxemu

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// siteCopyProgress is where gctlHandleCopy checks the copy's progress
// (CHECK_PROGRESS_ERROR with __PRETTY_FUNCTION__ as the context).
var siteCopyProgress = contextSite{"VBoxManageGuestCtrl.cpp", "RTEXITCODE gctlHandleCopy(PGCTLCMDCTX, int, char**, bool)",
	map[string]int{"6.1": 1952, "7.0": 1816, "7.1": 1840}}

// copyOpts are gctlHandleCopy's options and arguments.
type copyOpts struct {
	sources   []string
	dst       string
	recursive bool
	noReplace bool
}

func (c *gctlCtx) copyOptionDefs() []optDef {
	if !c.e.v.AtLeast(7, 0) {
		return []optDef{
			{long: "--follow", id: "L"},
			{long: "--recursive", short: 'R', id: "R"},
			{long: "--target-directory", id: "t", kind: reqString},
		}
	}
	return []optDef{
		{long: "--follow", id: "L"}, {long: "--dereference", short: 'L', id: "L"},
		{long: "--no-replace", short: 'n', id: "n"},
		{long: "--recursive", short: 'R', id: "R"},
		{long: "--target-directory", short: 't', id: "t", kind: reqString},
		{long: "--update", short: 'u', id: "u"},
	}
}

// handleCopy is gctlHandleCopy for one file. A --target-directory is the
// destination as given (fDstMustBeDir is never used); otherwise the last
// argument is. copyfrom makes the destination absolute with RTPathAbs,
// which keeps a trailing slash (RTPathAbsEx.cpp: RTPATH_PROP_DIR_SLASH).
func (c *gctlCtx) handleCopy(args []string, toGuest bool) int {
	e := c.e
	var o copyOpts
	code := c.subOptions(args, c.copyOptionDefs(), func(r *optResult) int {
		if r.def == nil {
			o.sources = append(o.sources, r.value)
			return -1
		}
		switch r.def.id {
		case "L":
			if r.def.long == "--follow" && e.v.AtLeast(7, 0) {
				e.warningf("--follow is deprecated; use --dereference instead.")
			}
		case "R":
			o.recursive = true
		case "n":
			o.noReplace = true
		case "t":
			o.dst = r.value
		}
		return -1
	})
	if code >= 0 {
		return code
	}
	if len(o.sources) == 0 {
		return e.syntaxError("No sources specified!")
	}
	if o.dst == "" && len(o.sources) >= 2 {
		o.dst, o.sources = o.sources[len(o.sources)-1], o.sources[:len(o.sources)-1]
	}
	if o.dst == "" {
		return e.syntaxError("No destination specified!")
	}
	if !toGuest {
		o.dst = rtPathAbs(o.dst)
	}
	if code := c.postOptionParsingInit(); code != exitSuccess {
		return code
	}
	if c.verbose > 0 {
		if toGuest {
			e.printf("Copying from host to guest ...\n")
		} else {
			e.printf("Copying from guest to host ...\n")
		}
	}
	if !e.v.AtLeast(7, 0) && len(o.sources) != 1 {
		e.errorf("Only one source file or directory at the moment.")
		return exitFailure
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if toGuest {
		return c.copyTo(ctx, o)
	}
	return c.copyFrom(ctx, o)
}

// rtPathAbs is RTPathAbs for an absolute or relative host path: "." and
// ".." resolved, a trailing slash kept.
func rtPathAbs(p string) string {
	slash := strings.HasSuffix(p, "/") && p != "/"
	if !filepath.IsAbs(p) {
		if wd, err := os.Getwd(); err == nil {
			p = filepath.Join(wd, p)
		}
	}
	p = filepath.Clean(p)
	if slash && p != "/" {
		p += "/"
	}
	return p
}

// buildDestinationPath is GuestPath::BuildDestinationPath
// (GuestCtrlPrivate.cpp) for 7.x: when the source names a file or
// directory and the destination ends in a separator, the source's name is
// appended (rule 2); otherwise the destination is used as it is (rule 3:
// "overwrites stuff from path2 with stuff from path1"). ".." is refused.
func buildDestinationPath(src, dst string) (string, bool) {
	name := path.Base(src)
	if strings.HasSuffix(src, "/") {
		name = ""
	}
	if name != "" && strings.HasSuffix(dst, "/") {
		dst += name
	}
	for _, comp := range strings.Split(dst, "/") {
		if comp == ".." {
			return dst, false
		}
	}
	return dst, true
}

// copyFailed is CHECK_PROGRESS_ERROR then gctlPrintProgressError for a
// failed copy task: "File copy failed", the task's message with its details
// and context, and the message again (gctlPrintError for VBOX_E_IPRT_ERROR
// prints it with a full stop).
func (c *gctlCtx) copyFailed(msg string) int {
	e := c.e
	e.errorf("File copy failed")
	e.errorf("%s\nDetails: code %s (%#x), component %s, interface %s\n%s", msg, codeIPRTError.name, codeIPRTError.value,
		"GuestSession", "IGuestSession", siteCopyProgress.context(e.v))
	e.errorf("%s.", msg)
	return exitFailure
}

// copyFrom copies one guest file to the host: GuestSession::copyFromGuest
// queries the source's type first (a missing source fails there), then the
// task (GuestSessionImplTasks.cpp GuestSessionTaskCopyFrom::Run): 7.x builds
// the destination with BuildDestinationPath and refuses an existing
// directory as a file's destination; 6.1 copies into an existing directory
// under the source's name (GuestSessionTask::fileCopyFromGuest).
func (c *gctlCtx) copyFrom(ctx context.Context, o copyOpts) int {
	e := c.e
	src := o.sources[0]
	typ, err := c.g.fsType(ctx, src)
	if err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	if typ == "" {
		if !e.v.AtLeast(7, 0) {
			e.errorf("FsObjQueryInfo failed on '%s': VBOX_E_IPRT_ERROR", src)
			return exitFailure
		}
		e.errorf("Querying guest filesystem object information failed: No such file or directory \"%s\".", src)
		e.errorf("Error looking file system information for source '%s', vrc=VERR_GENERAL_FAILURE", src)
		return exitFailure
	}
	if c.verbose > 0 && e.v.AtLeast(7, 0) {
		e.printf("Source '%s' is a %s\n", src, typ)
	}
	if typ != "file" {
		e.errorf("emulator: copying a guest %s is not emulated", typ)
		return exitFailure
	}
	dst := o.dst
	st, statErr := os.Stat(dst)
	if e.v.AtLeast(7, 0) {
		var ok bool
		if dst, ok = buildDestinationPath(src, dst); !ok {
			return c.copyFailed("Building host destination root path \"" + dst + "\" failed: VERR_INVALID_PARAMETER")
		}
		if st2, err := os.Stat(dst); err == nil && st2.IsDir() {
			return c.copyFailed("Destination \"" + dst + "\" on the host already exists and is a directory")
		}
		if _, err := os.Stat(dst); err == nil && o.noReplace {
			return c.copyFailed("Host file \"" + dst + "\" already exists")
		}
	} else if statErr == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(src))
	}
	data, truncated, err := c.g.readFile(ctx, src, 1<<30)
	if err != nil {
		return c.copyFailed("Guest file \"" + src + "\" could not be opened: " + err.Error())
	}
	if truncated {
		e.errorf("emulator: \"%s\" is over 1 GiB", src)
		return exitFailure
	}
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		return c.copyFailed("Opening host file \"" + dst + "\" failed: " + hostVrc(err))
	}
	return exitSuccess
}

// copyTo copies one host file into the guest (GuestSessionTaskCopyTo::Run
// and fileCopyToGuest): the destination is built like copyfrom's; an
// existing guest directory is refused; a new guest file is created with
// VBoxService's default mode (RTFileOpen's RT_FILE_PERMISSION, 0600), an
// existing one keeps its mode.
func (c *gctlCtx) copyTo(ctx context.Context, o copyOpts) int {
	e := c.e
	src := o.sources[0]
	fi, err := os.Stat(src)
	if err != nil {
		e.errorf("Error looking file system information for source '%s', vrc=%s", src, hostVrc(err))
		return exitFailure
	}
	if c.verbose > 0 && e.v.AtLeast(7, 0) {
		e.printf("Source '%s' is a %s\n", src, map[bool]string{true: "directory", false: "file"}[fi.IsDir()])
	}
	if fi.IsDir() {
		e.errorf("emulator: copying a host directory is not emulated")
		return exitFailure
	}
	dst := o.dst
	if e.v.AtLeast(7, 0) {
		var ok bool
		if dst, ok = buildDestinationPath(src, dst); !ok {
			return c.copyFailed("Building guest destination root path \"" + dst + "\" failed: VERR_INVALID_PARAMETER")
		}
	}
	typ, err := c.g.fsType(ctx, dst)
	if err != nil {
		e.errorf("emulator: %v", err)
		return exitFailure
	}
	switch {
	case typ == "directory" && e.v.AtLeast(7, 0):
		return c.copyFailed("Destination \"" + dst + "\" on the guest already exists and is a directory")
	case typ == "directory":
		dst = strings.TrimSuffix(dst, "/") + "/" + filepath.Base(src)
	case typ == "file" && o.noReplace:
		return c.copyFailed("Guest file \"" + dst + "\" already exists")
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return c.copyFailed("Opening host file \"" + src + "\" failed: " + hostVrc(err))
	}
	mode := uint32(0)
	if typ == "" {
		mode = 0o600
	}
	if err := c.g.writeFile(ctx, dst, data, mode); err != nil {
		return c.copyFailed("Guest file \"" + dst + "\" could not be created or replaced: " + err.Error())
	}
	return exitSuccess
}

// hostVrc is the IPRT status of a host file error.
func hostVrc(err error) string {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "VERR_FILE_NOT_FOUND"
	case errors.Is(err, os.ErrPermission):
		return "VERR_ACCESS_DENIED"
	}
	return "VERR_GENERAL_FAILURE"
}
