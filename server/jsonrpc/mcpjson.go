package jsonrpc

import (
	"encoding/json"
	"strconv"
)

// NumbersFit reports whether every number in v (as Decode gives it) is one
// encoding/json decodes into a float64.
func NumbersFit(v any) bool {
	switch v := v.(type) {
	case json.Number:
		_, err := strconv.ParseFloat(string(v), 64)
		return err == nil
	case map[string]any:
		for _, e := range v {
			if !NumbersFit(e) {
				return false
			}
		}
	case []any:
		for _, e := range v {
			if !NumbersFit(e) {
				return false
			}
		}
	}
	return true
}

// EncodingJSONValue is v (as Decode gives it) as encoding/json decodes the
// same JSON into an any: numbers as float64, in new maps and slices. ok
// false: a number no float64 holds.
func EncodingJSONValue(v any) (any, bool) {
	switch v := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(v), 64)
		return f, err == nil
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			c, ok := EncodingJSONValue(e)
			if !ok {
				return nil, false
			}
			out[k] = c
		}
		return out, true
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, ok := EncodingJSONValue(e)
			if !ok {
				return nil, false
			}
			out[i] = c
		}
		return out, true
	}
	return v, true
}
