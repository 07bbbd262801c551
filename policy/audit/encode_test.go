package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"
)

// referenceBody is how records were encoded before the hand-written
// encoder: encoding/json over a redacted copy, seq, prev_hash and hash
// hidden. The hand-written encoder must write exactly these bytes.
func referenceBody(rec Record) ([]byte, error) {
	type body struct {
		Seq      *struct{} `json:"seq,omitempty"`
		PrevHash *struct{} `json:"prev_hash,omitempty"`
		Hash     *struct{} `json:"hash,omitempty"`
		*Record
	}
	rec.Time = rec.Time.UTC()
	rec.Args = Redact(rec.Args)
	return json.Marshal(body{Record: &rec})
}

type textValue struct{ A int }

func encodeCases() []Record {
	base := func() Record {
		return Record{Time: time.Date(2026, 7, 1, 12, 0, 0, 123456789, time.FixedZone("X", 3600)), Kind: KindDecision, CallID: "c1", Decision: "allow"}
	}
	var out []Record
	add := func(f func(r *Record)) {
		r := base()
		f(&r)
		out = append(out, r)
	}
	add(func(r *Record) {})
	add(func(r *Record) {
		r.Grant, r.Transport, r.Tool, r.VM, r.Rule, r.Reason, r.ApprovalID = "alice", "http", "vm_agent_exec", "lab/vm1", "/tools/x", "why <not> & \"so\"", "ap1"
		r.Shadow = true
		r.Counters = Counters{{Key: "k|grant=a", Window: time.Minute, Max: 30}, {Key: "\x00\xff", Window: time.Millisecond, Max: 0}}
	})
	add(func(r *Record) {
		r.Kind, r.Decision, r.Outcome, r.Refunded, r.Snapshot = KindOutcome, "", "ok", true, "vmgate-undo-t8x2k0-abcdef"
		r.SnapshotID, r.SnapshotTaken = "qemu:1:1796119094.123456000:115343360:42.000000001", time.Date(2026, 12, 1, 9, 58, 14, 123456000, time.UTC)
		for _, d := range []float64{1.5} {
			r.DurationMS = d
		}
	})
	add(func(r *Record) {
		r.Counters, r.Advance = Counters{{Key: "all_calls|grant=a", Window: time.Minute, Max: 600}}, "adv-X"
	})
	add(func(r *Record) {
		r.Kind, r.Decision, r.CallID, r.Units, r.ValidMS = KindAdvance, "", "adv-X", 30, 1000
		r.Counters = Counters{{Key: "all_calls|grant=a", Window: time.Minute, Max: 600}}
	})
	add(func(r *Record) { r.Kind, r.Decision, r.CallID, r.Units = KindAdvanceEnd, "", "adv-X", 7 })
	for _, d := range []float64{0.0000001, 1e21, 123456.789, 1e-6, 5e-324, math.MaxFloat64} {
		add(func(r *Record) { r.Kind, r.Decision, r.Outcome, r.DurationMS = KindOutcome, "", "error", d })
	}
	add(func(r *Record) {
		r.Reason = "ctl \x01\x1f\t\n\r\b\f \\ / \u2028 \u2029 é 日本 \xff\xfe bad utf8 \U0001F600"
		r.Tool = string([]byte{0xed, 0xa0, 0x80}) // a surrogate encoded in UTF-8: invalid
	})
	add(func(r *Record) {
		r.Args = map[string]any{
			"vm": "lab/vm1", "command": []any{"echo", "<b>", json.Number("-1.5e+10"), int64(-7), 3, 2.5, true, nil},
			"stdin": "secret", "STDIN": []any{"x"}, "Content": map[string]any{"a": 1}, "content_base64": json.Number("12"),
			"env":    map[string]any{"TOKEN": "t", "N": json.Number("1"), "Z": nil},
			"nested": map[string]any{"env": "whole", "deep": map[string]any{"stdin": "s2", "ok": "visible"}},
			"ms":     map[string]string{"stdin": "s", "env": "e", "plain": "p"},
			"strs":   []string{"a", "b"}, "nilstrs": []string(nil), "nilany": []any(nil), "nilmap": map[string]any(nil),
			"nilms": map[string]string(nil), "empty": map[string]any{}, "struct": textValue{A: 1}, "bytes": []byte("hi"),
			"": "empty key", "ключ": "ü",
		}
	})
	add(func(r *Record) {
		r.Args = map[string]any{"env": map[string]string{"B": "2", "A": "1"}}
	})
	add(func(r *Record) {
		r.Args = map[string]any{"env": []any{"not a map"}}
	})
	add(func(r *Record) {
		m := map[string]any{}
		for i := range 40 { // more keys than the sort buffer holds
			m[string(rune('a'+i%26))+string(rune('A'+i/26))] = i
		}
		r.Args = m
	})
	return out
}

func TestEncodeMatchesEncodingJSON(t *testing.T) {
	for i, rec := range encodeCases() {
		want, err := referenceBody(rec)
		if err != nil {
			t.Fatalf("case %d: reference encoding: %v", i, err)
		}
		got, err := encodeBody(&rec)
		if err != nil {
			t.Fatalf("case %d: encodeBody = %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("case %d: encodeBody =\n%s\nwant (encoding/json)\n%s", i, got, want)
		}
	}
}

// advCounters is a counter set for advance records in tests.
var advCounters = Counters{{Key: "all_calls|grant=a", Window: time.Minute, Max: 600}}

func TestEncodeRejects(t *testing.T) {
	ok := func() Record {
		return Record{Time: time.Unix(1, 0), Kind: KindOutcome, CallID: "c", Outcome: "ok"}
	}
	tests := []struct {
		name string
		mod  func(r *Record)
	}{
		{"NaN duration", func(r *Record) { r.DurationMS = math.NaN() }},
		{"infinite duration", func(r *Record) { r.DurationMS = math.Inf(1) }},
		{"bad json.Number", func(r *Record) { r.Args = map[string]any{"n": json.Number("1; rm")} }},
		{"NaN argument", func(r *Record) { r.Args = map[string]any{"n": math.NaN()} }},
		{"unencodable argument", func(r *Record) { r.Args = map[string]any{"c": make(chan int)} }},
		{"year 10000", func(r *Record) { r.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }},
		{"outcome with units", func(r *Record) { r.Units = 3 }},
		{"outcome with valid_ms", func(r *Record) { r.ValidMS = 3 }},
		{"outcome naming an advance", func(r *Record) { r.Advance = "adv-X" }},
		{"decision naming an advance without counters", func(r *Record) { r.Kind, r.Decision, r.Advance = KindDecision, "allow", "adv-X" }},
		{"decision with units", func(r *Record) { r.Kind, r.Decision, r.Units = KindDecision, "allow", 2 }},
		{"advance without counters", func(r *Record) { r.Kind, r.Units, r.ValidMS = KindAdvance, 2, 1000 }},
		{"advance without units", func(r *Record) { r.Kind, r.ValidMS, r.Counters = KindAdvance, 1000, advCounters }},
		{"advance without valid_ms", func(r *Record) { r.Kind, r.Units, r.Counters = KindAdvance, 2, advCounters }},
		{"advance naming an advance", func(r *Record) {
			r.Kind, r.Units, r.ValidMS, r.Counters, r.Advance = KindAdvance, 2, 1000, advCounters, "adv-Y"
		}},
		{"advance end with counters", func(r *Record) { r.Kind, r.Counters = KindAdvanceEnd, advCounters }},
		{"advance end with negative units", func(r *Record) { r.Kind, r.Units = KindAdvanceEnd, -1 }},
		{"advance end with valid_ms", func(r *Record) { r.Kind, r.ValidMS = KindAdvanceEnd, 5 }},
		{"unknown kind", func(r *Record) { r.Kind = "advanced" }},
	}
	for _, tt := range tests {
		rec := ok()
		tt.mod(&rec)
		if b, err := encodeBody(&rec); !errors.Is(err, ErrInvalid) {
			t.Errorf("encodeBody(%s) = %q, %v; want ErrInvalid", tt.name, b, err)
		}
	}
}

// FuzzEncode holds the encoder to encoding/json for arbitrary strings in
// every string field and argument position.
func FuzzEncode(f *testing.F) {
	f.Add("reason", "key", "value", 1.5)
	f.Add("\xff\u2028<>&", "STDIN", "\x00", 1e-7)
	f.Fuzz(func(t *testing.T, reason, key, value string, d float64) {
		if d < 0 || math.IsNaN(d) || math.IsInf(d, 0) {
			d = 0
		}
		rec := Record{
			Time: time.Unix(0, 1).UTC(), Kind: KindOutcome, CallID: "c", Outcome: "ok" + value, Reason: reason, DurationMS: d,
			Args: map[string]any{key: value, "n": map[string]any{key: []any{value, key}}, "env": map[string]any{key: value}},
		}
		want, err := referenceBody(rec)
		if err != nil {
			t.Skip()
		}
		got, err := encodeBody(&rec)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("encodeBody = %q, %v; want %q", got, err, want)
		}
	})
}
