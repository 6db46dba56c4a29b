package guardian

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestWait(t *testing.T) {
	for _, tc := range []struct {
		in    string
		clean bool
	}{
		{"", false},
		{"done\n", true},
		{"done", true},
		{"  done  \n", true},
		{"don", false},
		{"undone\n", false},
		{"noise\ndone\n", true},
		{strings.Repeat("x", 10000) + "\ndone\n", false}, // past the bound: not read
	} {
		clean, _ := Wait(strings.NewReader(tc.in))
		if clean != tc.clean {
			t.Errorf("Wait(%.20q) = %v, want %v", tc.in, clean, tc.clean)
		}
	}
}

// The guardian here is a shell that logs what it read and its session:
// what matters is what reaches it, and that it is in a session of its own.
func startShell(t *testing.T) (*Guardian, string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "guardian.log")
	g, err := Start("/bin/sh", []string{"-c", `read -r l; echo "read:$l"; echo "sid:$(cut -d' ' -f6 /proc/self/stat)"`}, log)
	if err != nil {
		t.Fatal(err)
	}
	return g, log
}

func waitLog(t *testing.T, log string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(log)
		if strings.Contains(string(b), "sid:") || time.Now().After(deadline) {
			return string(b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDoneAndHandOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(*Guardian) error
		want string
	}{
		{"done", (*Guardian).Done, "read:done\n"},
		{"hand off", (*Guardian).HandOff, "read:\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, log := startShell(t)
			if g.PID() <= 0 {
				t.Fatalf("pid %d", g.PID())
			}
			if err := tc.end(g); err != nil {
				t.Fatal(err)
			}
			got := waitLog(t, log)
			if !strings.HasPrefix(got, tc.want) {
				t.Fatalf("guardian read %q, want %q first", got, tc.want)
			}
			// Its own session: a signal to this process's group or session
			// does not reach it.
			if strings.Contains(got, "sid:"+itoa(unix.Getpid())) {
				t.Fatalf("guardian shares this process's session: %q", got)
			}
			if !strings.Contains(got, "sid:"+itoa(g.PID())) {
				t.Fatalf("guardian is not its session's leader: %q", got)
			}
			// A second end is a no-op.
			if err := tc.end(g); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestNilGuardian(t *testing.T) {
	var g *Guardian
	if g.PID() != 0 || g.Done() != nil || g.HandOff() != nil {
		t.Fatal("a nil guardian must be a no-op")
	}
}
