package vboxemu

import (
	"context"
	"fmt"
	"net"
	"path"
	"sort"
	"strings"
	"time"
)

// guestProp is one guest property: name, value, timestamp (ns) and flags.
type guestProp struct {
	name, value, flags string
	ts                 int64
}

// guestProps are the properties of a running machine whose Additions
// answer: what VBoxService's VMInfo service writes (VBoxServiceVMInfo.cpp:
// vgsvcVMInfoWriteOS, vgsvcVMInfoWriteNetwork, the Additions version) and
// what the VM process sets at start (/VirtualBox/HostInfo/VBoxVer...).
// The network part follows the Linux code path: SIOCGIFCONF lists the
// interfaces with an IPv4 address; the loopback is skipped; each gets
// V4/IP, V4/Broadcast, V4/Netmask, MAC (12 upper-case hex digits), Status
// (Up) and Name, written TRANSIENT with TRANSRESET; Net/Count is written
// without flags.
func (e *emu) guestProps(ctx context.Context, m *Machine) []guestProp {
	if !m.running() {
		return nil
	}
	ts := m.StateChange.UnixNano()
	props := []guestProp{
		{name: "/VirtualBox/HostInfo/VBoxVer", value: e.v.String(), flags: "TRANSIENT, RDONLYGUEST", ts: ts},
		{name: "/VirtualBox/HostInfo/VBoxVerExt", value: e.v.String(), flags: "TRANSIENT, RDONLYGUEST", ts: ts},
		{name: "/VirtualBox/HostInfo/VBoxRev", value: fmt.Sprint(e.v.Revision), flags: "TRANSIENT, RDONLYGUEST", ts: ts},
	}
	ga := m.gaVersion(e.v)
	if ga == "" || m.QGASocket == "" || m.State != "running" {
		return props
	}
	g := newGuest(e.h, m)
	ifs, err := g.interfaces(ctx)
	if err != nil {
		return props
	}
	now := time.Now().UnixNano()
	props = append(props,
		guestProp{name: "/VirtualBox/GuestAdd/Version", value: ga, ts: now},
		guestProp{name: "/VirtualBox/GuestAdd/VersionExt", value: ga, ts: now},
		guestProp{name: "/VirtualBox/GuestAdd/Revision", value: fmt.Sprint(e.gaRevision(ga)), ts: now},
		guestProp{name: "/VirtualBox/GuestInfo/OS/Product", value: "Linux", ts: now})
	n := 0
	for _, i := range ifs {
		if i.Name == "lo" {
			continue
		}
		for _, a := range i.IPAddresses {
			if a.Type != "ipv4" {
				continue
			}
			p := fmt.Sprintf("/VirtualBox/GuestInfo/Net/%d", n)
			mask := net.CIDRMask(a.Prefix, 32)
			ip := net.ParseIP(a.Address).To4()
			bcast := make(net.IP, 4)
			for k := range bcast {
				if ip != nil {
					bcast[k] = ip[k] | ^mask[k]
				}
			}
			props = append(props,
				guestProp{name: p + "/V4/IP", value: a.Address, flags: "TRANSIENT, TRANSRESET", ts: now},
				guestProp{name: p + "/V4/Broadcast", value: bcast.String(), flags: "TRANSIENT, TRANSRESET", ts: now},
				guestProp{name: p + "/V4/Netmask", value: net.IP(mask).String(), flags: "TRANSIENT, TRANSRESET", ts: now},
				guestProp{name: p + "/MAC", value: strings.ToUpper(strings.ReplaceAll(i.HardwareAddress, ":", "")), flags: "TRANSIENT, TRANSRESET", ts: now},
				guestProp{name: p + "/Status", value: "Up", flags: "TRANSIENT, TRANSRESET", ts: now},
				guestProp{name: p + "/Name", value: i.Name, flags: "TRANSIENT, TRANSRESET", ts: now})
			n++
			break // SIOCGIFCONF: the interface's primary address
		}
	}
	props = append(props, guestProp{name: "/VirtualBox/GuestInfo/Net/Count", value: fmt.Sprint(n), ts: now})
	return props
}

// handleGuestProperty is VBoxManageGuestProp.cpp handleGuestProperty for
// get and enumerate.
func (e *emu) handleGuestProperty(args []string) int {
	switch args[0] {
	case "get":
		return e.guestPropGet(args[1:])
	case "enumerate":
		return e.guestPropEnumerate(args[1:])
	}
	return e.syntaxError("Unknown subcommand: %s", args[0])
}

// guestPropGet is handleGetGuestProperty: "Value: ..." or "No value set!".
func (e *emu) guestPropGet(args []string) int {
	verbose := len(args) == 3 && (args[2] == "--verbose" || args[2] == "-verbose")
	if !verbose && len(args) != 2 {
		return e.syntaxError("Incorrect parameters")
	}
	m := e.w.find(args[0])
	if m == nil {
		return e.notFound(args[0], sitePropGetFindMachine)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range e.guestProps(ctx, m) {
		if p.name == args[1] {
			e.printf("Value: %s\n", p.value)
			if verbose {
				e.printf("Timestamp: %d\n", p.ts)
				e.printf("Flags: %s\n", p.flags)
			}
			return exitSuccess
		}
	}
	e.printf("No value set!\n")
	return exitSuccess
}

// guestPropEnumerate is handleEnumGuestProperty: 6.1 prints "Name: ...,
// value: ..., timestamp: ..., flags: ..." lines; 7.x (the same code in
// 7.0 and 7.1) prints a table "name = 'value'  @ timestamp flags", sorted
// by name unless --unsort, without the timestamp with --no-timestamp and
// without the flags with --no-flags, or the old lines with --old-format.
func (e *emu) guestPropEnumerate(args []string) int {
	// 6.1 prints in the service's order; 7.x sorts by default.
	o := enumOpts{sort: e.v.AtLeast(7, 0), timestamp: true, flags: true, oldFormat: !e.v.AtLeast(7, 0)}
	if e.v.AtLeast(7, 0) {
		if code := e.parseEnumerate(args, &o); code >= 0 {
			return code
		}
	} else {
		if len(args) < 1 || len(args) == 2 || (len(args) > 3 && args[1] != "--patterns" && args[1] != "-patterns") {
			return e.syntaxError("Incorrect parameters")
		}
		o.name = args[0]
		if len(args) > 2 {
			o.patterns = args[2:]
		}
	}
	m := e.w.find(o.name)
	if m == nil {
		return e.notFound(o.name, sitePropGetFindMachine)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var props []guestProp
	for _, p := range e.guestProps(ctx, m) {
		if propMatches(p.name, o.patterns) {
			props = append(props, p)
		}
	}
	if len(props) == 0 {
		e.printf("No properties found.\n")
		return exitSuccess
	}
	if o.sort {
		sort.SliceStable(props, func(i, j int) bool { return props[i].name < props[j].name })
	}
	if o.oldFormat {
		for _, p := range props {
			e.printf("Name: %s, value: %s, timestamp: %d, flags: %s\n", p.name, p.value, p.ts, p.flags)
		}
		return exitSuccess
	}
	e.propTable(props, o)
	return exitSuccess
}

// enumOpts are handleEnumGuestProperty's settings (7.x).
type enumOpts struct {
	name                              string
	patterns                          []string
	sort, timestamp, flags, oldFormat bool
}

// parseEnumerate is 7.x handleEnumGuestProperty's option loop: the first
// non-option is the VM, the others (and --patterns values) patterns.
// Relative timestamps (--rel) are not emulated.
func (e *emu) parseEnumerate(args []string, o *enumOpts) int {
	g := newGetopt(args, []optDef{
		{long: "--old-format", short: 'o', id: "o"},
		{long: "--sort", short: 's', id: "s"}, {long: "--unsort", short: 'u', id: "u"},
		{long: "--timestamp", short: 't', id: "t"}, {long: "--ts", id: "t"},
		{long: "--no-timestamp", short: 'T', id: "T"}, {long: "--no-ts", id: "T"},
		{long: "--abs", short: 'a', id: "a"}, {long: "--absolute", id: "a"},
		{long: "--rel", short: 'r', id: "r"}, {long: "--relative", id: "r"},
		{long: "--flags", short: 'f', id: "f"}, {long: "--no-flags", short: 'F', id: "F"},
		{long: "--patterns", short: 'p', id: "p", kind: reqString},
		{long: "-patterns", id: "p", kind: reqString},
	}, false)
	if code := g.each(e.getoptError, func(r *optResult) int {
		switch {
		case r.def == nil && o.name == "":
			o.name = r.value
		case r.def == nil || r.def.id == "p":
			o.patterns = append(o.patterns, r.value)
		default:
			switch r.def.id {
			case "o":
				o.oldFormat = true
			case "s", "u":
				o.sort = r.def.id == "s"
			case "t", "T":
				o.timestamp = r.def.id == "t"
			case "f", "F":
				o.flags = r.def.id == "f"
			case "r":
				e.errorf("emulator: relative timestamps are not emulated")
				return exitFailure
			}
		}
		return -1
	}); code >= 0 {
		return code
	}
	if o.name == "" {
		return e.syntaxError("No VM name or UUID was specified")
	}
	return -1
}

// propTable is the 7.x table: names padded to the longest (at most 48),
// the value column to the longest value (at most 28), then "@ <absolute
// time with milliseconds>" and the flags; with neither a timestamp nor
// flags to print, the line ends after the value.
func (e *emu) propTable(props []guestProp, o enumOpts) {
	wName, wValue := 1, 1
	for _, p := range props {
		wName, wValue = max(wName, len(p.name)), max(wValue, len(p.value))
	}
	wName, wValue = min(wName, 48), min(wValue, 28)
	for _, p := range props {
		out := fmt.Sprintf("%-*s = '%s'", wName, p.name, p.value)
		flags := ""
		if o.flags {
			flags = p.flags
		}
		if !o.timestamp && flags == "" {
			e.printf("%s\n", out)
			continue
		}
		pad := wName + wValue + 6 - len(out)
		if pad < 1 {
			pad = 1
		}
		stamp := ""
		if o.timestamp {
			t := time.Unix(0, p.ts).UTC()
			stamp = fmt.Sprintf("@ %04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond()/1e6)
		}
		if flags != "" {
			flags = " " + flags
		}
		e.printf("%s%*s%s%s\n", out, pad, "", stamp, flags)
	}
}

// propMatches is the guest property service's pattern match
// (RTStrSimplePatternMultiMatch: '*' and '?', alternatives separated by
// '|'; VBoxManage joins several patterns with ','). No pattern matches all.
func propMatches(name string, patterns []string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		for _, alt := range strings.FieldsFunc(p, func(r rune) bool { return r == '|' || r == ',' }) {
			if ok, _ := path.Match(alt, name); ok {
				return true
			}
			if strings.HasSuffix(alt, "*") && strings.HasPrefix(name, strings.TrimSuffix(alt, "*")) {
				return true
			}
		}
	}
	return false
}
