package runtime

import (
	"errors"
	"reflect"
	"testing"

	"github.com/airlock-mcp/airlock/runtime/driver"
)

func TestCheckOverlay(t *testing.T) {
	cases := []struct {
		name      string
		env, home map[string]string
		want      error
	}{
		{"none", nil, nil, nil},
		{"fine", map[string]string{"AIRLOCK_TEST_X": "v1", "GITHUB_TOKEN": "t"}, map[string]string{".netrc": "machine x"}, nil},
		{"bad name", map[string]string{"A-B": "v"}, nil, driver.ErrBadEnv},
		{"HOME is airlock's", map[string]string{"HOME": "/tmp"}, nil, driver.ErrBadEnv},
		{"PATH is airlock's", map[string]string{"PATH": "/x"}, nil, driver.ErrBadEnv},
		{"the proxy's", map[string]string{"https_proxy": "http://elsewhere"}, nil, driver.ErrBadEnv},
		{"the CA bundle's", map[string]string{"SSL_CERT_FILE": "/x"}, nil, driver.ErrBadEnv},
		{"home file in a directory", nil, map[string]string{".ssh/config": "x"}, driver.ErrBadHomeFile},
		{"home file above home", nil, map[string]string{"..": "x"}, driver.ErrBadHomeFile},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckOverlay(c.env, c.home)
			if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
				t.Errorf("CheckOverlay = %v, want %v", err, c.want)
			}
		})
	}
}

func TestOverlayRequest(t *testing.T) {
	sess := map[string]string{"A": "session", "B": "session"}
	files := map[string]string{".netrc": "session"}
	got := OverlayRequest(Request{Code: "x", Env: map[string]string{"B": "call", "C": "call"}}, sess, files)
	if want := map[string]string{"A": "session", "B": "call", "C": "call"}; !reflect.DeepEqual(got.Env, want) {
		t.Errorf("Env = %v, want %v", got.Env, want)
	}
	if !reflect.DeepEqual(got.HomeFiles, files) || got.Code != "x" {
		t.Errorf("HomeFiles = %v, Code %q", got.HomeFiles, got.Code)
	}
	if sess["B"] != "session" {
		t.Error("OverlayRequest changed the session's map")
	}
	if got := OverlayRequest(Request{}, nil, nil); got.Env != nil || got.HomeFiles != nil {
		t.Errorf("nothing to overlay: %+v", got)
	}
}
