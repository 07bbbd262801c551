package vboxemu

import (
	"strconv"
	"strings"
)

// The option parser of every VBoxManage command: IPRT's RTGetOpt
// (src/VBox/Runtime/common/misc/getopt.cpp), for the option kinds the
// emulated commands use.

// optKind is what an option takes (RTGETOPT_REQ_*).
type optKind int

const (
	reqNothing optKind = iota
	reqString
	reqUint32
)

// optDef is one RTGETOPTDEF.
type optDef struct {
	long  string
	short byte // 0: none
	id    string
	kind  optKind
}

// optResult is one RTGetOpt return.
type optResult struct {
	def   *optDef // nil for a non-option
	value string  // the option's value, or the non-option
	u32   uint32
}

// optError is a failed RTGetOpt (VERR_GETOPT_*), reported by errorGetOpt.
type optError struct {
	rc   string // VERR_GETOPT_UNKNOWN_OPTION, ...
	psz  string
	long string // the option's long name when known
}

// Status texts of the getopt errors (include/iprt/err.h comments, which
// IPRT's %Rrs prints).
var getoptStatusText = map[string]string{
	"VERR_GETOPT_REQUIRED_ARGUMENT_MISSING": "RTGetOpt: Command line option needs argument.",
	"VERR_GETOPT_INVALID_ARGUMENT_FORMAT":   "RTGetOpt: Command line option has argument with bad format.",
}

// getopt is an RTGETOPTSTATE.
type getopt struct {
	args      []string
	defs      []optDef
	optsFirst bool // RTGETOPTINIT_FLAGS_OPTS_FIRST
	stdOpts   bool // without RTGETOPTINIT_FLAGS_NO_STD_OPTS: --help/-h/-? and --version/-V

	i        int
	deferred []string // non-options held back while options remain (OPTS_FIRST)
	rest     []string // non-options still to return
	restMode bool
}

// Standard options RTGetOptInit adds unless RTGETOPTINIT_FLAGS_NO_STD_OPTS.
var stdOptDefs = []optDef{
	{long: "--help", short: 'h', id: "h"},
	{long: "-?", short: '?', id: "h"},
	{long: "--version", short: 'V', id: "V"},
}

func newGetopt(args []string, defs []optDef, optsFirst bool) *getopt {
	return &getopt{args: args, defs: defs, optsFirst: optsFirst, stdOpts: true}
}

func (g *getopt) allDefs() []optDef {
	if !g.stdOpts {
		return g.defs
	}
	return append(append([]optDef{}, g.defs...), stdOptDefs...)
}

// searchLong is rtGetOptSearchLong: an option taking a value matches
// "--name", "--name=value" and "--name:value"; one without matches exactly.
func (g *getopt) searchLong(arg string) (*optDef, int) {
	defs := g.allDefs()
	for i := range defs {
		d := &defs[i]
		if d.long == "" || !strings.HasPrefix(arg, d.long) {
			continue
		}
		n := len(d.long)
		if d.kind != reqNothing {
			if n == len(arg) || arg[n] == '=' || arg[n] == ':' {
				return d, n
			}
		} else if n == len(arg) {
			return d, n
		}
	}
	return nil, 0
}

func (g *getopt) searchShort(c byte) *optDef {
	defs := g.allDefs()
	for i := range defs {
		if defs[i].short == c {
			return &defs[i]
		}
	}
	return nil
}

// next is RTGetOpt: (nil, nil, false) at the end.
func (g *getopt) next() (*optResult, *optError, bool) {
	if g.restMode {
		if len(g.rest) == 0 {
			return nil, nil, false
		}
		v := g.rest[0]
		g.rest = g.rest[1:]
		return &optResult{value: v}, nil, true
	}
	for g.i < len(g.args) {
		arg := g.args[g.i]
		g.i++
		def, cch := g.searchLong(arg)
		short := false
		if def == nil && len(arg) >= 2 && arg[0] == '-' && arg[1] != '-' && arg[1] < 0x80 {
			if def = g.searchShort(arg[1]); def != nil {
				cch, short = 2, true
			}
		}
		if def == nil && arg == "--" {
			// Look for dash-dash: everything after it is a non-option, after
			// the non-options held back so far.
			g.restMode = true
			g.rest = append(g.deferred, g.args[g.i:]...)
			g.deferred, g.i = nil, len(g.args)
			return g.next()
		}
		if def == nil {
			if g.optsFirst {
				if strings.HasPrefix(arg, "-") {
					return nil, &optError{rc: "VERR_GETOPT_UNKNOWN_OPTION", psz: arg}, true
				}
				g.deferred = append(g.deferred, arg)
				continue
			}
			if strings.HasPrefix(arg, "-") && len(arg) > 1 {
				return nil, &optError{rc: "VERR_GETOPT_UNKNOWN_OPTION", psz: arg}, true
			}
			return &optResult{value: arg}, nil, true
		}
		return g.value(def, arg, cch, short)
	}
	if len(g.deferred) > 0 {
		g.restMode, g.rest, g.deferred = true, g.deferred, nil
		return g.next()
	}
	return nil, nil, false
}

// value fetches an option's value: "-svalue", "-s value", "-s:value",
// "-s=value" and the long equivalents.
func (g *getopt) value(def *optDef, arg string, cch int, short bool) (*optResult, *optError, bool) {
	if def.kind == reqNothing {
		return &optResult{def: def}, nil, true
	}
	var v string
	switch {
	case cch == len(arg):
		if g.i >= len(g.args) {
			return nil, &optError{rc: "VERR_GETOPT_REQUIRED_ARGUMENT_MISSING", long: def.long}, true
		}
		v = g.args[g.i]
		g.i++
	case arg[cch] == '=' || arg[cch] == ':':
		v = arg[cch+1:]
	case short:
		v = arg[cch:]
	}
	r := &optResult{def: def, value: v}
	if def.kind == reqUint32 {
		// RTStrToUInt32Full with base 0: decimal, 0x hex, 0 octal.
		u, err := strconv.ParseUint(v, 0, 32)
		if err != nil {
			return nil, &optError{rc: "VERR_GETOPT_INVALID_ARGUMENT_FORMAT", psz: v, long: def.long}, true
		}
		r.u32 = uint32(u)
	}
	return r, nil, true
}

// each runs f on every option and non-option RTGetOpt returns, in order.
// A getopt failure ends the walk with onErr's exit code; f ends it by
// returning an exit code (>= 0). It returns -1 when the arguments ran out.
func (g *getopt) each(onErr func(*optError) int, f func(r *optResult) int) int {
	for {
		r, oe, ok := g.next()
		if !ok {
			return -1
		}
		if oe != nil {
			return onErr(oe)
		}
		if code := f(r); code >= 0 {
			return code
		}
	}
}

// miscOptError is how handleStartVM and handleUnregisterVM report a getopt
// failure themselves (VBoxManageMisc.cpp): errorSyntax with "unknown
// option: %s" or the option and the status text.
func (e *emu) miscOptError(oe *optError) int {
	if oe.rc == "VERR_GETOPT_UNKNOWN_OPTION" {
		return e.syntaxError("unknown option: %s\n", oe.psz)
	}
	return e.syntaxError("%s: %s", oe.long, getoptStatusText[oe.rc])
}

// getoptError is errorGetOpt (VBoxManageHelp.cpp errorGetOptWorker): the
// logo, then the reason on stderr; exit 2. A standard --version option
// prints the version, --help succeeds.
func (e *emu) getoptError(oe *optError) int {
	e.showLogo(e.stderr)
	switch oe.rc {
	case "VERR_GETOPT_UNKNOWN_OPTION":
		e.errorf("Unknown option: %s", oe.psz)
	case "VERR_GETOPT_INVALID_ARGUMENT_FORMAT":
		e.errorf("Invalid argument format: %s", oe.psz)
	default:
		e.errorf("%s: %s", oe.long, getoptStatusText[oe.rc])
	}
	return exitSyntax
}

// invalidParameter is errorGetOpt for VINF_GETOPT_NOT_OPTION.
func (e *emu) invalidParameter(p string) int {
	e.showLogo(e.stderr)
	e.errorf("Invalid parameter '%s'", p)
	return exitSyntax
}

// stdOption handles the standard options a handler passes on to
// errorGetOpt: 'V' prints the version and 'h' the help (left out).
func (e *emu) stdOption(r *optResult) (int, bool) {
	if r.def == nil {
		return 0, false
	}
	switch r.def.id {
	case "V":
		e.printf("%s", e.v.VersionLine())
		return exitSuccess, true
	case "h":
		return exitSuccess, true
	}
	return 0, false
}
