package driver

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestCheckEnv(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"none", nil, true},
		{"plain", map[string]string{"AIRLOCK_TEST_X": "v1"}, true},
		{"lower case and underscore first", map[string]string{"_x1": "", "token": "a b=c"}, true},
		{"utf-8 value", map[string]string{"GREETING": "grüß dich"}, true},
		{"empty name", map[string]string{"": "v"}, false},
		{"starts with a digit", map[string]string{"1X": "v"}, false},
		{"equals sign", map[string]string{"A=B": "v"}, false},
		{"NUL in the name", map[string]string{"A\x00B": "v"}, false},
		{"dash", map[string]string{"MY-VAR": "v"}, false},
		{"dot", map[string]string{"my.var": "v"}, false},
		{"space", map[string]string{"MY VAR": "v"}, false},
		{"non-ASCII name", map[string]string{"VÄR": "v"}, false},
		{"NUL in the value", map[string]string{"X": "a\x00b"}, false},
		{"invalid UTF-8 value", map[string]string{"X": "\xff"}, false},
		{"too large", map[string]string{"X": strings.Repeat("v", MaxEnvBytes)}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckEnv(c.env)
			if c.ok && err != nil {
				t.Errorf("CheckEnv(%q) = %v, want nil", c.env, err)
			}
			if !c.ok && !errors.Is(err, ErrBadEnv) {
				t.Errorf("CheckEnv(%q) = %v, want ErrBadEnv", c.env, err)
			}
		})
	}
}

func TestCheckHomeFile(t *testing.T) {
	cases := []struct {
		name string
		ok   bool
	}{
		{".netrc", true},
		{"config.json", true},
		{"..hidden", true},
		{"", false},
		{".", false},
		{"..", false},
		{"a/b", false},
		{"../x", false},
		{"/etc/passwd", false},
		{"./x", false},
		{"x/", false},
		{"a\x00b", false},
		{"\xff", false},
		{strings.Repeat("n", MaxComponentBytes+1), false},
	}
	for _, c := range cases {
		err := CheckHomeFile(c.name)
		if c.ok && err != nil {
			t.Errorf("CheckHomeFile(%q) = %v, want nil", c.name, err)
		}
		if !c.ok && !errors.Is(err, ErrBadHomeFile) {
			t.Errorf("CheckHomeFile(%q) = %v, want ErrBadHomeFile", c.name, err)
		}
	}
}

func TestOverlayEnv(t *testing.T) {
	base := []string{"PATH=/bin", "HOME=/workspace", "X=old", "X=older"}
	got := overlayEnv(base, map[string]string{"X": "new", "B": "b", "A": "a=1"})
	want := []string{"PATH=/bin", "HOME=/workspace", "A=a=1", "B=b", "X=new"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("overlayEnv = %q, want %q", got, want)
	}
	if got := overlayEnv(base, nil); !reflect.DeepEqual(got, base) {
		t.Errorf("overlayEnv with nothing = %q, want the base", got)
	}
}
