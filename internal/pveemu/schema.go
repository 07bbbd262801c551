package pveemu

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// prop is one parameter of a method's schema, the subset of
// PVE::JSONSchema (pve-common src/PVE/JSONSchema.pm) the emulated methods use.
type prop struct {
	typ       string // string, integer, boolean, array, number
	optional  bool
	format    string // pve-vmid, pve-node, pve-configid, dns-name
	maxLength int
	minLength int
	minimum   *float64
	maximum   *float64
	enum      []string
}

// schema is a method's parameters (additionalProperties => 0 unless extra).
type schema struct {
	props map[string]prop
	extra bool // additionalProperties => 1
}

func num(f float64) *float64 { return &f }

// The standard options of PVE::JSONSchema and pve-guest-common used here.
var (
	optNode = prop{typ: "string", format: "pve-node"}
	// get_standard_option('pve-vmid'): type integer, format pve-vmid,
	// minimum 100, maximum 999999999.
	optVMID = prop{typ: "integer", format: "pve-vmid", minimum: num(100), maximum: num(999999999)}
	// get_standard_option('pve-snapshot-name').
	optSnapname = prop{typ: "string", format: "pve-configid", maxLength: 40}
)

var (
	// pve_verify_vmid.
	vmidRE = regexp.MustCompile(`^[1-9][0-9]{2,8}$`)
	// pve_verify_node_name: $PVE::JSONSchema::NODE_NAME_RE is a host name label.
	nodeRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?$`)
	// pve_verify_configid: $CONFIGID_RE.
	configIDRE = regexp.MustCompile(`(?i)^[a-z][a-z0-9_-]+$`)
	// pve_verify_dns_name.
	dnsRE = regexp.MustCompile(`^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)\.)*(?:[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)$`)
	// is_integer.
	integerRE = regexp.MustCompile(`^[+-]?\d+$`)
	// is_number.
	numberRE = regexp.MustCompile(`^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$`)
)

// checkFormat is PVE::JSONSchema::check_format for the formats used here;
// the message is what the format verifier dies with.
func checkFormat(format, value string) string {
	switch format {
	case "pve-vmid":
		if !vmidRE.MatchString(value) {
			return "value does not look like a valid VM ID\n"
		}
	case "pve-node":
		if !nodeRE.MatchString(value) {
			return "value does not look like a valid node name\n"
		}
	case "pve-configid":
		if !configIDRE.MatchString(value) {
			return fmt.Sprintf("invalid configuration ID '%s'\n", value)
		}
	case "dns-name":
		if !dnsRE.MatchString(value) {
			return "value does not look like a valid DNS name\n"
		}
	}
	return ""
}

// perlRef is what Perl's ref() says of a decoded JSON value ("" for a scalar).
func perlRef(v any) string {
	switch v.(type) {
	case []any:
		return "ARRAY"
	case map[string]any:
		return "HASH"
	case bool:
		return "JSON::PP::Boolean"
	}
	return ""
}

// scalar is a Perl scalar's string value.
func scalar(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	}
	return fmt.Sprint(v)
}

// checkType is PVE::JSONSchema::check_type; it returns the error or "".
func checkType(typ string, v any) string {
	ref := perlRef(v)
	switch typ {
	case "array":
		if ref != "ARRAY" {
			return fmt.Sprintf("type check ('%s') failed", typ)
		}
		return ""
	case "object":
		if ref != "HASH" {
			return fmt.Sprintf("type check ('%s') failed", typ)
		}
		return ""
	}
	if ref != "" {
		if typ == "boolean" && ref == "JSON::PP::Boolean" {
			return ""
		}
		return fmt.Sprintf("type check ('%s') failed - got %s", typ, ref)
	}
	s := scalar(v)
	switch typ {
	case "boolean":
		if s != "1" && s != "0" {
			return fmt.Sprintf("type check ('%s') failed - got '%s'", typ, s)
		}
	case "integer":
		if !integerRE.MatchString(s) {
			return fmt.Sprintf("type check ('%s') failed - got '%s'", typ, s)
		}
	case "number":
		if !numberRE.MatchString(s) {
			return fmt.Sprintf("type check ('%s') failed - got '%s'", typ, s)
		}
	}
	return ""
}

// checkProp is PVE::JSONSchema::check_prop for one scalar or array value.
func checkProp(p prop, v any, path string, errs map[string]string) {
	if msg := checkType(p.typ, v); msg != "" {
		errs[path] = msg
		return
	}
	if arr, ok := v.([]any); ok {
		for i, el := range arr {
			checkProp(prop{typ: "string"}, el, fmt.Sprintf("%s[%d]", path, i), errs)
		}
		return
	}
	if _, ok := v.(bool); ok {
		return
	}
	s := scalar(v)
	if p.format != "" {
		if msg := checkFormat(p.format, s); msg != "" {
			errs[path] = "invalid format - " + msg
			return
		}
	}
	// length() counts characters (the parameters are decoded UTF-8).
	if p.maxLength > 0 && utf8.RuneCountInString(s) > p.maxLength {
		errs[path] = fmt.Sprintf("value may only be %d characters long", p.maxLength)
		return
	}
	if p.minLength > 0 && utf8.RuneCountInString(s) < p.minLength {
		errs[path] = fmt.Sprintf("value must be at least %d characters long", p.minLength)
		return
	}
	if numberRE.MatchString(s) {
		f, _ := strconv.ParseFloat(s, 64)
		if p.maximum != nil && f > *p.maximum {
			errs[path] = fmt.Sprintf("value must have a maximum value of %s", strconv.FormatFloat(*p.maximum, 'f', -1, 64))
			return
		}
		if p.minimum != nil && f < *p.minimum {
			errs[path] = fmt.Sprintf("value must have a minimum value of %s", strconv.FormatFloat(*p.minimum, 'f', -1, 64))
			return
		}
	}
	if len(p.enum) > 0 {
		found := false
		for _, e := range p.enum {
			found = found || e == s
		}
		if !found {
			errs[path] = fmt.Sprintf("value '%s' does not have a value in the enumeration '%s'", s, strings.Join(p.enum, ", "))
		}
	}
}

// validate is PVE::JSONSchema::validate of a method's parameters; a failure
// is raise_param_exc.
func (s schema) validate(params map[string]any) *apiError {
	errs := map[string]string{}
	names := make([]string, 0, len(s.props))
	for n := range s.props {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := s.props[n]
		v, ok := params[n]
		if !ok || v == nil {
			if !p.optional {
				errs[n] = "property is missing and it is not optional"
			}
			continue
		}
		checkProp(p, v, n, errs)
	}
	if !s.extra {
		for k := range params {
			if _, ok := s.props[k]; !ok {
				errs[k] = "property is not defined in schema and the schema does not allow additional properties"
			}
		}
	}
	if len(errs) > 0 {
		return paramExc(errs)
	}
	return nil
}

// boolParam reads a validated boolean parameter (JSON true/false or 1/0).
func boolParam(params map[string]any, name string, def bool) bool {
	switch v := params[name].(type) {
	case bool:
		return v
	case nil:
		return def
	default:
		return scalar(v) == "1"
	}
}

// intParam reads a validated integer parameter.
func intParam(params map[string]any, name string, def int64) int64 {
	v, ok := params[name]
	if !ok || v == nil {
		return def
	}
	n, err := strconv.ParseInt(strings.TrimPrefix(scalar(v), "+"), 10, 64)
	if err != nil {
		return def
	}
	return n
}

// strParam reads a validated string parameter.
func strParam(params map[string]any, name string) (string, bool) {
	v, ok := params[name]
	if !ok || v == nil {
		return "", false
	}
	return scalar(v), true
}
