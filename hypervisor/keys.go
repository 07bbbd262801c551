package hypervisor

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The key model every KeySender shares. Keys are named as QEMU names them
// (its QKeyCode enum, qapi/ui.json: "ctrl", "alt", "delete", "f1", "ret"),
// the canonical set; a combination is written with "-" between its keys
// ("ctrl-alt-delete"), as QEMU's HMP sendkey and Proxmox's sendkey take
// it. Text is typed through a named keymap (US for now): each character
// becomes the key press that types it, with shift where it needs it, and a
// character the keymap cannot type is refused, naming it, before any key
// is pressed. Each backend turns keys into its own codes: QEMU and
// Proxmox take the names, libvirt the Linux input codes (Key.Linux),
// VirtualBox PC XT scan codes (Key.XT).

// Key is one key by its canonical (QKeyCode) name.
type Key string

// KeyCombo is keys pressed together: each is pressed in order, then all
// are released in reverse order.
type KeyCombo []Key

// String writes c as ParseKeyCombo reads it.
func (c KeyCombo) String() string {
	s := make([]string, len(c))
	for i, k := range c {
		s[i] = string(k)
	}
	return strings.Join(s, "-")
}

// Limits of a KeysRequest.
const (
	// MaxKeyCombos bounds KeysRequest.Combos.
	MaxKeyCombos = 64
	// MaxKeysPerCombo bounds the keys of one combination.
	MaxKeysPerCombo = 8
	// MaxTypedText bounds KeysRequest.Text, in characters.
	MaxTypedText = 1024
	// maxComboText bounds a combination as written.
	maxComboText = 128
)

// DefaultKeymap is the keymap text is typed with when a request names none.
const DefaultKeymap = "us"

// keyInfo is what the backends need of a key: its Linux input event code
// (include/uapi/linux/input-event-codes.h, libvirt's KEYCODE_SET_LINUX)
// and its PC XT set 1 make code (0xe0nn for the extended keys, which send
// 0xe0 first; the break code is the make code with 0x80 set).
type keyInfo struct {
	linux uint16
	xt    uint16
}

// keyTable holds every key a combination may name. It is the keys the
// four backends can all press; QEMU's QKeyCode has more (media keys, the
// Japanese keys), which no backend's conversion here would carry.
var keyTable = map[Key]keyInfo{
	"esc": {1, 0x01}, "1": {2, 0x02}, "2": {3, 0x03}, "3": {4, 0x04}, "4": {5, 0x05}, "5": {6, 0x06},
	"6": {7, 0x07}, "7": {8, 0x08}, "8": {9, 0x09}, "9": {10, 0x0a}, "0": {11, 0x0b},
	"minus": {12, 0x0c}, "equal": {13, 0x0d}, "backspace": {14, 0x0e}, "tab": {15, 0x0f},
	"q": {16, 0x10}, "w": {17, 0x11}, "e": {18, 0x12}, "r": {19, 0x13}, "t": {20, 0x14},
	"y": {21, 0x15}, "u": {22, 0x16}, "i": {23, 0x17}, "o": {24, 0x18}, "p": {25, 0x19},
	"bracket_left": {26, 0x1a}, "bracket_right": {27, 0x1b}, "ret": {28, 0x1c}, "ctrl": {29, 0x1d},
	"a": {30, 0x1e}, "s": {31, 0x1f}, "d": {32, 0x20}, "f": {33, 0x21}, "g": {34, 0x22},
	"h": {35, 0x23}, "j": {36, 0x24}, "k": {37, 0x25}, "l": {38, 0x26},
	"semicolon": {39, 0x27}, "apostrophe": {40, 0x28}, "grave_accent": {41, 0x29}, "shift": {42, 0x2a},
	"backslash": {43, 0x2b}, "z": {44, 0x2c}, "x": {45, 0x2d}, "c": {46, 0x2e}, "v": {47, 0x2f},
	"b": {48, 0x30}, "n": {49, 0x31}, "m": {50, 0x32}, "comma": {51, 0x33}, "dot": {52, 0x34},
	"slash": {53, 0x35}, "shift_r": {54, 0x36}, "kp_multiply": {55, 0x37}, "alt": {56, 0x38},
	"spc": {57, 0x39}, "caps_lock": {58, 0x3a},
	"f1": {59, 0x3b}, "f2": {60, 0x3c}, "f3": {61, 0x3d}, "f4": {62, 0x3e}, "f5": {63, 0x3f},
	"f6": {64, 0x40}, "f7": {65, 0x41}, "f8": {66, 0x42}, "f9": {67, 0x43}, "f10": {68, 0x44},
	"num_lock": {69, 0x45}, "scroll_lock": {70, 0x46},
	"kp_7": {71, 0x47}, "kp_8": {72, 0x48}, "kp_9": {73, 0x49}, "kp_subtract": {74, 0x4a},
	"kp_4": {75, 0x4b}, "kp_5": {76, 0x4c}, "kp_6": {77, 0x4d}, "kp_add": {78, 0x4e},
	"kp_1": {79, 0x4f}, "kp_2": {80, 0x50}, "kp_3": {81, 0x51}, "kp_0": {82, 0x52}, "kp_decimal": {83, 0x53},
	"less": {86, 0x56}, "f11": {87, 0x57}, "f12": {88, 0x58},
	"kp_enter": {96, 0xe01c}, "ctrl_r": {97, 0xe01d}, "kp_divide": {98, 0xe035}, "alt_r": {100, 0xe038},
	"home": {102, 0xe047}, "up": {103, 0xe048}, "pgup": {104, 0xe049}, "left": {105, 0xe04b},
	"right": {106, 0xe04d}, "end": {107, 0xe04f}, "down": {108, 0xe050}, "pgdn": {109, 0xe051},
	"insert": {110, 0xe052}, "delete": {111, 0xe053},
	"meta_l": {125, 0xe05b}, "meta_r": {126, 0xe05c}, "menu": {127, 0xe05d},
}

// keyAliases are other names ParseKeyCombo takes for a key.
var keyAliases = map[string]Key{
	"enter": "ret", "return": "ret", "space": "spc", "escape": "esc", "del": "delete",
	"control": "ctrl", "super": "meta_l", "win": "meta_l", "altgr": "alt_r",
	"pageup": "pgup", "pagedown": "pgdn", "ins": "insert", "asterisk": "kp_multiply",
}

// Valid reports whether k is a key of the model.
func (k Key) Valid() bool {
	_, ok := keyTable[k]
	return ok
}

// Linux is k's Linux input event code (0 for an unknown key).
func (k Key) Linux() uint16 { return keyTable[k].linux }

// XT is k's PC XT set 1 make code, 0xe0nn for an extended key (0 for an
// unknown key).
func (k Key) XT() uint16 { return keyTable[k].xt }

// ParseKeyCombo reads a combination written as key names joined by "-"
// ("ctrl-alt-delete", "alt-f2", "enter"). Names are ASCII, case does not
// matter, and the aliases (enter, space, escape, del, ...) are taken.
func ParseKeyCombo(s string) (KeyCombo, error) {
	if len(s) > maxComboText {
		return nil, fmt.Errorf("keys: %w: combination of %d bytes, at most %d", ErrInvalidArgument, len(s), maxComboText)
	}
	if s == "" {
		return nil, fmt.Errorf("keys: %w: empty key combination", ErrInvalidArgument)
	}
	names := strings.Split(s, "-")
	if len(names) > MaxKeysPerCombo {
		return nil, fmt.Errorf("keys: %w: %q has %d keys, at most %d", ErrInvalidArgument, s, len(names), MaxKeysPerCombo)
	}
	combo := make(KeyCombo, 0, len(names))
	for _, n := range names {
		k, err := keyByName(n)
		if err != nil {
			return nil, fmt.Errorf("keys: %w: in %q: %w", ErrInvalidArgument, s, err)
		}
		combo = append(combo, k)
	}
	if err := combo.check(); err != nil {
		return nil, err
	}
	return combo, nil
}

// keyByName resolves one name of a combination.
func keyByName(n string) (Key, error) {
	if n == "" {
		return "", fmt.Errorf("an empty key name (a doubled, leading or trailing \"-\"; the - key is \"minus\")")
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("key name %q has a character outside printable ASCII", n)
		}
	}
	low := strings.ToLower(n)
	if k, ok := keyAliases[low]; ok {
		return k, nil
	}
	if k := Key(low); k.Valid() {
		return k, nil
	}
	return "", fmt.Errorf("unknown key %q (key names are QEMU's: ctrl, alt, shift, delete, ret, spc, esc, tab, f1..f12, a..z, 0..9, up, pgdn, ...)", n)
}

// check: every key known, none twice, not too many.
func (c KeyCombo) check() error {
	if len(c) == 0 {
		return fmt.Errorf("keys: %w: empty key combination", ErrInvalidArgument)
	}
	if len(c) > MaxKeysPerCombo {
		return fmt.Errorf("keys: %w: %d keys in one combination, at most %d", ErrInvalidArgument, len(c), MaxKeysPerCombo)
	}
	for i, k := range c {
		if !k.Valid() {
			return fmt.Errorf("keys: %w: unknown key %q", ErrInvalidArgument, string(k))
		}
		if slices.Contains(c[:i], k) {
			return fmt.Errorf("keys: %w: %q names %s twice", ErrInvalidArgument, c.String(), k)
		}
	}
	return nil
}

// KeysRequest is what SendKeys takes: key combinations, or text typed with
// a keymap.
type KeysRequest struct {
	// Combos are pressed one after another.
	Combos []KeyCombo `json:"combos,omitempty"`
	// Text is typed character by character through Keymap.
	Text string `json:"text,omitempty"`
	// Keymap names the layout Text is typed with; empty means DefaultKeymap.
	// It must be empty when Text is.
	Keymap string `json:"keymap,omitempty"`
}

// Validate checks r without side effects (Presses does too).
func (r KeysRequest) Validate() error {
	_, err := r.Presses()
	return err
}

// Presses checks r and returns the key combinations it presses, in order:
// Combos as given, or one combination per character of Text ("shift-a"
// for "A"). Nothing is returned unless all of r is good.
func (r KeysRequest) Presses() ([]KeyCombo, error) {
	switch {
	case len(r.Combos) > 0 && r.Text != "":
		return nil, fmt.Errorf("keys: %w: give key combinations or text, not both", ErrInvalidArgument)
	case len(r.Combos) == 0 && r.Text == "":
		return nil, fmt.Errorf("keys: %w: no key combination and no text", ErrInvalidArgument)
	case r.Text == "" && r.Keymap != "":
		return nil, fmt.Errorf("keys: %w: a keymap is for text; key combinations name keys", ErrInvalidArgument)
	case len(r.Combos) > MaxKeyCombos:
		return nil, fmt.Errorf("keys: %w: %d key combinations, at most %d", ErrInvalidArgument, len(r.Combos), MaxKeyCombos)
	}
	if r.Text == "" {
		out := make([]KeyCombo, len(r.Combos))
		for i, c := range r.Combos {
			if err := c.check(); err != nil {
				return nil, fmt.Errorf("combination %d: %w", i+1, err)
			}
			out[i] = slices.Clone(c)
		}
		return out, nil
	}
	km, err := keymapByName(r.Keymap)
	if err != nil {
		return nil, err
	}
	return km.typeText(r.Text)
}

// keymap is a layout: which key, with or without shift, types a character.
type keymap struct {
	name  string
	plain map[rune]Key // typed by the key alone
	shift map[rune]Key // typed with shift held
}

// keymaps are the layouts text can be typed with.
var keymaps = map[string]*keymap{"us": usKeymap()}

// keymapByName finds a layout; "" is DefaultKeymap, and "en-us" names US.
func keymapByName(name string) (*keymap, error) {
	switch name {
	case "":
		name = DefaultKeymap
	case "en-us":
		name = "us"
	}
	km, ok := keymaps[name]
	if !ok {
		known := make([]string, 0, len(keymaps))
		for n := range keymaps {
			known = append(known, n)
		}
		slices.Sort(known)
		return nil, fmt.Errorf("keys: %w: unknown keymap %q (known: %s)", ErrInvalidArgument, name, strings.Join(known, ", "))
	}
	return km, nil
}

// usKeymap is the US layout: what a US keyboard types without AltGr.
func usKeymap() *keymap {
	km := &keymap{name: "us", plain: map[rune]Key{' ': "spc", '\n': "ret", '\t': "tab"}, shift: map[rune]Key{}}
	for c := 'a'; c <= 'z'; c++ {
		km.plain[c] = Key(string(c))
		km.shift[c-'a'+'A'] = Key(string(c))
	}
	for c := '0'; c <= '9'; c++ {
		km.plain[c] = Key(string(c))
	}
	for i, c := range ")!@#$%^&*(" {
		km.shift[c] = Key(string(rune('0' + i)))
	}
	for _, p := range []struct {
		plain, shifted rune
		key            Key
	}{
		{'-', '_', "minus"}, {'=', '+', "equal"}, {'[', '{', "bracket_left"}, {']', '}', "bracket_right"},
		{'\\', '|', "backslash"}, {';', ':', "semicolon"}, {'\'', '"', "apostrophe"}, {'`', '~', "grave_accent"},
		{',', '<', "comma"}, {'.', '>', "dot"}, {'/', '?', "slash"},
	} {
		km.plain[p.plain], km.shift[p.shifted] = p.key, p.key
	}
	return km
}

// typeText turns text into key presses, refusing the first character the
// layout cannot type (invalid UTF-8, control characters other than
// newline and tab, anything beyond the layout).
func (km *keymap) typeText(text string) ([]KeyCombo, error) {
	if n := utf8.RuneCountInString(text); n > MaxTypedText {
		return nil, fmt.Errorf("keys: %w: text of %d characters, at most %d", ErrInvalidArgument, n, MaxTypedText)
	}
	out := make([]KeyCombo, 0, len(text))
	for i, r := range text {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(text[i:]); size <= 1 {
				return nil, fmt.Errorf("keys: %w: text is not valid UTF-8 at byte %d", ErrInvalidArgument, i)
			}
		}
		if k, ok := km.plain[r]; ok {
			out = append(out, KeyCombo{k})
			continue
		}
		if k, ok := km.shift[r]; ok {
			out = append(out, KeyCombo{"shift", k})
			continue
		}
		return nil, fmt.Errorf("keys: %w: the %s keymap cannot type %s at byte %d of the text%s",
			ErrInvalidArgument, km.name, describeRune(r), i, hint(r))
	}
	return out, nil
}

// describeRune names a character so that a control character or an
// invisible one reads as what it is.
func describeRune(r rune) string {
	if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || !isGraphic(r) {
		return fmt.Sprintf("U+%04X", r)
	}
	return fmt.Sprintf("U+%04X %q", r, r)
}

// isGraphic is unicode.IsGraphic without the spaces other than U+0020, so
// that a no-break space is named by its number (format characters such as
// a zero-width space or a bidi override are not graphic already).
func isGraphic(r rune) bool {
	return r == ' ' || (unicode.IsGraphic(r) && !unicode.Is(unicode.Zs, r))
}

// hint says what to send instead of a control character a person would
// press a key for.
func hint(r rune) string {
	switch r {
	case '\r':
		return " (write \\n for Enter)"
	case 0x1b:
		return " (send the key combination \"esc\" for Escape; escape sequences are not typed)"
	case 0x08, 0x7f:
		return " (send the key combination \"backspace\")"
	}
	if r >= 1 && r <= 26 {
		return fmt.Sprintf(" (send the key combination \"ctrl-%c\" for Ctrl+%c)", r+'a'-1, r+'A'-1)
	}
	return ""
}
