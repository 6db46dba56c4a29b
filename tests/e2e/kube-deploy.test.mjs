// airlock deployed on the test cluster as a platform team deploys it:
// `kubectl apply -k` of deploy/kubernetes (through the overlay in
// kube-deploy/, sized for the test cluster's one node), two replicas behind
// a Service, driven over streamable HTTP with a bearer token by the
// official SDK. Every connection is a new one, so kube-proxy picks a
// replica per request: a 2025-11-25 client's session must hold on either.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

import { AIRLOCK_BIN, E2E_DIR, airlockCLI, callWith, clusterUp, kubectl, parseMetrics, waitFor } from './lib.mjs';

const execFileP = promisify(execFile);
// The base's names: this suite owns them on the test cluster.
const NS = 'airlock';
const SANDBOX_NS = 'airlock-sandboxes';
const MONITOR_NS = 'airlock-monitor';
const PORT = 8765;
const CONSOLE_PORT = 8766;
// The node's address (cluster.sh) and the port the overlay's networked runs
// may reach there.
const NODE_IP = '10.217.0.1';
const UPSTREAM_PORT = 18080;
// What a stateless (2026-07-28) client puts in every request's _meta.
const MODERN_META = {
  'io.modelcontextprotocol/protocolVersion': '2026-07-28',
  'io.modelcontextprotocol/clientCapabilities': { elicitation: {} },
  'io.modelcontextprotocol/clientInfo': { name: 'deploy-stateless', version: '0' },
};



/** Removes what an earlier run of this suite may have left (never the RuntimeClass: other suites use it). */
async function removeDeployment() {
  await kubectl('delete', 'namespace', NS, SANDBOX_NS, MONITOR_NS, '--ignore-not-found', '--wait=true');
  await kubectl('delete', 'clusterrolebinding,clusterrole', 'airlock-read', '--ignore-not-found');
}

/**
 * fetch over a fresh TCP connection per request (no keep-alive), so the
 * Service balances every request on its own, as behind a load balancer.
 */
function freshFetch(token) {
  return (url, init = {}) => new Promise((resolve, reject) => {
    const u = new URL(url);
    const headers = Object.fromEntries(new Headers(init.headers).entries());
    headers.authorization = `Bearer ${token}`;
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname + u.search, method: init.method || 'GET', headers, agent: false }, (res) => {
      const h = new Headers();
      for (const [k, v] of Object.entries(res.headers)) h.set(k, Array.isArray(v) ? v.join(', ') : v);
      const body = [204, 304].includes(res.statusCode) ? null : Readable.toWeb(res);
      resolve(new Response(body, { status: res.statusCode, headers: h }));
    });
    req.on('error', reject);
    const abort = () => req.destroy(new Error('aborted'));
    init.signal?.addEventListener('abort', abort, { once: true });
    req.on('close', () => init.signal?.removeEventListener('abort', abort));
    if (init.body) req.write(init.body);
    req.end();
  });
}

describe('airlock deployed with kubectl apply -k, two replicas behind a Service', { skip: !(await clusterUp()) && 'no test cluster (scripts/cluster.sh up starts one)', timeout: 20 * 60_000 }, () => {
  let dir, token, approverTokens, serviceIP, podIPs = [];
  const client = async (host, name) => {
    const c = new Client({ name, version: '0.0.0' });
    await c.connect(new StreamableHTTPClientTransport(new URL(`http://${host}:${PORT}/mcp`), { fetch: freshFetch(token) }), { timeout: 60_000 });
    return c;
  };
  const metrics = async (ip) => {
    const r = await freshFetch(token)(`http://${ip}:${PORT}/metrics`);
    assert.equal(r.status, 200);
    return parseMetrics(await r.text());
  };
  /** The replicas' pods, none of them leaving: name, uid, IP, readiness; and how many pods there are in all. */
  const replicaPods = async () => {
    const items = JSON.parse(await kubectl('-n', NS, 'get', 'pods', '-l', 'app.kubernetes.io/name=airlock', '-o', 'json')).items;
    const live = items.filter((p) => !p.metadata.deletionTimestamp).map((p) => ({
      name: p.metadata.name, uid: p.metadata.uid, ip: p.status.podIP,
      ready: p.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false,
    }));
    return { live, all: items.length };
  };
  const replicas = async () => (await replicaPods()).live;
  /** The JSON lines a replica's container wrote to stdout (the cluster's log). */
  const logLines = async (pod, previous = false) => (await kubectl('-n', NS, 'logs', pod, ...(previous ? ['--previous'] : [])))
    .split('\n').flatMap((l) => {
      try {
        return [JSON.parse(l)];
      } catch {
        return []; // not JSON
      }
    });
  /** The audit records among them. */
  const auditLog = async (pod, previous = false) => (await logLines(pod, previous)).filter((r) => r.tool && r.decision);
  /** The instance id a replica's container announced when it started. */
  const instanceOf = async (pod) => (await logLines(pod)).find((r) => r.msg === 'serving' && r.instance)?.instance ?? '';
  /** `airlock approvals ARGS` against one replica's console. */
  const approvals = (ip, ...args) => airlockCLI(['approvals', ...args, '--console', `http://${ip}:${CONSOLE_PORT}`, '--token-file', approverTokens]);
  /** The ids waiting on a replica's console. */
  const waitingOn = async (ip) => {
    const r = await approvals(ip, 'list');
    assert.equal(r.code, 0, r.stderr);
    return [...r.stdout.matchAll(/^=== ([0-9a-f]{32})$/gm)].map((m) => m[1]);
  };
  /** One stateless tools/call, as a 2026-07-28 client sends it: no session, all in _meta. */
  const statelessCall = async (ip, name, params) => {
    const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name, ...params, _meta: MODERN_META } });
    const r = await freshFetch(token)(`http://${ip}:${PORT}/mcp`, {
      method: 'POST', body,
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': name },
    });
    const text = await r.text();
    assert.equal(r.status, 200, text);
    // JSON, or an event stream that ends with the response.
    const msgs = (r.headers.get('content-type') ?? '').includes('text/event-stream')
      ? text.split('\n').filter((l) => l.startsWith('data:')).map((l) => JSON.parse(l.slice(5)))
      : [JSON.parse(text)];
    const res = msgs.find((m) => m.id === 1);
    assert.ok(res, text);
    return res;
  };
  const runs = (m) => [...m].filter(([k]) => k.startsWith('airlock_executions_total{') && k.includes('tool="run_python"')).reduce((n, [, v]) => n + v, 0);

  /**
   * Waits until kube-proxy sends the Service to exactly these replicas: it
   * programs a change a moment after the endpoints are ready.
   */
  const routedOnlyTo = async (ips) => {
    let rules = '';
    // One endpoint is "dnat to IP:PORT", several a map of "IP . PORT".
    const routes = (ip) => rules.includes(`dnat to ${ip}:${PORT}`) || rules.includes(`${ip} . ${PORT}`);
    const routed = await waitFor(async () => {
      rules = (await execFileP('nft', ['list', 'table', 'ip', 'kube-proxy'])).stdout;
      const all = [...rules.matchAll(new RegExp(`(?:dnat to |\\b)(\\d+\\.\\d+\\.\\d+\\.\\d+)(?::| \\. )${PORT}\\b`, 'g'))].map((m) => m[1]);
      return ips.every(routes) && all.every((ip) => ips.includes(ip));
    }, 120_000);
    assert.ok(routed, `kube-proxy does not route the Service to exactly the replicas ${ips}`);
  };

  before(async () => {
    await removeDeployment();
    dir = await mkdtemp(path.join(os.tmpdir(), 'airlock-kube-deploy-'));
    const tokens = path.join(dir, 'client.tokens');
    // As the README says: the token's hash in a file, the secret printed once.
    const { stdout } = await execFileP(AIRLOCK_BIN, ['token', 'add', 'e2e'], { env: { ...process.env, AIRLOCK_AUTH_TOKEN_FILE: tokens } });
    token = stdout.trim();
    await writeFile(path.join(dir, 'session.key'), randomBytes(32).toString('hex'));
    approverTokens = path.join(dir, 'approver.tokens');
    await writeFile(approverTokens, `e2e-approver:${randomBytes(24).toString('hex')}\n`, { mode: 0o600 });
    await kubectl('create', 'namespace', NS);
    await kubectl('-n', NS, 'create', 'secret', 'generic', 'airlock-secrets', `--from-file=client.tokens=${tokens}`,
      `--from-file=session.key=${path.join(dir, 'session.key')}`, `--from-file=approver.tokens=${approverTokens}`);
    // The node monitor agents' token, as the README says: in their
    // namespace and in airlock's.
    const monitorToken = path.join(dir, 'monitor.token');
    await writeFile(monitorToken, randomBytes(32).toString('hex'), { mode: 0o600 });
    await kubectl('create', 'namespace', MONITOR_NS);
    for (const ns of [MONITOR_NS, NS]) await kubectl('-n', ns, 'create', 'secret', 'generic', 'airlock-monitor', `--from-file=monitor.token=${monitorToken}`);
    await kubectl('apply', '-k', path.join(E2E_DIR, 'kube-deploy'));
    await kubectl('-n', NS, 'rollout', 'status', 'deployment/airlock', '--timeout=180s');
    await kubectl('-n', MONITOR_NS, 'rollout', 'status', 'daemonset/airlock-monitor-agent', '--timeout=180s');
    serviceIP = (await kubectl('-n', NS, 'get', 'service', 'airlock', '-o', 'jsonpath={.spec.clusterIP}')).trim();
    // The two replicas of the rollout, ready, none of them leaving.
    const ready = await waitFor(async () => {
      const { live, all } = await replicaPods();
      podIPs = live.filter((p) => p.ready).map((p) => p.ip);
      return podIPs.length === 2 && all === 2;
    }, 60_000);
    assert.ok(ready, `want 2 ready replicas, have ${podIPs}`);
    await routedOnlyTo(podIPs);
  });

  after(async () => {
    if (process.env.AIRLOCK_E2E_KEEP !== '1') await removeDeployment();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test('40 calls through the Service land on both replicas and all return the right output', async () => {
    const before = await Promise.all(podIPs.map(metrics));
    const clients = await Promise.all([0, 1, 2, 3].map((i) => client(serviceIP, `deploy-${i}`)));
    const results = await Promise.all(Array.from({ length: 40 }, (_, i) =>
      callWith(clients[i % 4], 'run_python', { code: `print(${i} * ${i})` }, { timeout: 300_000 })));
    results.forEach((r, i) => {
      assert.equal(r.isError, false, `call ${i}: ${r.text}`);
      assert.equal(r.sc?.stdout, `${i * i}\n`, `call ${i}`);
    });
    await Promise.all(clients.map((c) => c.close()));
    const after = await Promise.all(podIPs.map(metrics));
    const served = after.map((m, i) => runs(m) - runs(before[i]));
    assert.equal(served[0] + served[1], 40, `runs per replica ${served}`);
    assert.ok(served[0] > 0 && served[1] > 0, `each replica must have served some of the 40 runs; they served ${served}`);
    // Every call's audit record is on one replica's stdout.
    const logged = new Set((await Promise.all((await replicas()).map((p) => auditLog(p.name)))).flat().map((r) => r.id));
    const missing = results.map((r) => r.sc.run_id).filter((id) => !logged.has(id));
    assert.deepEqual(missing, [], 'runs without an audit record on stdout');
  });

  test('runtime monitoring through the node\'s agent: an attempt is named in the result, the audit record and the metric; benign code names none', async () => {
    const c = await client(serviceIP, 'deploy-monitor');
    const hostile = await callWith(c, 'run_python', {
      code: 'import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.syscall(165, b"none", b"/tmp", b"tmpfs", 0, None))',
    }, { timeout: 300_000 });
    const benign = await callWith(c, 'run_python', { code: 'import subprocess\nprint(subprocess.run(["echo", "hi"], capture_output=True).stdout)' }, { timeout: 300_000 });
    await c.close();
    assert.equal(hostile.isError, false, hostile.text);
    assert.ok(hostile.sc.attempts?.some((a) => a.kind === 'mount' && a.syscall === 'mount'), `attempts ${JSON.stringify(hostile.sc.attempts)}`);
    assert.match(hostile.text, /gVisor saw the code try: .*mount/);
    assert.equal(benign.isError, false, benign.text);
    assert.equal(benign.sc.attempts, undefined, `benign attempts ${JSON.stringify(benign.sc.attempts)}`);
    // The record of the call, on whichever replica ran it, and that
    // replica's counter.
    const records = (await Promise.all((await replicas()).map((p) => auditLog(p.name)))).flat();
    const rec = records.find((r) => r.id === hostile.sc.run_id);
    assert.ok(rec?.attempts?.some((a) => a.includes('mount')), `audit record ${JSON.stringify(rec)}`);
    const mounts = (await Promise.all(podIPs.map(metrics))).reduce((n, m) => n + (m.get('airlock_sandbox_escape_attempts_total{kind="mount"}') ?? 0), 0);
    assert.ok(mounts >= 1, `mount attempts counted by the replicas: ${mounts}`);
  });

  test('a session opened through one replica is used through the other', async () => {
    const [a, b] = await Promise.all([client(podIPs[0], 'deploy-a'), client(podIPs[1], 'deploy-b')]);
    const created = await callWith(a, 'session_create', {}, { timeout: 300_000 });
    const sid = created.sc?.session_id;
    assert.ok(sid, created.text);
    const set = await callWith(a, 'run_python', { session_id: sid, code: 'x = 41' }, { timeout: 300_000 });
    assert.equal(set.isError, false, set.text);
    const got = await callWith(b, 'run_python', { session_id: sid, code: 'print(x + 1)' }, { timeout: 300_000 });
    assert.equal(got.isError, false, got.text);
    assert.equal(got.sc?.stdout, '42\n');
    const closed = await callWith(b, 'session_close', { session_id: sid });
    assert.equal(closed.isError, false, closed.text);
    await Promise.all([a.close(), b.close()]);
  });

  test('a networked session opened through one replica keeps its network through the other', async () => {
    const { order, upstream } = await startUpstream();
    const [a, b] = await Promise.all([client(podIPs[0], 'deploy-net-a'), client(podIPs[1], 'deploy-net-b')]);
    let sid;
    try {
      const created = await callWith(a, 'session_create', { network: 'allowlist' }, { timeout: 300_000 });
      sid = created.sc?.session_id;
      assert.ok(sid, created.text);
      assert.equal(created.sc.network, 'allowlist');
      // urllib keeps the opener (and so the proxy) it built on first use.
      const first = await callWith(a, 'run_python', { session_id: sid, code: `import os, urllib.request
print(os.environ["HTTP_PROXY"])
print(urllib.request.urlopen("http://api.test:${UPSTREAM_PORT}/", timeout=20).read().decode())` }, { timeout: 300_000 });
      await withEnforcerState(() => assert.equal(first.isError, false, first.text));
      assert.equal(first.sc.stdout, `http://127.0.0.1:3128\nhello from upstream api.test:${UPSTREAM_PORT}\n`);
      const second = await callWith(b, 'run_python', { session_id: sid, code: `import urllib.error
print(urllib.request.urlopen("http://api.test:${UPSTREAM_PORT}/", timeout=20).read().decode())
try:
    urllib.request.urlopen("http://other.test:${UPSTREAM_PORT}/", timeout=20)
except urllib.error.HTTPError as e:
    print("other: refused", e.code)` }, { timeout: 300_000 });
      await withEnforcerState(() => assert.equal(second.isError, false, second.text));
      assert.equal(second.sc.stdout, `hello from upstream api.test:${UPSTREAM_PORT}\nother: refused 403\n`);
      // The other replica's proxy refused it, and says so in its result.
      assert.deepEqual(second.sc.egress_denied, [{ host: 'other.test', port: UPSTREAM_PORT, reason: 'not in allow-list' }]);
      // The first fetch came through the replica that opened the session, the second through the one that took it over.
      assert.deepEqual(order, [podIPs[0], podIPs[1]]);
      const listed = await callWith(b, 'session_list', {});
      assert.deepEqual(listed.sc.sessions.find((x) => x.session_id === sid)?.allow_domains, ['api.test']);
      const closed = await callWith(b, 'session_close', { session_id: sid });
      sid = undefined;
      assert.equal(closed.isError, false, closed.text);
    } finally {
      // A failed check must not leave the session's pod for the tests after.
      if (sid) await callWith(b, 'session_close', { session_id: sid }).catch(() => {});
      await Promise.all([a.close(), b.close()]);
      upstream.close();
    }
  });

  test('a request without the token is refused by both replicas', async () => {
    for (const ip of podIPs) {
      const r = await freshFetch('wrong')(`http://${ip}:${PORT}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
      assert.equal(r.status, 401, `replica ${ip}`);
    }
  });

  /**
   * What the NetworkPolicy enforcer has programmed (kube-router's chains
   * with their counters, its ipsets): attached to a networked test's
   * failure, since the full suite has seen a networked pod's connections
   * to its replica's proxy dropped for 10 to 20 s after the pod was fenced.
   */
  const enforcerState = async () => {
    const out = await Promise.allSettled([
      execFileP('sh', ['-c', 'iptables-save -c | grep -E "KUBE-(POD-FW|NWPLCY|ROUTER)" | head -150']),
      execFileP('sh', ['-c', 'ipset list | head -80']),
      kubectl('get', 'pods', '-A', '-o', 'wide'),
    ]);
    return out.map((r) => (r.status === 'fulfilled' ? (r.value.stdout ?? r.value) : String(r.reason))).join('\n');
  };
  /** Runs check; on failure, fails with the enforcer's state attached. */
  const withEnforcerState = async (check) => {
    try {
      await check();
    } catch (err) {
      err.message += `\n--- enforcer state ---\n${await enforcerState()}`;
      throw err;
    }
  };

  /** The overlay's api.test: a server of the test's on the node's address, counting requests by source in order. */
  const startUpstream = async () => {
    const sources = new Map();
    const order = [];
    const upstream = http.createServer((req, res) => {
      sources.set(req.socket.remoteAddress, (sources.get(req.socket.remoteAddress) ?? 0) + 1);
      order.push(req.socket.remoteAddress);
      res.end(`hello from upstream ${req.headers.host}`);
    });
    await new Promise((resolve, reject) => upstream.once('error', reject).listen(UPSTREAM_PORT, NODE_IP, resolve));
    return { sources, order, upstream };
  };

  test('a networked run through the Service: the allowed name through its replica\'s proxy, another refused and reported, nothing past the proxy', async () => {
    const { sources, upstream } = await startUpstream();
    try {
      const c = await client(serviceIP, 'deploy-network');
      const code = `import os, socket, urllib.request, urllib.error
print("proxy", os.environ.get("HTTP_PROXY"))
print(urllib.request.urlopen("http://api.test:${UPSTREAM_PORT}/", timeout=20).read().decode())
try:
    urllib.request.urlopen("http://other.test:${UPSTREAM_PORT}/", timeout=20)
    print("other: reached")
except urllib.error.HTTPError as e:
    print("other: refused", e.code)
for host, port in [("${NODE_IP}", ${UPSTREAM_PORT}), ("${serviceIP}", ${PORT})]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("direct", host, "open")
    except OSError as e:
        print("direct", host, "blocked")
`;
      const r = await callWith(c, 'run_python', { code, network: 'allowlist' }, { timeout: 300_000 });
      await c.close();
      await withEnforcerState(() => assert.equal(r.isError, false, r.text));
      const out = r.sc.stdout;
      // The pod's proxy is a replica's own address, on the egress port.
      const proxy = out.match(/^proxy http:\/\/([\d.]+):3128$/m);
      assert.ok(proxy && podIPs.includes(proxy[1]), `the sandbox's proxy is no replica's: ${out}`);
      assert.match(out, /hello from upstream api\.test:18080/);
      assert.match(out, /other: refused 403/);
      assert.match(out, new RegExp(`direct ${NODE_IP} blocked`));
      assert.match(out, new RegExp(`direct ${serviceIP.replaceAll('.', '\\.')} blocked`));
      assert.deepEqual(r.sc.egress_denied, [{ host: 'other.test', port: UPSTREAM_PORT, reason: 'not in allow-list' }]);
      // Only the replica's proxy came to the upstream, once: no sandbox did.
      assert.deepEqual([...sources], [[proxy[1], 1]]);
    } finally {
      upstream.close();
    }
  });

  test('a call asked through one replica is approved on the other\'s console, with `airlock approvals`', async () => {
    const [ra, rb] = await replicas();
    const c = await client(ra.ip, 'deploy-approval');
    const call = callWith(c, 'run_shell', { command: 'echo approved-across' }, { timeout: 300_000 });
    let ids = [];
    const shown = await waitFor(async () => (ids = await waitingOn(rb.ip)).length === 1, 60_000);
    assert.ok(shown, `replica ${rb.name}'s console shows ${ids}, want the request asked on ${ra.name}`);
    assert.deepEqual(await waitingOn(ra.ip), ids, 'both consoles show the same request');
    const ok = await approvals(rb.ip, 'approve', ids[0]);
    assert.equal(ok.code, 0, ok.stderr);
    const again = await approvals(ra.ip, 'deny', ids[0]);
    assert.notEqual(again.code, 0, 'a second answer, on the asking replica, must be refused');
    assert.match(again.stderr + again.stdout, /already decided/);
    const r = await call;
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc?.stdout, 'approved-across\n');
    const rec = (await auditLog(ra.name)).find((x) => x.id === r.sc.run_id);
    assert.equal(rec?.decision, 'approved', JSON.stringify(rec));
    assert.equal(rec?.approver, 'console:e2e-approver', JSON.stringify(rec));
    assert.deepEqual(await waitingOn(rb.ip), [], 'the decided request left the consoles');
    await c.close();
  });

  test('a stateless client\'s answered retry runs on the other replica, once', async () => {
    const [ra, rb] = await replicas();
    const args = { command: 'echo retried-across' };
    const asked = await statelessCall(ra.ip, 'run_shell', { arguments: args });
    const state = asked.result?.requestState;
    assert.ok(state && asked.result?.inputRequests?.airlock_approval, `want an input request: ${JSON.stringify(asked)}`);
    assert.deepEqual(await waitingOn(rb.ip), [], 'a question for the client\'s user is not on the consoles');
    const answer = { airlock_approval: { action: 'accept', content: { approve: true } } };
    // Other arguments are refused, and spoil the approval on every replica.
    const changed = await statelessCall(rb.ip, 'run_shell', { arguments: { command: 'echo other' }, requestState: state, inputResponses: answer });
    assert.equal(changed.result?.isError, true, JSON.stringify(changed));
    const spoiled = await statelessCall(ra.ip, 'run_shell', { arguments: args, requestState: state, inputResponses: answer });
    assert.equal(spoiled.result?.isError, true, `a spoiled approval ran on the asking replica: ${JSON.stringify(spoiled)}`);

    const asked2 = await statelessCall(ra.ip, 'run_shell', { arguments: args });
    const state2 = asked2.result?.requestState;
    assert.ok(state2, JSON.stringify(asked2));
    const ran = await statelessCall(rb.ip, 'run_shell', { arguments: args, requestState: state2, inputResponses: answer });
    assert.notEqual(ran.result?.isError, true, JSON.stringify(ran)); // isError is left out when false
    assert.equal(ran.result?.structuredContent?.stdout, 'retried-across\n');
    for (const ip of [ra.ip, rb.ip]) {
      const twice = await statelessCall(ip, 'run_shell', { arguments: args, requestState: state2, inputResponses: answer });
      assert.equal(twice.result?.isError, true, `the same answer ran twice (on ${ip}): ${JSON.stringify(twice)}`);
      assert.match(JSON.stringify(twice.result), /already/);
    }
    const runId = ran.result.structuredContent.run_id;
    const rec = (await auditLog(rb.name)).find((x) => x.id === runId);
    assert.equal(rec?.decision, 'approved', JSON.stringify(rec));
    assert.equal(rec?.approval_id, state2);
    // A request asked after it and never answered: the asking replica
    // records its expiry, after it judged the one above.
    const asked3 = await statelessCall(ra.ip, 'run_shell', { arguments: args });
    const state3 = asked3.result?.requestState;
    assert.ok(state3, JSON.stringify(asked3));
    const expiryOf = async (id) => (await auditLog(ra.name)).filter((x) => x.approval_id === id && x.decision === 'expired');
    const recorded = await waitFor(async () => (await expiryOf(state3)).length === 1, 180_000);
    assert.ok(recorded, 'the unanswered request\'s expiry was never recorded');
    // The retry was the answer to the first: no expiry for it, and it is
    // off the board. (The refused second retry has a record of its own.)
    assert.deepEqual(await expiryOf(state2), [], 'the asking replica recorded an expiry for the request another replica ran');
    for (const id of [state2, state3]) {
      const left = (await kubectl('-n', SANDBOX_NS, 'get', 'configmap', `airlock-approval-${id}`, '--ignore-not-found', '-o', 'name')).trim();
      assert.equal(left, '', `request ${id} is still on the board after its expiry`);
    }
  });

  test('a 2025-11-25 client\'s answer by elicitation, sent to the other replica, reaches the one that asked', async () => {
    const [ra, rb] = await replicas();
    const base = freshFetch(token);
    // Everything to ra, except the client's replies (its answers to ra's
    // questions), which go to rb, as a Service may send them.
    let replies = 0;
    const split = (url, init = {}) => {
      let reply = false;
      try {
        const m = JSON.parse(init.body ?? '');
        reply = !m.method && m.id !== undefined && ('result' in m || 'error' in m);
      } catch {
        // not one JSON-RPC message
      }
      if (reply) replies++;
      const u = new URL(url);
      u.hostname = reply ? rb.ip : ra.ip;
      return base(u.toString(), init);
    };
    const c = new Client({ name: 'deploy-elicit', version: '0.0.0' }, { capabilities: { elicitation: { form: {} } } });
    let asked = 0;
    c.setRequestHandler(ElicitRequestSchema, () => {
      asked++;
      return { action: 'accept', content: { approve: true } };
    });
    await c.connect(new StreamableHTTPClientTransport(new URL(`http://${ra.ip}:${PORT}/mcp`), { fetch: split }), { timeout: 60_000 });
    const r = await callWith(c, 'run_shell', { command: 'echo elicited-across' }, { timeout: 300_000 });
    assert.equal(asked, 1, 'the client was asked once');
    assert.equal(replies, 1, 'its answer went to the other replica');
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc?.stdout, 'elicited-across\n');
    const rec = (await auditLog(ra.name)).find((x) => x.id === r.sc.run_id);
    assert.equal(rec?.decision, 'approved', JSON.stringify(rec));
    assert.equal(rec?.channel, 'elicitation');
    await c.close();
  });

  test('a replica SIGKILLed mid-run: the other serves, its pods go, its acknowledged records are in its log', async () => {
    const [victim, survivor] = await replicas();
    const instance = await instanceOf(victim.name);
    assert.ok(instance, `no instance id in ${victim.name}'s log`);
    const [v, sv] = await Promise.all([client(victim.ip, 'deploy-victim'), client(survivor.ip, 'deploy-survivor')]);
    const acked = await callWith(v, 'run_python', { code: 'print("acknowledged")' }, { timeout: 300_000 });
    assert.equal(acked.isError, false, acked.text);
    const long = callWith(v, 'run_python', { code: 'import time\nprint("started", flush=True)\ntime.sleep(120)' }, { timeout: 300_000 })
      .then(() => 'returned', (err) => `failed: ${err.message}`);
    const running = await waitFor(async () => (await kubectl('-n', SANDBOX_NS, 'get', 'pods', '-l', `airlock.dev/instance=${instance},airlock.dev/run`, '-o', 'name')).trim() !== '', 120_000);
    assert.ok(running, 'the long run never got a pod');
    // The victim's process on this node, found by its pod's cgroup.
    const { stdout: pids } = await execFileP('pgrep', ['-f', 'airlock serve']);
    let pid = 0;
    for (const p of pids.split('\n').filter(Boolean)) {
      const cg = await readFile(`/proc/${p}/cgroup`, 'utf8').catch(() => '');
      if (cg.includes(victim.uid) || cg.includes(victim.uid.replaceAll('-', '_'))) pid = Number(p);
    }
    assert.ok(pid > 0, `no airlock process in pod ${victim.name}'s cgroup`);
    process.kill(pid, 'SIGKILL');
    assert.match(await long, /^failed/, 'the run on the killed replica cannot have returned');
    const after = await callWith(sv, 'run_python', { code: 'print("still serving")' }, { timeout: 300_000 });
    assert.equal(after.sc?.stdout, 'still serving\n', after.text);
    let left = '';
    const swept = await waitFor(async () => (left = (await kubectl('-n', SANDBOX_NS, 'get', 'pods', '-l', `airlock.dev/instance=${instance}`, '-o', 'name')).trim()) === '', 120_000);
    assert.ok(swept, `the killed replica's pods are still there: ${left}`);
    // The kubelet restarts the container; the killed one's stdout stays readable.
    const restarted = await waitFor(async () => {
      const p = JSON.parse(await kubectl('-n', NS, 'get', 'pod', victim.name, '-o', 'json'));
      return (p.status.containerStatuses?.[0]?.restartCount ?? 0) > 0;
    }, 120_000);
    assert.ok(restarted, `${victim.name} was not restarted`);
    const records = await auditLog(victim.name, true);
    assert.ok(records.some((r) => r.id === acked.sc.run_id), `the acknowledged run ${acked.sc.run_id} has no record in the killed container's log`);
    await Promise.all([v.close().catch(() => {}), sv.close()]);
    await kubectl('-n', NS, 'rollout', 'status', 'deployment/airlock', '--timeout=180s');
  });

  test('a rolling update keeps a session: the new replicas serve it with its state', async () => {
    const old = await replicas();
    const c = await client(serviceIP, 'deploy-rolling');
    const created = await callWith(c, 'session_create', {}, { timeout: 300_000 });
    const sid = created.sc?.session_id;
    assert.ok(sid, created.text);
    const set = await callWith(c, 'run_python', { session_id: sid, code: 'x = 41' }, { timeout: 300_000 });
    assert.equal(set.isError, false, set.text);
    await kubectl('-n', NS, 'rollout', 'restart', 'deployment/airlock');
    await kubectl('-n', NS, 'rollout', 'status', 'deployment/airlock', '--timeout=300s');
    let now = [];
    const replaced = await waitFor(async () => {
      now = await replicas();
      return now.length === 2 && now.every((p) => !old.some((o) => o.name === p.name));
    }, 120_000);
    assert.ok(replaced, `the old replicas are still there: ${now.map((p) => p.name)}`);
    podIPs = now.map((p) => p.ip);
    await routedOnlyTo(podIPs);
    // The same client, its MCP session and its airlock session, through
    // the Service to replicas that did not exist when it opened them.
    const got = await callWith(c, 'run_python', { session_id: sid, code: 'print(x + 1)' }, { timeout: 300_000 });
    assert.equal(got.isError, false, got.text);
    assert.equal(got.sc?.stdout, '42\n');
    const closed = await callWith(c, 'session_close', { session_id: sid });
    assert.equal(closed.isError, false, closed.text);
    await c.close();
  });

  test('scaled to zero, the replicas leave no sandbox pod behind, not even a session', async () => {
    // Both replicas leave at once: the one holding the session must not
    // hand it to the other.
    const c = await client(serviceIP, 'deploy-last');
    const created = await callWith(c, 'session_create', {}, { timeout: 300_000 });
    assert.ok(created.sc?.session_id, created.text);
    await c.close();
    await kubectl('-n', NS, 'scale', 'deployment/airlock', '--replicas=0');
    const gone = await waitFor(async () => (await kubectl('-n', NS, 'get', 'pods', '-l', 'app.kubernetes.io/name=airlock', '-o', 'name')).trim() === '', 120_000);
    assert.ok(gone, 'the replicas did not stop');
    let left = '';
    const clean = await waitFor(async () => (left = (await kubectl('-n', SANDBOX_NS, 'get', 'pods', '-o', 'name')).trim()) === '', 60_000);
    assert.ok(clean, `sandbox pods left: ${left}`);
  });
});
