package local

import (
	"testing"
)

func TestRunscBundle(t *testing.T) {
	cases := []struct {
		args   []string
		ns, id string
		ok     bool
	}{
		{[]string{"runsc-sandbox", "--root=/run/x", "boot", "--bundle=/s/io.containerd.runtime.v2.task/airlock/airlock-w1", "airlock-w1"}, "airlock", "airlock-w1", true},
		{[]string{"runsc-gofer", "gofer", "--bundle", "/s/io.containerd.runtime.v2.task/airlock/airlock-2", "--spec-fd=4"}, "airlock", "airlock-2", true},
		{[]string{"/usr/local/bin/runsc", "--root=/r", "boot", "--bundle=/b/default/web"}, "default", "web", true},
		{[]string{"sleep", "--bundle=/b/airlock/airlock-3"}, "", "", false},
		{[]string{"runsc-sandbox", "boot"}, "", "", false},
		{[]string{"runsc"}, "", "", false},
	}
	for _, c := range cases {
		ns, id, ok := runscBundle(c.args)
		if ns != c.ns || id != c.id || ok != c.ok {
			t.Errorf("runscBundle(%q) = %q, %q, %v; want %q, %q, %v", c.args, ns, id, ok, c.ns, c.id, c.ok)
		}
	}
}
