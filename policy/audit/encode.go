package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The record encoder. A record is encoded on every call's path (twice: the
// decision and the outcome), and encoding/json spends most of an append's
// CPU time and allocations on reflection and on the redacted copy of the
// arguments. appendBody writes the same bytes json.Marshal(recordBody{…})
// wrote over the redacted arguments (TestEncodeMatchesEncodingJSON holds it
// to that), redacting while it writes, so the arguments are never copied.
// Values of types it does not know are handed to encoding/json.

// errUnencodable wraps a value the encoder cannot write as JSON.
var errUnencodable = errors.New("unencodable value")

// appendBody appends rec's body (every field but seq, prev_hash and hash)
// to b, with its arguments redacted. rec must have been validated.
func appendBody(b []byte, rec *Record) ([]byte, error) {
	b = append(b, `{"time":`...)
	t := rec.Time
	if y := t.Year(); y < 0 || y >= 10000 {
		return nil, errors.New("time: year outside of range [0,9999]")
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","kind":`...)
	b = appendString(b, string(rec.Kind))
	b = append(b, `,"call_id":`...)
	b = appendString(b, rec.CallID)
	b = appendField(b, "grant", rec.Grant)
	b = appendField(b, "transport", rec.Transport)
	b = appendField(b, "tool", rec.Tool)
	b = appendField(b, "vm", rec.VM)
	b = appendField(b, "decision", rec.Decision)
	b = appendField(b, "rule", rec.Rule)
	b = appendField(b, "reason", rec.Reason)
	b = appendField(b, "approval_id", rec.ApprovalID)
	b = appendField(b, "outcome", rec.Outcome)
	if rec.DurationMS != 0 {
		b = append(b, `,"duration_ms":`...)
		var err error
		if b, err = appendFloat(b, rec.DurationMS); err != nil {
			return nil, err
		}
	}
	if rec.Shadow {
		b = append(b, `,"shadow":true`...)
	}
	if len(rec.Args) > 0 {
		b = append(b, `,"args":`...)
		var err error
		if b, err = appendRedactedMap(b, rec.Args); err != nil {
			return nil, err
		}
	}
	if len(rec.Counters) > 0 {
		b = append(b, `,"counters":[`...)
		for i, c := range rec.Counters {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"key":`...)
			b = appendString(b, c.Key)
			b = append(b, `,"window_ms":`...)
			b = strconv.AppendInt(b, c.Window.Milliseconds(), 10)
			b = append(b, `,"max":`...)
			b = strconv.AppendInt(b, c.Max, 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if rec.Refunded {
		b = append(b, `,"refunded":true`...)
	}
	b = appendField(b, "snapshot", rec.Snapshot)
	b = appendField(b, "snapshot_id", rec.SnapshotID)
	if !rec.SnapshotTaken.IsZero() {
		if y := rec.SnapshotTaken.Year(); y < 0 || y >= 10000 {
			return nil, errors.New("snapshot_taken: year outside of range [0,9999]")
		}
		b = append(b, `,"snapshot_taken":"`...)
		b = rec.SnapshotTaken.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	b = appendField(b, "advance", rec.Advance)
	if rec.Units != 0 {
		b = append(b, `,"units":`...)
		b = strconv.AppendInt(b, rec.Units, 10)
	}
	if rec.ValidMS != 0 {
		b = append(b, `,"valid_ms":`...)
		b = strconv.AppendInt(b, rec.ValidMS, 10)
	}
	return append(b, '}'), nil
}

// appendField appends ,"name":"value" unless value is empty (omitempty).
func appendField(b []byte, name, value string) []byte {
	if value == "" {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendString(b, value)
}

// sortedKeys returns m's keys in byte order, as encoding/json writes them.
func sortedKeys[V any](m map[string]V, buf []string) []string {
	keys := buf[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// appendRedactedMap writes m as Redact(m) would be written: stdin, content,
// content_base64 and text (any case, any depth) become their digests, and so
// does every value of env.
func appendRedactedMap(b []byte, m map[string]any) ([]byte, error) {
	var buf [16]string
	b = append(b, '{')
	for i, k := range sortedKeys(m, buf[:]) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		v := m[k]
		var err error
		switch {
		case isSecretKey(k):
			b = appendDigest(b, v)
		case strings.EqualFold(k, "env"):
			b, err = appendRedactedEnv(b, v)
		default:
			b, err = appendRedacted(b, v)
		}
		if err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func appendRedactedEnv(b []byte, v any) ([]byte, error) {
	var buf [16]string
	switch env := v.(type) {
	case map[string]any:
		b = append(b, '{')
		for i, k := range sortedKeys(env, buf[:]) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendDigest(b, env[k])
		}
		return append(b, '}'), nil
	case map[string]string:
		b = append(b, '{')
		for i, k := range sortedKeys(env, buf[:]) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendDigest(b, env[k])
		}
		return append(b, '}'), nil
	}
	return appendDigest(b, v), nil
}

// appendRedacted writes v as redactAny(v) would be written.
func appendRedacted(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case map[string]any:
		return appendRedactedMap(b, v)
	case []any:
		// Redact copies a nil slice into an empty one: "[]", not "null".
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendRedacted(b, e); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]string:
		var buf [16]string
		b = append(b, '{')
		for i, k := range sortedKeys(v, buf[:]) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			if isSecretKey(k) || strings.EqualFold(k, "env") {
				b = appendDigest(b, v[k])
			} else {
				b = appendString(b, v[k])
			}
		}
		return append(b, '}'), nil
	}
	return appendValue(b, v)
}

// appendValue writes a value that holds no secret.
func appendValue(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case string:
		return appendString(b, v), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case float64:
		return appendFloat(b, v)
	case json.Number:
		if v == "" {
			return append(b, '0'), nil
		}
		if !validNumber(string(v)) {
			return nil, errUnencodable
		}
		return append(b, v...), nil
	case []string:
		if v == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, s := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, s)
		}
		return append(b, ']'), nil
	}
	enc, err := json.Marshal(v)
	if err != nil {
		return nil, errUnencodable
	}
	return append(b, enc...), nil
}

// appendFloat writes f as encoding/json writes a float64.
func appendFloat(b []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, errUnencodable
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9
		if n := len(b) - start; n >= 4 && b[len(b)-4] == 'e' && b[len(b)-3] == '-' && b[len(b)-2] == '0' {
			b[len(b)-2] = b[len(b)-1]
			b = b[:len(b)-1]
		}
	}
	return b, nil
}

// validNumber reports whether s is a JSON number literal.
func validNumber(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '-' {
		s = s[1:]
		if s == "" {
			return false
		}
	}
	switch {
	case s[0] == '0':
		s = s[1:]
	case '1' <= s[0] && s[0] <= '9':
		s = s[1:]
		for len(s) > 0 && '0' <= s[0] && s[0] <= '9' {
			s = s[1:]
		}
	default:
		return false
	}
	if len(s) >= 2 && s[0] == '.' && '0' <= s[1] && s[1] <= '9' {
		s = s[2:]
		for len(s) > 0 && '0' <= s[0] && s[0] <= '9' {
			s = s[1:]
		}
	}
	if len(s) >= 2 && (s[0] == 'e' || s[0] == 'E') {
		s = s[1:]
		if s[0] == '+' || s[0] == '-' {
			s = s[1:]
			if s == "" {
				return false
			}
		}
		for len(s) > 0 && '0' <= s[0] && s[0] <= '9' {
			s = s[1:]
		}
	}
	return s == ""
}

const hexDigits = "0123456789abcdef"

// appendString writes s quoted as encoding/json does: HTML characters,
// control characters, U+2028 and U+2029 escaped, invalid UTF-8 replaced by
// U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendDigest writes redactValue(v) as a JSON string without building it.
func appendDigest(b []byte, v any) []byte {
	var sum [sha256.Size]byte
	var n int
	switch v := v.(type) {
	case string:
		sum, n = sha256.Sum256([]byte(v)), len(v)
	case []byte:
		sum, n = sha256.Sum256(v), len(v)
	default:
		return appendString(b, redactValue(v))
	}
	b = append(b, `"sha256:`...)
	b = hex.AppendEncode(b, sum[:])
	b = append(b, ",len:"...)
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '"')
}
