package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// EgressLatency is one row of the proxy's HTTPS cost: a GET of a small
// body from an HTTPS server on loopback, directly, through a blind CONNECT
// tunnel, or through the proxy terminating and re-originating TLS (an
// allow rule, a secret or tripwires), on a new connection per request or
// on a kept-alive one.
type EgressLatency struct {
	Path       string  `json:"path"`
	Connection string  `json:"connection"`
	N          int     `json:"n"`
	P50        float64 `json:"p50_ms"`
	P95        float64 `json:"p95_ms"`
}

// MeasureEgress times n requests per row with the real proxy, in this
// process, against an HTTPS server of its own; nothing leaves loopback.
func MeasureEgress(ctx context.Context, n int) ([]EgressLatency, error) {
	roots, cert, err := benchCert("tunnel.bench", "intercept.bench")
	if err != nil {
		return nil, err
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("x", 1024))
	}))
	up.EnableHTTP2 = true
	up.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	up.Config.ErrorLog = log.New(io.Discard, "", 0)
	up.StartTLS()
	defer up.Close()
	port, _ := strconv.Atoi(up.URL[strings.LastIndex(up.URL, ":")+1:])

	dir, err := os.MkdirTemp("", "airlock-bench-ca-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ca, err := egress.LoadOrCreateCA(dir)
	if err != nil {
		return nil, err
	}
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	proxy, err := egress.New(egress.Options{
		Hosts:          map[string][]netip.Addr{"tunnel.bench": lo, "intercept.bench": lo},
		AllowedPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		CA:             ca, UpstreamRoots: roots,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	addr, err := proxy.Listen("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	pol, err := egress.ParsePolicy([]string{"tunnel.bench"}, []int{port}, nil)
	if err == nil {
		pol, err = pol.WithRules([]egress.AllowRule{{Domain: "intercept.bench", Methods: []string{"GET"}}})
	}
	if err != nil {
		return nil, err
	}
	const src = "127.0.0.77"
	defer proxy.Register(netip.MustParseAddr(src), "bench", pol)()

	trust := roots.Clone()
	trust.AppendCertsFromPEM(ca.CertPEM())
	client := func(viaProxy, keepAlive bool) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		tr := &http.Transport{DialContext: d.DialContext, TLSClientConfig: &tls.Config{RootCAs: trust},
			ForceAttemptHTTP2: true, DisableKeepAlives: !keepAlive}
		if viaProxy {
			tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: addr.String()})
		} else {
			// Direct: the name is the upstream's, the address loopback.
			tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			}
		}
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	var out []EgressLatency
	for _, row := range []struct{ path, host string }{{"direct", "tunnel.bench"}, {"tunnelled", "tunnel.bench"}, {"intercepted", "intercept.bench"}} {
		for _, keep := range []bool{false, true} {
			c := client(row.path != "direct", keep)
			u := fmt.Sprintf("https://%s:%d/", row.host, port)
			lat := make([]time.Duration, 0, n)
			for i := 0; i < n+1; i++ { // the first primes caches (and, kept alive, the connection)
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				start := time.Now()
				resp, err := c.Get(u)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", row.path, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					return nil, fmt.Errorf("%s: status %s", row.path, resp.Status)
				}
				if i > 0 {
					lat = append(lat, time.Since(start))
				}
			}
			c.CloseIdleConnections()
			conn := "new per request"
			if keep {
				conn = "kept alive"
			}
			slices.Sort(lat)
			msOf := func(p float64) float64 { return float64(percentile(lat, p).Microseconds()) / 1000 }
			out = append(out, EgressLatency{Path: row.path, Connection: conn, N: n, P50: msOf(50), P95: msOf(95)})
		}
	}
	return out, nil
}

// benchCert makes a CA and a server certificate for names.
func benchCert(names ...string) (*x509.CertPool, tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock bench"}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// EgressReport is `airlock bench egress`: the proxy's HTTPS rows alone,
// without booting a sandbox.
type EgressReport struct {
	Started time.Time       `json:"started"`
	Took    string          `json:"took"`
	Machine Machine         `json:"machine"`
	Rows    []EgressLatency `json:"egress"`
}

// RunEgress measures the egress rows with n requests each.
func RunEgress(ctx context.Context, n int) (*EgressReport, error) {
	r := &EgressReport{Started: time.Now().UTC(), Machine: hostMachine()}
	rows, err := MeasureEgress(ctx, n)
	if err != nil {
		return nil, err
	}
	r.Rows, r.Took = rows, time.Since(r.Started).Round(time.Millisecond).String()
	return r, nil
}

// Markdown renders the rows as the README's table.
func (r *EgressReport) Markdown() string {
	return fmt.Sprintf("Measured %s on %d cores (%s), %s.\n", r.Started.Format("2006-01-02"), r.Machine.Cores, r.Machine.CPU, r.Machine.Go) + egressMarkdown(r.Rows)
}

// Write saves the report as name.md and name.json in dir.
func (r *EgressReport) Write(dir, name string) ([]string, error) {
	return writeReport(dir, name, r, r.Markdown())
}

func egressMarkdown(rows []EgressLatency) string {
	var b strings.Builder
	b.WriteString("\nThe egress proxy's HTTPS cost: GET of 1 KiB from an HTTPS server on loopback, through the real proxy in-process (HTTP/2 where both ends offer it):\n\n")
	b.WriteString("| path | connection | n | p50 ms | p95 ms |\n| --- | --- | ---: | ---: | ---: |\n")
	for _, e := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %.2f | %.2f |\n", e.Path, e.Connection, e.N, e.P50, e.P95)
	}
	return b.String()
}
