package hypervisor_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
)

func TestParseKeyCombo(t *testing.T) {
	tests := []struct {
		in   string
		want string // the canonical combination; "" for an error
	}{
		{"ctrl-alt-delete", "ctrl-alt-delete"},
		{"Ctrl-Alt-Del", "ctrl-alt-delete"},
		{"alt-f2", "alt-f2"},
		{"enter", "ret"},
		{"return", "ret"},
		{"ret", "ret"},
		{"shift-a", "shift-a"},
		{"space", "spc"},
		{"minus", "minus"},
		{"ctrl-c", "ctrl-c"},
		{"super", "meta_l"},
		{"ctrl_r-kp_enter", "ctrl_r-kp_enter"},
		{"f12", "f12"},
		// Refused.
		{"", ""},
		{"-", ""},
		{"ctrl-", ""},
		{"-ctrl", ""},
		{"ctrl--c", ""},
		{"ctrl+alt+delete", ""},
		{"ctrl alt", ""},
		{"ctrl-bogus", ""},
		{"ctrl-ctrl", ""},
		{"ctrl-control", ""},
		{"a-b-c-d-e-f-g-h-i", ""},
		{"ctrl\u2010alt", ""}, // a Unicode hyphen is not the separator
		{"ctrl-\u0430", ""},   // Cyrillic a looks like a
		{"ctrl-a\x00", ""},    // NUL
		{"ctrl-\x1b[A", ""},   // an escape sequence as a key name
		{"ctrl-a\n", ""},      // a newline in a name
		{"f13", ""},           // QEMU has it; not every backend can press it
		{"0x1d", ""},          // no raw scan codes
		{strings.Repeat("a", 200), ""},
		{"shift-" + strings.Repeat("x", 130), ""},
	}
	for _, tt := range tests {
		got, err := hypervisor.ParseKeyCombo(tt.in)
		if tt.want == "" {
			if err == nil || !errors.Is(err, hypervisor.ErrInvalidArgument) {
				t.Errorf("ParseKeyCombo(%q) = %v, %v; want ErrInvalidArgument", tt.in, got, err)
			}
			if err != nil && strings.ContainsAny(err.Error(), "\x00\x1b\n") {
				t.Errorf("ParseKeyCombo(%q) error %q carries a raw control character; want it quoted", tt.in, err)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("ParseKeyCombo(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func combos(t *testing.T, ss ...string) []hypervisor.KeyCombo {
	t.Helper()
	var out []hypervisor.KeyCombo
	for _, s := range ss {
		c, err := hypervisor.ParseKeyCombo(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func TestKeysRequestTypesText(t *testing.T) {
	tests := []struct {
		text string
		want []string
	}{
		{"ls -la\n", []string{"l", "s", "spc", "minus", "l", "a", "ret"}},
		{"Hi!", []string{"shift-h", "i", "shift-1"}},
		{"a_b", []string{"a", "shift-minus", "b"}},
		{"~`|\\\"'", []string{"shift-grave_accent", "grave_accent", "shift-backslash", "backslash", "shift-apostrophe", "apostrophe"}},
		{"{}[]<>?/:;", []string{"shift-bracket_left", "shift-bracket_right", "bracket_left", "bracket_right",
			"shift-comma", "shift-dot", "shift-slash", "slash", "shift-semicolon", "semicolon"}},
		{"\t9(", []string{"tab", "9", "shift-9"}},
	}
	for _, tt := range tests {
		for _, km := range []string{"", "us", "en-us"} {
			got, err := hypervisor.KeysRequest{Text: tt.text, Keymap: km}.Presses()
			if err != nil {
				t.Errorf("Presses(text %q, keymap %q) error: %v", tt.text, km, err)
				continue
			}
			if want := combos(t, tt.want...); !reflect.DeepEqual(got, want) {
				t.Errorf("Presses(text %q, keymap %q) = %v; want %v", tt.text, km, got, want)
			}
		}
	}
}

// TestKeysRequestHostile: everything that tries to get past the key model
// is refused before any key is pressed, with a message naming the problem
// (never echoing a control character raw).
func TestKeysRequestHostile(t *testing.T) {
	ctrlAltDel := combos(t, "ctrl-alt-delete")
	tests := []struct {
		name string
		req  hypervisor.KeysRequest
		want string // in the error
	}{
		{"nothing", hypervisor.KeysRequest{}, "no key combination and no text"},
		{"both keys and text", hypervisor.KeysRequest{Combos: ctrlAltDel, Text: "x"}, "not both"},
		{"keymap without text", hypervisor.KeysRequest{Combos: ctrlAltDel, Keymap: "us"}, "a keymap is for text"},
		{"unknown keymap", hypervisor.KeysRequest{Text: "x", Keymap: "de"}, `unknown keymap "de"`},
		{"keymap path", hypervisor.KeysRequest{Text: "x", Keymap: "../../etc/passwd"}, "unknown keymap"},
		{"escape sequence", hypervisor.KeysRequest{Text: "ls\x1b[2J"}, "U+001B"},
		{"carriage return", hypervisor.KeysRequest{Text: "ls\r\n"}, `U+000D at byte 2 of the text (write \n for Enter)`},
		{"ctrl-c as a byte", hypervisor.KeysRequest{Text: "\x03"}, `"ctrl-c"`},
		{"NUL", hypervisor.KeysRequest{Text: "a\x00b"}, "U+0000"},
		{"DEL", hypervisor.KeysRequest{Text: "a\x7f"}, `"backspace"`},
		{"bell", hypervisor.KeysRequest{Text: "\a"}, "U+0007"},
		{"C1 control", hypervisor.KeysRequest{Text: "a\u009bb"}, "U+009B"},
		{"non-ASCII letter", hypervisor.KeysRequest{Text: "café"}, `U+00E9 'é' at byte 3`},
		{"lookalike", hypervisor.KeysRequest{Text: "p\u0430sswd"}, "U+0430"},
		{"fullwidth", hypervisor.KeysRequest{Text: "\uff41"}, "U+FF41"},
		{"no-break space", hypervisor.KeysRequest{Text: "a\u00a0b"}, "U+00A0 at byte 1"},
		{"zero-width space", hypervisor.KeysRequest{Text: "a\u200bb"}, "U+200B at byte 1"},
		{"bidi override", hypervisor.KeysRequest{Text: "a\u202eb"}, "U+202E at byte 1"},
		{"invalid UTF-8", hypervisor.KeysRequest{Text: "a\xffb"}, "not valid UTF-8 at byte 1"},
		{"overlong encoding", hypervisor.KeysRequest{Text: "\xc0\xaf"}, "not valid UTF-8"},
		{"emoji", hypervisor.KeysRequest{Text: "ok 👍"}, "U+1F44D"},
		{"text too long", hypervisor.KeysRequest{Text: strings.Repeat("a", hypervisor.MaxTypedText+1)}, "at most 1024"},
		{"too many combos", hypervisor.KeysRequest{Combos: make([]hypervisor.KeyCombo, hypervisor.MaxKeyCombos+1)}, "at most 64"},
		{"empty combo", hypervisor.KeysRequest{Combos: []hypervisor.KeyCombo{{}}}, "empty key combination"},
		{"unknown key built by hand", hypervisor.KeysRequest{Combos: []hypervisor.KeyCombo{{"ctrl", "alt", "sysrq-b"}}}, `unknown key "sysrq-b"`},
		{"uncanonical key built by hand", hypervisor.KeysRequest{Combos: []hypervisor.KeyCombo{{"Enter"}}}, `unknown key "Enter"`},
		{"key twice built by hand", hypervisor.KeysRequest{Combos: []hypervisor.KeyCombo{{"a", "a"}}}, "names a twice"},
		{"too many keys built by hand", hypervisor.KeysRequest{Combos: []hypervisor.KeyCombo{{"a", "b", "c", "d", "e", "f", "g", "h", "i"}}}, "at most 8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.req.Presses()
			if err == nil || !errors.Is(err, hypervisor.ErrInvalidArgument) {
				t.Fatalf("Presses(%+q) = %v, %v; want ErrInvalidArgument", tt.req.Text, got, err)
			}
			if got != nil {
				t.Errorf("Presses(%+q) returned presses %v with its error; want none", tt.req.Text, got)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Presses(%+q) error = %q; want it to contain %q", tt.req.Text, err, tt.want)
			}
			for _, c := range err.Error() {
				if c < 0x20 || (c >= 0x7f && c < 0xa0) || c == 0x202e || c == 0x200b {
					t.Errorf("Presses(%+q) error %q carries U+%04X raw; want it named", tt.req.Text, err, c)
				}
			}
		})
	}
}

func TestKeyCodes(t *testing.T) {
	tests := []struct {
		key       hypervisor.Key
		linux, xt uint16
	}{
		{"esc", 1, 0x01}, {"a", 30, 0x1e}, {"ret", 28, 0x1c}, {"ctrl", 29, 0x1d}, {"alt", 56, 0x38},
		{"delete", 111, 0xe053}, {"f1", 59, 0x3b}, {"f12", 88, 0x58}, {"up", 103, 0xe048},
		{"meta_l", 125, 0xe05b}, {"kp_enter", 96, 0xe01c}, {"bogus", 0, 0},
	}
	for _, tt := range tests {
		if got := tt.key.Linux(); got != tt.linux {
			t.Errorf("Key(%q).Linux() = %d; want %d", tt.key, got, tt.linux)
		}
		if got := tt.key.XT(); got != tt.xt {
			t.Errorf("Key(%q).XT() = %#x; want %#x", tt.key, got, tt.xt)
		}
	}
}
