package runtime

import (
	"fmt"
	"sort"
	"strings"

	"github.com/airlock-mcp/airlock/runtime/driver"
)

// baseEnv is the whole environment of a sandbox before the operator's
// additions. It is built from this list, never from the server's environment.
var baseEnv = map[string]string{
	"PATH":                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME":                    "/workspace",
	"TMPDIR":                  "/tmp",
	"LANG":                    "C.UTF-8",
	"LC_ALL":                  "C.UTF-8",
	"PYTHONDONTWRITEBYTECODE": "1",
	"MPLBACKEND":              "Agg",
	"MPLCONFIGDIR":            "/tmp/matplotlib",
	"OPENBLAS_NUM_THREADS":    "1",
}

// BuildEnv returns the sandbox environment as KEY=VALUE lines, sorted: the
// base list overlaid with each of extras in turn (the operator's
// sandbox.env, then a networked run's proxy settings).
func BuildEnv(extras ...map[string]string) []string {
	m := make(map[string]string, len(baseEnv))
	for k, v := range baseEnv {
		m[k] = v
	}
	for _, extra := range extras {
		for k, v := range extra {
			m[k] = v
		}
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// ProxyEnv is what a networked sandbox is told about the egress proxy. Every
// common spelling is set, since tools differ in which they read; with a
// custom CA bundle, the variables OpenSSL, curl, requests and pip read too.
func ProxyEnv(proxyURL string, customCA bool) map[string]string {
	env := map[string]string{
		"HTTP_PROXY":      proxyURL,
		"HTTPS_PROXY":     proxyURL,
		"http_proxy":      proxyURL,
		"https_proxy":     proxyURL,
		"NO_PROXY":        "localhost,127.0.0.1,::1",
		"no_proxy":        "localhost,127.0.0.1,::1",
		"PIP_CONFIG_FILE": CodeDir + "/pip.conf",
	}
	if customCA {
		for _, k := range []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "PIP_CERT"} {
			env[k] = CodeDir + "/ca.pem"
		}
	}
	return env
}

// ProxyFiles are the files a networked sandbox gets under CodeDir: pip's
// configuration and, when given, the CA bundle.
func ProxyFiles(proxyURL string, caBundle []byte) map[string][]byte {
	pip := "[global]\nproxy = " + proxyURL + "\ndisable-pip-version-check = true\nno-cache-dir = true\n"
	if len(caBundle) > 0 {
		pip += "cert = " + CodeDir + "/ca.pem\n"
	}
	files := map[string][]byte{"pip.conf": []byte(pip)}
	if len(caBundle) > 0 {
		files["ca.pem"] = caBundle
	}
	return files
}

// CheckOverlay validates a run's extra environment and home files
// (Request.Env, Request.HomeFiles): the names the driver accepts
// (driver.CheckEnv, driver.CheckHomeFile), and no variable airlock sets
// itself, whose meaning the sandbox depends on (HOME, PATH, the proxy's).
// Refusals wrap driver.ErrBadEnv or driver.ErrBadHomeFile.
func CheckOverlay(env, homeFiles map[string]string) error {
	if err := driver.CheckEnv(env); err != nil {
		return err
	}
	var reserved []string
	for k := range env {
		if _, ok := reservedEnv[k]; ok {
			reserved = append(reserved, k)
		}
	}
	if len(reserved) > 0 {
		sort.Strings(reserved)
		return fmt.Errorf("%w: %s is set by airlock itself", driver.ErrBadEnv, strings.Join(reserved, ", "))
	}
	names := make([]string, 0, len(homeFiles))
	for name := range homeFiles {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := driver.CheckHomeFile(name); err != nil {
			return err
		}
	}
	return nil
}

// reservedEnv are the variables airlock sets in every sandbox or in a
// networked one.
var reservedEnv = func() map[string]struct{} {
	m := map[string]struct{}{}
	for k := range baseEnv {
		m[k] = struct{}{}
	}
	for k := range ProxyEnv("", true) {
		m[k] = struct{}{}
	}
	return m
}()

// OverlayRequest gives req a session's environment and home files, under
// req's own: a name in both is req's.
func OverlayRequest(req Request, env, homeFiles map[string]string) Request {
	req.Env = overlay(env, req.Env)
	req.HomeFiles = overlay(homeFiles, req.HomeFiles)
	return req
}

// overlay is base with top's entries over it; base itself when top is
// empty, top when base is.
func overlay(base, top map[string]string) map[string]string {
	switch {
	case len(top) == 0:
		return base
	case len(base) == 0:
		return top
	}
	m := make(map[string]string, len(base)+len(top))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range top {
		m[k] = v
	}
	return m
}
