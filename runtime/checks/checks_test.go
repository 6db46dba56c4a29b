package checks

import (
	"strings"
	"testing"
)

func TestPrint(t *testing.T) {
	for _, c := range []struct {
		name   string
		checks []Check
		wantOK bool
		want   []string
		absent []string
	}{
		{"all ok", []Check{{Name: "a", OK: true, Detail: "fine", Fix: "unused"}}, true,
			[]string{"ok   a            fine"}, []string{"fix:"}},
		{"a failure fails, with its fix", []Check{{Name: "a", OK: true}, {Name: "b", Detail: "broken", Fix: "mend it"}}, false,
			[]string{"FAIL b            broken", "fix: mend it"}, nil},
		{"a warning passes, with its fix", []Check{{Name: "c", Warn: true, Detail: "shaky", Fix: "brace it"}}, true,
			[]string{"WARN c            shaky", "fix: brace it"}, []string{"FAIL"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			if got := Print(&b, c.checks); got != c.wantOK {
				t.Errorf("Print = %v, want %v", got, c.wantOK)
			}
			for _, w := range c.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			for _, a := range c.absent {
				if strings.Contains(b.String(), a) {
					t.Errorf("output has %q:\n%s", a, b.String())
				}
			}
		})
	}
}
