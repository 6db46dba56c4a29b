package runtime

import (
	"strings"
	"testing"
)

func TestCappedBuffer(t *testing.T) {
	cases := []struct {
		name      string
		max       int
		writes    []string
		want      string
		truncated bool
	}{
		{"under", 10, []string{"abc", "de"}, "abcde", false},
		{"exact", 5, []string{"abcde"}, "abcde", false},
		{"split write", 4, []string{"ab", "cdef"}, "abcd", true},
		{"past cap", 3, []string{"abc", "d", "efgh"}, "abc", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := NewCappedBuffer(c.max, nil)
			for _, w := range c.writes {
				n, err := b.Write([]byte(w))
				if n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil so the producer never blocks", w, n, err, len(w))
				}
			}
			got, tr := b.Result()
			if got != c.want || tr != c.truncated {
				t.Errorf("got %q truncated=%v, want %q %v", got, tr, c.want, c.truncated)
			}
		})
	}
}

func TestCappedBufferBoundsMemory(t *testing.T) {
	b := NewCappedBuffer(1024, nil)
	chunk := []byte(strings.Repeat("x", 64<<10))
	for i := 0; i < 256; i++ { // 16 MiB written
		_, _ = b.Write(chunk)
	}
	if b.buf.Cap() > 128<<10 {
		t.Errorf("buffer grew to %d bytes for a 1 KiB cap", b.buf.Cap())
	}
}

func TestBuildEnvIsAllowListOnly(t *testing.T) {
	t.Setenv("AIRLOCK_SECRET_TOKEN", "hunter2")
	env := BuildEnv(map[string]string{"EXTRA": "1", "HOME": "/elsewhere"})
	joined := strings.Join(env, "\n")
	if strings.Contains(joined, "hunter2") || strings.Contains(joined, "AIRLOCK_SECRET") {
		t.Fatal("server environment leaked into the sandbox")
	}
	for _, want := range []string{"EXTRA=1", "HOME=/elsewhere", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"} {
		if !strings.Contains(joined, want) {
			t.Errorf("env lacks %s: %v", want, env)
		}
	}
}

func TestCappedBufferTapSeesOnlyKept(t *testing.T) {
	var seen []byte
	b := NewCappedBuffer(5, func(p []byte) { seen = append(seen, p...) })
	_, _ = b.Write([]byte("abc"))
	_, _ = b.Write([]byte("defgh"))
	_, _ = b.Write([]byte("ij"))
	if string(seen) != "abcde" {
		t.Errorf("tap saw %q, want the 5 kept bytes", seen)
	}
}
