package approval

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLineDisplay is the number of display characters a rendered line may
// hold before it is wrapped onto a continuation line marked WrapMarker;
// beyond it a reviewer would have to scroll, which is where Trojan code likes
// to hide. Wrapping rather than cutting means nothing is ever hidden from
// the person who approves.
const MaxLineDisplay = 500

// WrapMarker starts each continuation line of a wrapped long line.
const WrapMarker = "⟦↪⟧ "

// maxBlankRun is the longest run of blank lines shown as is; longer runs are
// collapsed so code cannot be pushed out of view by whitespace.
const maxBlankRun = 3

// Warning texts, one per kind of hidden content; exported as constants so
// channels and tests can match on them without copying strings.
const (
	WarnBidi       = "bidi control characters"
	WarnZeroWidth  = "zero-width characters"
	WarnCR         = "carriage return without newline"
	WarnNUL        = "NUL characters"
	WarnControl    = "control characters"
	WarnInvisible  = "other invisible or non-printable characters"
	WarnInvalidUTF = "invalid UTF-8"
	WarnBlankLines = "more than 3 consecutive blank lines"
	WarnLongLines  = "lines longer than 500 characters (wrapped, continuations marked ⟦↪⟧)"
)

// Rendered is code prepared for a human to approve: every character that
// could make the code read differently from how it runs is spelled out, and
// nothing is cut.
type Rendered struct {
	// Text is the code with invisible and control characters made visible.
	// It holds only printable runes, '\n' and '\t'.
	Text string
	// Numbered is Text with a gutter before every line: the code's line
	// number, "┆" on a continuation of a wrapped line, the range of a
	// collapsed run of blank lines. No line of it starts at column 0 with
	// anything but the gutter, so no line of code can pass for a line of
	// the frame a channel draws around it.
	Numbered string
	// Lines is the number of lines of the original code, so the reviewer can
	// tell when the display collapsed blank lines or wrapped long ones.
	Lines int
	// Warnings names each kind of hidden content found, once, in the order
	// first seen, so a channel can put them above the code.
	Warnings []string
}

// Gutter characters of Rendered.Numbered.
const (
	gutterLine = "│ "
	gutterWrap = "┆ "
)

// displayLine is one line of the display and where it came from.
type displayLine struct {
	first, last int // code line numbers, 1-based; last > first for a collapsed run
	wrapped     bool
	text        string
}

// bidiNames are the Unicode bidirectional controls used in Trojan-source
// attacks (CVE-2021-42574).
var bidiNames = map[rune]string{
	0x061C: "ARABIC LETTER MARK",
	0x200E: "LEFT-TO-RIGHT MARK",
	0x200F: "RIGHT-TO-LEFT MARK",
	0x202A: "LEFT-TO-RIGHT EMBEDDING",
	0x202B: "RIGHT-TO-LEFT EMBEDDING",
	0x202C: "POP DIRECTIONAL FORMATTING",
	0x202D: "LEFT-TO-RIGHT OVERRIDE",
	0x202E: "RIGHT-TO-LEFT OVERRIDE",
	0x2066: "LEFT-TO-RIGHT ISOLATE",
	0x2067: "RIGHT-TO-LEFT ISOLATE",
	0x2068: "FIRST STRONG ISOLATE",
	0x2069: "POP DIRECTIONAL ISOLATE",
}

// zeroWidthNames are characters that take no space, used to make two
// identifiers that look equal differ.
var zeroWidthNames = map[rune]string{
	0x200B: "ZERO WIDTH SPACE",
	0x200C: "ZERO WIDTH NON-JOINER",
	0x200D: "ZERO WIDTH JOINER",
	0x2060: "WORD JOINER",
	0xFEFF: "ZERO WIDTH NO-BREAK SPACE",
}

// blankLooking are printable characters (letters or symbols to Unicode)
// that most fonts draw as empty space: a line of them looks blank, which
// is how a long program hides below a short one.
var blankLooking = map[rune]string{
	0x115F: "HANGUL CHOSEONG FILLER",
	0x1160: "HANGUL JUNGSEONG FILLER",
	0x17B4: "KHMER VOWEL INHERENT AQ",
	0x17B5: "KHMER VOWEL INHERENT AA",
	0x2800: "BRAILLE PATTERN BLANK",
	0x3164: "HANGUL FILLER",
	0xFFA0: "HALFWIDTH HANGUL FILLER",
}

// token is the display of one input character; the line cutter needs to
// know where each input character starts so it never splits a marker.
type token struct {
	text  string
	width int
}

// Render returns code as a reviewer should see it. It never drops content:
// long runs of blank lines collapse to a marker that says how many, long
// lines wrap onto marked continuation lines, and a warning names each.
func Render(code string) Rendered {
	var (
		display  []displayLine
		warnings []string
		seen     = map[string]bool{}
	)
	warn := func(w string) {
		if !seen[w] {
			seen[w] = true
			warnings = append(warnings, w)
		}
	}

	// Split into lines first; a CR-LF pair is an ordinary newline, a lone CR
	// stays inside its line and is escaped below.
	raw := strings.Split(code, "\n")
	if strings.HasSuffix(code, "\n") {
		raw = raw[:len(raw)-1]
	}
	lines := len(raw)
	if code == "" {
		lines = 0
		raw = nil
	}

	blankRun, blankFrom := 0, 0
	flushBlanks := func() {
		if blankRun > maxBlankRun {
			display = append(display, displayLine{first: blankFrom, last: blankFrom + blankRun - 1, text: fmt.Sprintf("⟦%d blank lines⟧", blankRun)})
			warn(WarnBlankLines)
		} else {
			for i := 0; i < blankRun; i++ {
				display = append(display, displayLine{first: blankFrom + i, last: blankFrom + i})
			}
		}
		blankRun = 0
	}

	for i, line := range raw {
		if i < len(raw)-1 || strings.HasSuffix(code, "\n") {
			// Only a CR right before a newline is part of a CR-LF pair.
			line = strings.TrimSuffix(line, "\r")
		}
		if strings.Trim(line, " \t") == "" {
			// Whitespace-only lines hide nothing but vertical space; keep a
			// blank line blank so the count is exact.
			if blankRun == 0 {
				blankFrom = i + 1
			}
			blankRun++
			continue
		}
		flushBlanks()
		for j, part := range renderLine(line, warn) {
			display = append(display, displayLine{first: i + 1, last: i + 1, wrapped: j > 0, text: part})
		}
	}
	flushBlanks()

	var text, numbered strings.Builder
	width := len(strconv.Itoa(max(lines, 1)))
	for i, d := range display {
		if i > 0 {
			text.WriteByte('\n')
			numbered.WriteByte('\n')
		}
		switch {
		case d.wrapped:
			text.WriteString(WrapMarker)
			fmt.Fprintf(&numbered, "%*s%s", width, "", gutterWrap)
		case d.last > d.first:
			fmt.Fprintf(&numbered, "%*s%s", width, fmt.Sprintf("%d-%d", d.first, d.last), gutterLine)
		default:
			fmt.Fprintf(&numbered, "%*d%s", width, d.first, gutterLine)
		}
		text.WriteString(d.text)
		numbered.WriteString(d.text)
	}
	if strings.HasSuffix(code, "\n") && len(display) > 0 {
		text.WriteByte('\n')
	}
	return Rendered{Text: text.String(), Numbered: numbered.String(), Lines: lines, Warnings: warnings}
}

// renderLine escapes one line (without its newline) and cuts it every
// MaxLineDisplay display characters, never inside an escape marker; the
// parts after the first are continuations.
func renderLine(line string, warn func(string)) []string {
	var (
		parts []string
		b     strings.Builder
	)
	width := 0
	for i := 0; i < len(line); {
		r, size := utf8.DecodeRuneInString(line[i:])
		var t token
		if r == utf8.RuneError && size == 1 {
			warn(WarnInvalidUTF)
			t = marker(fmt.Sprintf("⟦invalid UTF-8 0x%02X⟧", line[i]))
		} else {
			t = escapeRune(r, warn)
		}
		i += size
		if width > 0 && width+t.width > MaxLineDisplay {
			warn(WarnLongLines)
			parts = append(parts, b.String())
			b.Reset()
			width = utf8.RuneCountInString(WrapMarker)
		}
		b.WriteString(t.text)
		width += t.width
	}
	return append(parts, b.String())
}

// escapeRune returns the display of one character, warning about its kind
// when it is not shown as itself.
func escapeRune(r rune, warn func(string)) token {
	switch {
	case r == '\t':
		return token{"\t", 1}
	case r == '\r':
		warn(WarnCR)
		return marker("⟦CR⟧")
	case r == 0:
		warn(WarnNUL)
		return marker("⟦NUL⟧")
	case bidiNames[r] != "":
		warn(WarnBidi)
		return marker(fmt.Sprintf("⟦U+%04X %s⟧", r, bidiNames[r]))
	case zeroWidthNames[r] != "":
		warn(WarnZeroWidth)
		return marker(fmt.Sprintf("⟦U+%04X %s⟧", r, zeroWidthNames[r]))
	case blankLooking[r] != "":
		warn(WarnInvisible)
		return marker(fmt.Sprintf("⟦U+%04X %s⟧", r, blankLooking[r]))
	case r < 0x20 || (r >= 0x7F && r <= 0x9F):
		warn(WarnControl)
		return marker(fmt.Sprintf("⟦U+%04X⟧", r))
	case !unicode.IsPrint(r):
		// Format characters, tag characters, non-ASCII spaces, line and
		// paragraph separators, unassigned code points: anything a terminal
		// may draw as nothing or as something else.
		warn(WarnInvisible)
		return marker(fmt.Sprintf("⟦U+%04X⟧", r))
	default:
		return token{string(r), 1}
	}
}

// marker makes a token whose width is its length in runes, so a line made
// of escapes is cut as soon as a plain one would be.
func marker(s string) token {
	return token{s, utf8.RuneCountInString(s)}
}
