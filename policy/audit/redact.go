package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
)

// secretKeys are argument names whose whole value is a secret: what a
// command reads, a file's content, and text typed on a VM's keyboard or
// serial console (vm_send_keys, vm_console_write: a password at a login
// prompt is typed there).
var secretKeys = []string{"stdin", "content", "content_base64", "text"}

// Redact returns a copy of args with secrets replaced by
// "sha256:<hex>,len:N" (the SHA-256 and byte length of the value as sent):
// the values of stdin, content, content_base64 and text, and every value (not the
// names) of env. Keys match case-insensitively and at any depth, so a
// malformed call (`"STDIN"`, an env nested somewhere odd) leaks nothing
// either. A secret that is not a string is hashed as its JSON encoding; an
// env that is not an object is redacted whole. Redact never mutates args:
// maps and slices are copied.
func Redact(args map[string]any) map[string]any {
	if args == nil {
		return nil
	}
	return redactMap(args)
}

func redactMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		switch {
		case isSecretKey(k):
			out[k] = redactValue(v)
		case strings.EqualFold(k, "env"):
			out[k] = redactEnv(v)
		default:
			out[k] = redactAny(v)
		}
	}
	return out
}

func isSecretKey(k string) bool {
	for _, s := range secretKeys {
		if strings.EqualFold(k, s) {
			return true
		}
	}
	return false
}

func redactAny(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return redactMap(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = redactAny(e)
		}
		return out
	case map[string]string:
		out := make(map[string]any, len(v))
		for k, e := range v {
			if isSecretKey(k) || strings.EqualFold(k, "env") {
				out[k] = redactValue(e)
			} else {
				out[k] = e
			}
		}
		return out
	case []string:
		return append([]string(nil), v...)
	}
	return v
}

func redactEnv(v any) any {
	switch env := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(env))
		for k, e := range env {
			out[k] = redactValue(e)
		}
		return out
	case map[string]string:
		out := make(map[string]any, len(env))
		for k, e := range env {
			out[k] = redactValue(e)
		}
		return out
	}
	return redactValue(v)
}

// redactValue replaces one secret value by its digest.
func redactValue(v any) string {
	var b []byte
	switch v := v.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		enc, err := json.Marshal(v)
		if err != nil {
			// Unencodable: still nothing of it may leak.
			return "sha256:unencodable,len:0"
		}
		b = enc
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]) + ",len:" + strconv.Itoa(len(b))
}

// IsSecretArg reports whether the log keeps an argument of this name only
// as a digest: stdin, content, content_base64 and text (whole), env (every
// value), in any case and at any depth.
func IsSecretArg(name string) bool { return isSecretKey(name) || strings.EqualFold(name, "env") }
