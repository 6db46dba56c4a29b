// airlock deployed on the test cluster as a platform team deploys it:
// `kubectl apply -k` of deploy/kubernetes (through the overlay in
// kube-deploy/, sized for the test cluster's one node), two replicas behind
// a Service, driven over streamable HTTP with a bearer token by the
// official SDK. Every connection is a new one, so kube-proxy picks a
// replica per request: a 2025-11-25 client's session must hold on either.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { AIRLOCK_BIN, E2E_DIR, callWith, clusterUp, kubectl, parseMetrics, waitFor } from './lib.mjs';

const execFileP = promisify(execFile);
// The base's names: this suite owns them on the test cluster.
const NS = 'airlock';
const SANDBOX_NS = 'airlock-sandboxes';
const PORT = 8765;



/** Removes what an earlier run of this suite may have left (never the RuntimeClass: other suites use it). */
async function removeDeployment() {
  await kubectl('delete', 'namespace', NS, SANDBOX_NS, '--ignore-not-found', '--wait=true');
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
  let dir, token, serviceIP, podIPs = [];
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
  const runs = (m) => [...m].filter(([k]) => k.startsWith('airlock_executions_total{') && k.includes('tool="run_python"')).reduce((n, [, v]) => n + v, 0);

  before(async () => {
    await removeDeployment();
    dir = await mkdtemp(path.join(os.tmpdir(), 'airlock-kube-deploy-'));
    const tokens = path.join(dir, 'client.tokens');
    // As the README says: the token's hash in a file, the secret printed once.
    const { stdout } = await execFileP(AIRLOCK_BIN, ['token', 'add', 'e2e'], { env: { ...process.env, AIRLOCK_AUTH_TOKEN_FILE: tokens } });
    token = stdout.trim();
    await writeFile(path.join(dir, 'session.key'), randomBytes(32).toString('hex'));
    await kubectl('create', 'namespace', NS);
    await kubectl('-n', NS, 'create', 'secret', 'generic', 'airlock-secrets', `--from-file=client.tokens=${tokens}`, `--from-file=session.key=${path.join(dir, 'session.key')}`);
    await kubectl('apply', '-k', path.join(E2E_DIR, 'kube-deploy'));
    await kubectl('-n', NS, 'rollout', 'status', 'deployment/airlock', '--timeout=180s');
    serviceIP = (await kubectl('-n', NS, 'get', 'service', 'airlock', '-o', 'jsonpath={.spec.clusterIP}')).trim();
    // The two replicas of the rollout, ready, none of them leaving.
    const ready = await waitFor(async () => {
      const pods = JSON.parse(await kubectl('-n', NS, 'get', 'pods', '-l', 'app.kubernetes.io/name=airlock', '-o', 'json')).items;
      podIPs = pods.filter((p) => !p.metadata.deletionTimestamp && p.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'))
        .map((p) => p.status.podIP);
      return podIPs.length === 2 && pods.length === 2;
    }, 60_000);
    assert.ok(ready, `want 2 ready replicas, have ${podIPs}`);
    // kube-proxy programs the Service a moment after its endpoints are
    // ready: wait until it sends to both replicas.
    const routed = await waitFor(async () => {
      const { stdout } = await execFileP('nft', ['list', 'table', 'ip', 'kube-proxy']);
      // One endpoint is "dnat to IP:PORT", several a map of "IP . PORT".
      return podIPs.every((ip) => stdout.includes(`dnat to ${ip}:${PORT}`) || stdout.includes(`${ip} . ${PORT}`));
    }, 60_000);
    assert.ok(routed, `kube-proxy does not route the Service to both replicas ${podIPs}`);
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

  test('a request without the token is refused by both replicas', async () => {
    for (const ip of podIPs) {
      const r = await freshFetch('wrong')(`http://${ip}:${PORT}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
      assert.equal(r.status, 401, `replica ${ip}`);
    }
  });

  test('scaled to zero, the replicas leave no sandbox pod behind', async () => {
    await kubectl('-n', NS, 'scale', 'deployment/airlock', '--replicas=0');
    const gone = await waitFor(async () => (await kubectl('-n', NS, 'get', 'pods', '-l', 'app.kubernetes.io/name=airlock', '-o', 'name')).trim() === '', 120_000);
    assert.ok(gone, 'the replicas did not stop');
    let left = '';
    const clean = await waitFor(async () => (left = (await kubectl('-n', SANDBOX_NS, 'get', 'pods', '-o', 'name')).trim()) === '', 60_000);
    assert.ok(clean, `sandbox pods left: ${left}`);
  });
});
