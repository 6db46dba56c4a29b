// The Kubernetes backend end to end: `airlock serve` with
// runtime.backend: kubernetes over stdio, driven by the official SDK,
// against the test cluster scripts/cluster.sh runs (make test starts it).
// The same core cases as the local backend's suite, each run in a gVisor
// pod of its own, and nothing of airlock's left on the cluster afterwards.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

import { AIRLOCK_BIN, KUBECONFIG, clusterUp, kubectl, marker, waitFor } from './lib.mjs';

const STDOUT_CAP = 4096;

/** Names of the objects of a kind in ns that airlock labelled as its own. */
async function airlockObjects(ns, kind, selector = '') {
  const out = await kubectl('-n', ns, 'get', kind, '-l', 'app.kubernetes.io/managed-by=airlock' + selector, '-o', 'name');
  return out.split('\n').filter(Boolean);
}


const up = await clusterUp();

describe('kubernetes backend over stdio', { skip: !up && 'no test cluster (scripts/cluster.sh up starts one)', timeout: 20 * 60_000 }, () => {
  const ns = 'airlock-e2e-' + randomBytes(4).toString('hex');
  const canary = 'canary-' + randomBytes(8).toString('hex');
  let dir, cfg, client, stderr = '';
  const pids = new Map(); // each client's airlock process

  /** Starts `airlock serve` over stdio with the test's config; returns its client. */
  const connect = async (name) => {
    const transport = new StdioClientTransport({
      command: AIRLOCK_BIN,
      args: ['serve', '--transport', 'stdio', '--config', cfg],
      env: { PATH: process.env.PATH, AIRLOCK_E2E_CANARY: canary },
      stderr: 'pipe',
    });
    transport.stderr.on('data', (c) => { stderr = (stderr + c.toString()).slice(-256 * 1024); });
    const c = new Client({ name, version: '0.0.0' });
    await c.connect(transport, { timeout: 120_000 });
    await c.listTools();
    pids.set(c, transport.pid);
    return c;
  };

  const callWith = async (c, name, args, timeout = 180_000) => {
    const res = await c.callTool({ name, arguments: args }, CallToolResultSchema, { timeout });
    return { sc: res.structuredContent, text: res.content?.find((x) => x.type === 'text')?.text ?? '', isError: res.isError === true };
  };
  const call = (name, args, timeout) => callWith(client, name, args, timeout);
  const py = (code, extra = {}) => call('run_python', { code, ...extra });
  const sh = (command, extra = {}) => call('run_shell', { command, ...extra });
  const why = (r) => `${r.text.slice(0, 1500)}\n--- server stderr (tail) ---\n${stderr.slice(-3000)}`;

  before(async () => {
    await kubectl('create', 'namespace', ns);
    // Pods are refused until the namespace's default service account exists.
    assert.ok(await waitFor(async () => (await kubectl('-n', ns, 'get', 'serviceaccount', 'default', '-o', 'name').catch(() => '')).trim() !== '', 60_000),
      `the default service account of ${ns}`);
    dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_k8s_'));
    cfg = path.join(dir, 'config.yaml');
    await writeFile(cfg, [
      `state_dir: ${JSON.stringify(dir)}`,
      'runtime: {backend: kubernetes}',
      // A short lease: a killed airlock is found dead within seconds.
      `kubernetes: {kubeconfig: ${JSON.stringify(KUBECONFIG)}, namespace: ${ns}, schedule_timeout: 120s, lease_duration: 5s}`,
      `limits: {workspace_mb: 8, tmp_mb: 8, memory_mb: 256, cpus: 0.3, pids: 64, stdout_bytes: ${STDOUT_CAP}, concurrency: 4, queue: 64, queue_wait_s: 300}`,
      // Two warm pods (without numpy and pandas: the one test node has 2
      // CPUs to give, and 4 runs + 2 warm pods at 0.3 fit).
      'pool: {size: 2, preload: []}',
      'audit: {enabled: false}',
      '',
    ].join('\n'));
    client = await connect('airlock-e2e-k8s');
  });

  after(async () => {
    await client?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
    await kubectl('delete', 'namespace', ns, '--wait=true', '--timeout=120s').catch(() => {});
  });

  test("gVisor's kernel, not root, read-only root, capped tmpfs", async () => {
    const r = await py(`
import json, os, platform, shutil
try:
    open('/etc/x', 'w'); ro = False
except OSError:
    ro = True
print(json.dumps({"release": platform.release(), "uid": os.getuid(), "ro": ro,
                  "ws": shutil.disk_usage('/workspace').total, "tmp": shutil.disk_usage('/tmp').total}))`);
    assert.equal(r.sc?.exit_code, 0, why(r));
    const p = JSON.parse(r.sc.stdout.trim().split('\n').pop());
    assert.match(p.release, /gvisor/i, 'platform.release() names gVisor');
    assert.notEqual(p.uid, 0);
    assert.equal(p.ro, true, 'the root is read-only');
    assert.equal(p.ws, 8 << 20, '/workspace is limits.workspace_mb');
    assert.equal(p.tmp, 8 << 20, '/tmp is limits.tmp_mb');
  });

  test('a timeout kills the pod', async () => {
    const r = await sh('echo started; sleep 120', { timeout_s: 3 });
    assert.equal(r.sc?.timed_out, true, why(r));
    assert.equal(r.sc.reason, 'timeout');
    assert.equal(r.sc.stdout, 'started\n');
    assert.equal(r.isError, true);
  });

  test('a memory bomb is reported as out of memory', async () => {
    const r = await py('b = []\nwhile True:\n    b.append(bytearray(b"\\x01") * (16 << 20))', { timeout_s: 60 });
    assert.equal(r.sc?.oom_killed, true, why(r));
    assert.equal(r.sc.reason, 'out_of_memory');
    assert.equal(r.sc.timed_out, false);
  });

  test('a fork bomb is contained and the next call works', async () => {
    const r = await py('import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass', { timeout_s: 5 });
    assert.ok(r.sc, why(r));
    assert.equal(r.isError, true);
    const next = await py('print(1)');
    assert.equal(next.sc?.stdout, '1\n', why(next));
  });

  test('a stdout flood is capped with the marker', async () => {
    const r = await py('print("x" * 1_000_000)');
    assert.equal(r.sc?.stdout_truncated, true, why(r));
    assert.equal(r.sc.reason, 'output_capped');
    assert.ok(r.sc.stdout.trimEnd().endsWith(marker(STDOUT_CAP)));
    assert.ok(r.sc.stdout.length <= STDOUT_CAP + marker(STDOUT_CAP).length + 2);
  });

  test('no network at all, and the server environment is invisible', async () => {
    const r = await sh(`tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo ---; env; echo ---; python3 -c "
import socket
try:
    socket.create_connection(('10.217.0.1', 16443), timeout=3); print('connected')
except OSError as e:
    print('refused', e.errno)"`);
    assert.equal(r.sc?.exit_code, 0, why(r));
    const [ifaces, env, conn] = r.sc.stdout.split('---\n');
    assert.equal(ifaces.trim(), 'lo', 'loopback is the only interface');
    assert.ok(!env.includes(canary), "the server's environment reaches no sandbox");
    assert.match(conn, /^refused/, 'the API server is out of reach');
  });

  test('bad arguments are refused without creating a pod', async () => {
    const before = await airlockObjects(ns, 'pods');
    const r = await call('run_python', { code: 'print(1)', timeout_s: -1 });
    assert.equal(r.isError, true);
    assert.equal(r.sc, undefined, 'refused before any run');
    const r2 = await call('run_shell', { command: 42 });
    assert.equal(r2.isError, true);
    assert.deepEqual(await airlockObjects(ns, 'pods'), before);
  });

  test('50 runs, right outputs, then no pod of a run, secret or config map of airlock left', async () => {
    const results = await Promise.all(Array.from({ length: 50 }, (_, i) => py(`print(${i} * 2)`)));
    results.forEach((r, i) => assert.equal(r.sc?.stdout, `${i * 2}\n`, why(r)));
    // Pods go after their answer: wait for the teardowns. Warm pods (no
    // run yet) stay while the server does.
    assert.ok(await waitFor(async () => (await airlockObjects(ns, 'pods', ',airlock.dev/run')).length === 0, 120_000),
      'every pod of a run gone after the runs');
    assert.deepEqual(await airlockObjects(ns, 'secrets'), []);
    assert.deepEqual(await airlockObjects(ns, 'configmaps'), []);
  });

  test('two airlock processes on one namespace: 40 calls, no pod served two', async () => {
    const second = await connect('airlock-e2e-k8s-second');
    try {
      // Each run must find /workspace unmarked: a pod that served an
      // earlier run would show that run's mark.
      const code = "import os\nprint(os.path.exists('/workspace/.used'))\nopen('/workspace/.used', 'w').close()";
      const results = await Promise.all(Array.from({ length: 40 }, (_, i) =>
        callWith(i % 2 ? second : client, 'run_python', { code })));
      results.forEach((r) => assert.equal(r.sc?.stdout, 'False\n', why(r)));
      assert.equal((await airlockObjects(ns, 'leases')).length, 2, 'one lease per process');
    } finally {
      await second.close();
    }
    assert.ok(await waitFor(async () => (await airlockObjects(ns, 'leases')).length === 1, 30_000), "the second process's lease gone with it");
  });

  test('a session outlives its airlock being SIGKILLed: another serves its next call, state intact', async () => {
    const first = await connect('airlock-e2e-k8s-killed');
    const created = await callWith(first, 'session_create', {});
    const sid = created.sc?.session_id;
    assert.ok(sid, why(created));
    const set = await callWith(first, 'run_python', { session_id: sid, code: 'x = 41' });
    assert.equal(set.isError, false, why(set));
    assert.ok(pids.get(first), 'the first airlock has a pid');
    process.kill(pids.get(first), 'SIGKILL');
    await first.close().catch(() => {});
    // The same user on stdio is the same client: the session is still its.
    const next = await call('run_python', { session_id: sid, code: 'print(x + 1)' });
    assert.equal(next.sc?.stdout, '42\n', why(next));
    // The dead airlock's Lease is swept by the live one, and with it its warm pods.
    assert.ok(await waitFor(async () => (await airlockObjects(ns, 'leases')).length === 1, 60_000), 'the killed airlock\'s lease removed');
    const closed = await call('session_close', { session_id: sid });
    assert.equal(closed.isError, false, why(closed));
    assert.ok(await waitFor(async () => (await airlockObjects(ns, 'pods', ',airlock.dev/session')).length === 0, 60_000), 'the session pod gone');
  });

  test('closing the client removes the instance lease and its warm pods', async () => {
    assert.equal((await airlockObjects(ns, 'leases')).length, 1, 'one lease while serving');
    await client.close();
    client = null;
    assert.ok(await waitFor(async () => (await airlockObjects(ns, 'pods')).length === 0, 60_000), 'every pod gone after the client left');
    assert.ok(await waitFor(async () => (await airlockObjects(ns, 'leases')).length === 0, 30_000), 'the lease gone after the client left');
  });
});
