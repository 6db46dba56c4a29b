package network

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-mcp/airlock/runtime/netns/netnstest"
)

// dialerSource is a static program run inside the gVisor sandbox: it dials
// each address given and prints "<addr> OK" or "<addr> FAIL <error>".
const dialerSource = `package main

import (
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	for _, a := range os.Args[1:] {
		c, err := net.DialTimeout("tcp4", a, 2*time.Second)
		if err != nil {
			fmt.Printf("%s FAIL %v\n", a, err)
			continue
		}
		c.Close()
		fmt.Printf("%s OK\n", a)
	}
}
`

// TestGVisorSandbox runs real code under runsc in an attached namespace:
// gVisor's own network stack (its ARP included) must reach the proxy
// through the anti-spoofing and isolation rules, and nothing else.
func TestGVisorSandbox(t *testing.T) {
	e := newEnv(t)
	skip := t.Skipf
	if os.Getenv("CI") == "true" {
		skip = t.Fatalf
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		skip("runsc not installed")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		skip("go toolchain not found to build the in-sandbox dialer")
	}
	m := e.manager(t, randHex(t, 4))
	if err := m.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	att := attach(t, m, "gvisor")
	gw := att.Gateway
	proxy := netnstest.ListenTCP(t, "", m.Config().ProxyAddr().String())
	other := netnstest.ListenTCP(t, "", netip.AddrPortFrom(gw, 8080).String())
	targets := []string{proxy.Addr, other.Addr}
	var host *netnstest.Counter
	if ha, ok := hostAddr(t, e); ok {
		host = netnstest.ListenTCP(t, "", netip.AddrPortFrom(ha, 0).String())
		targets = append(targets, host.Addr)
	}

	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	rootfs := filepath.Join(dir, "bundle", "rootfs")
	for _, d := range []string{src, rootfs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(dialerSource), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module dialer\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command(goBin, "build", "-o", filepath.Join(rootfs, "dial"), ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build dialer: %v\n%s", err, out)
	}

	spec := specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: append([]string{"/dial"}, targets...), Cwd: "/",
			User: specs.User{UID: 65534, GID: 65534}, Env: []string{"PATH=/"},
			NoNewPrivileges: true, Capabilities: &specs.LinuxCapabilities{},
		},
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: "sandbox",
		Mounts:   []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
			{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace, Path: att.NetNSPath},
		}},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "runsc")
	id := "airlock-nettest-" + randHex(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Cleanup(func() {
		_ = exec.Command(runsc, "--root", state, "delete", "--force", id).Run()
		// runsc leaves a namespace bind mount in its root dir.
		_ = unix.Unmount(filepath.Join(state, "null-netns"), unix.MNT_DETACH)
	})
	cmd := exec.CommandContext(ctx, runsc, "--root", state, "--network=sandbox", "run", "--bundle", bundle, id)
	out, err := cmd.CombinedOutput()
	t.Logf("sandbox output:\n%s", out)
	if err != nil {
		t.Fatalf("runsc run: %v", err)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if addr, res, ok := strings.Cut(l, " "); ok {
			lines[addr] = res
		}
	}
	if !strings.HasPrefix(lines[proxy.Addr], "OK") {
		t.Errorf("gVisor sandbox -> proxy %s: %q", proxy.Addr, lines[proxy.Addr])
	}
	waitCount(t, proxy, 1)
	for _, c := range []*netnstest.Counter{other, host} {
		if c == nil {
			continue
		}
		if !strings.HasPrefix(lines[c.Addr], "FAIL") {
			t.Errorf("gVisor sandbox -> %s: %q, want FAIL", c.Addr, lines[c.Addr])
		}
		if c.Count() != 0 {
			t.Errorf("listener %s counted %d connections from the sandbox", c.Addr, c.Count())
		}
	}
	t.Logf("drop counters: %v", counters(t, m))
}
