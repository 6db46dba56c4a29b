// End-to-end tests of hosted mode: the built airlock as a daemon serving
// streamable HTTP and legacy SSE, driven by the official TypeScript SDK
// clients with bearer tokens. Runs are real gVisor sandboxes.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';

import { AIRLOCK_BIN, assertNoLeftovers, auditRecords, callWith, sandboxExists, sleep, startDaemon, waitFor } from './lib.mjs';

const execFileP = promisify(execFile);

/** Code that prints its run's first line at once, then sleeps. */
const LONG = 'import time\nprint("started", flush=True)\ntime.sleep(120)\n';

/** Calls a tool, collecting progress notifications; returns them with the result. */
async function callWithProgress(client, name, args, opts = {}) {
  const progress = [];
  const r = await callWith(client, name, args, { onprogress: (p) => progress.push(p), ...opts });
  return { ...r, progress };
}

/** The run id in a progress message "[RUNID stdout] …". */
const runIdOf = (p) => /^\[([0-9a-f]{16}) /.exec(p.message ?? '')?.[1];

describe('hosted mode: streamable HTTP and SSE with tokens', { timeout: 15 * 60_000 }, () => {
  let d, alice, bob;
  const w = (fn) => async (t) => d.wrap(fn)(t);

  before(async () => {
    d = await startDaemon('hosted');
    alice = await d.addToken('alice');
    bob = await d.addToken('bob');
  });
  after(async () => {
    const e = await d?.stop();
    assert.equal(e?.code, 0, `daemon exit ${JSON.stringify(e)}`);
  });

  for (const kind of ['http', 'sse']) {
    test(`${kind}: list tools and run Python`, w(async () => {
      const c = await d.client(kind, alice);
      try {
        const { tools } = await c.listTools();
        assert.deepEqual(tools.map((t) => t.name).sort(), ['cancel_run', 'list_files', 'list_runs', 'read_file', 'run_python', 'run_shell',
          'session_close', 'session_create', 'session_fork', 'session_list', 'session_pause', 'write_file']);
        const r = await callWith(c, 'run_python', { code: `print(6 * 7, "${kind}")` });
        assert.equal(r.isError, false, r.text);
        assert.equal(r.sc.stdout, `42 ${kind}\n`);
      } finally {
        await c.close();
      }
    }));

    test(`${kind}: progress notifications stream a run's output while it runs`, w(async () => {
      const c = await d.client(kind, alice);
      try {
        const code = 'import time\nfor i in range(5):\n    print("line", i, flush=True)\n    time.sleep(0.6)\n';
        const t0 = performance.now();
        const stamps = [];
        const r = await callWithProgress(c, 'run_python', { code }, { onprogress: (p) => stamps.push({ p, at: performance.now() - t0 }) });
        assert.equal(r.isError, false, r.text);
        assert.ok(stamps.length >= 3, `only ${stamps.length} progress notifications: ${JSON.stringify(stamps)}`);
        const streamed = stamps.map((s) => s.p.message).join('');
        for (let i = 0; i < 5; i++) assert.match(streamed, new RegExp(`line ${i}\\n`));
        assert.ok(stamps[0].at < r.ms - 1500, `first notification at ${stamps[0].at} ms of ${r.ms} ms: not streamed while running`);
        for (let i = 1; i < stamps.length; i++) assert.ok(stamps[i].p.progress > stamps[i - 1].p.progress, 'progress increases');
        assert.equal(r.sc.stdout, 'line 0\nline 1\nline 2\nline 3\nline 4\n', 'the result still has all the output');
      } finally {
        await c.close();
      }
    }));

    test(`${kind}: cancelling a long run kills its sandbox within 1 s`, w(async () => {
      const c = await d.client(kind, alice);
      try {
        const ac = new AbortController();
        let runId;
        const call = callWith(c, 'run_python', { code: LONG }, {
          signal: ac.signal,
          onprogress: (p) => { runId ??= runIdOf(p); },
        }).catch((e) => e);
        await waitFor(() => runId, 30_000, 50);
        assert.ok(runId, 'no progress notification named the run');
        assert.ok(await sandboxExists(runId), 'sandbox running before the cancel');
        const t0 = performance.now();
        ac.abort();
        const gone = await waitFor(async () => !(await sandboxExists(runId)), 5_000, 50);
        const ms = performance.now() - t0;
        assert.ok(gone, 'sandbox still there 5 s after the cancel');
        assert.ok(ms <= 1000, `sandbox gone after ${Math.round(ms)} ms, want within 1 s`);
        await call;
      } finally {
        await c.close();
      }
    }));

    test(`${kind}: a dropped connection kills the run's sandbox within 1 s`, w(async () => {
      const c = await d.client(kind, alice);
      let runId;
      const call = callWith(c, 'run_python', { code: LONG }, { onprogress: (p) => { runId ??= runIdOf(p); } }).catch((e) => e);
      await waitFor(() => runId, 30_000, 50);
      assert.ok(runId);
      const t0 = performance.now();
      await c.close(); // closes the streams without a cancellation message
      const gone = await waitFor(async () => !(await sandboxExists(runId)), 5_000, 50);
      const ms = performance.now() - t0;
      assert.ok(gone && ms <= 1000, `sandbox gone=${gone} after ${Math.round(ms)} ms, want within 1 s`);
      await call;
    }));
  }

  test('auth: no token, wrong token, right token', w(async () => {
    const init = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '0' } } });
    const post = (headers) => fetch(`${d.url}/mcp`, { method: 'POST', body: init, headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...headers } });
    const none = await post({});
    assert.equal(none.status, 401);
    assert.match(none.headers.get('www-authenticate'), /^Bearer realm="airlock"/);
    const wrong = await post({ Authorization: 'Bearer alk_wrong' });
    assert.equal(wrong.status, 401);
    assert.match(wrong.headers.get('www-authenticate'), /invalid_token/);
    const right = await post({ Authorization: `Bearer ${alice}` });
    assert.equal(right.status, 200);
    const sse = await fetch(`${d.url}/sse`, { headers: { Accept: 'text/event-stream' } });
    assert.equal(sse.status, 401, 'the SSE stream needs a token too');
    await sse.body?.cancel();
    // Health needs none, and says nothing secret.
    assert.equal((await fetch(`${d.url}/healthz`)).status, 200);
    assert.deepEqual(await (await fetch(`${d.url}/readyz`)).json(), { status: 'ready' });
  }));

  test('auth: the token file is re-read; revoked tokens stop working', w(async () => {
    const carol = await d.addToken('carol');
    await sleep(1200); // re-read at most once a second
    const c = await d.client('http', carol);
    assert.equal((await callWith(c, 'run_shell', { command: 'echo carol' })).sc.stdout, 'carol\n');
    await c.close();
    const lines = (await readFile(d.tokenFile, 'utf8')).split('\n').filter((l) => l && !l.startsWith('carol:'));
    await writeFile(d.tokenFile, lines.join('\n') + '\n');
    await sleep(1200);
    await assert.rejects(d.client('http', carol), /401|Unauthorized/);
  }));

  test('a foreign Origin is refused', w(async () => {
    const r = await fetch(`${d.url}/mcp`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${alice}`, Origin: 'http://evil.example', 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
      body: '{}',
    });
    assert.equal(r.status, 403);
  }));

  test('isolation: client B can neither see, cancel, nor post into client A\'s runs', w(async () => {
    const a = await d.client('http', alice);
    const b = await d.client('http', bob);
    try {
      let runId;
      const call = callWith(a, 'run_python', { code: 'import time\nprint("a-started", flush=True)\ntime.sleep(3)\nprint("a-done")' },
        { onprogress: (p) => { runId ??= runIdOf(p); } });
      await waitFor(() => runId, 30_000, 50);
      const bList = await callWith(b, 'list_runs', {});
      assert.ok(!JSON.stringify(bList.sc).includes(runId), 'B sees A\'s run');
      const bCancel = await callWith(b, 'cancel_run', { run_id: runId });
      assert.equal(bCancel.isError, true);
      assert.match(bCancel.text, /No run/);
      // B posting into A's MCP session, knowing its id, reads as no session.
      const aSession = a.transport.sessionId;
      assert.ok(aSession);
      const hijack = await fetch(`${d.url}/mcp`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${bob}`, 'Mcp-Session-Id': aSession, 'Mcp-Protocol-Version': '2025-11-25', 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
        body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 1 } }),
      });
      assert.equal(hijack.status, 404);
      const aList = await callWith(a, 'list_runs', {});
      assert.ok(JSON.stringify(aList.sc).includes(runId), 'A sees its own run');
      const r = await call;
      assert.equal(r.isError, false, r.text);
      assert.equal(r.sc.stdout, 'a-started\na-done\n', 'A\'s run was not disturbed');
      const rec = (await auditRecords(d.auditFile)).find((x) => x.id === runId);
      assert.equal(rec?.client, 'token:alice');
      assert.equal(rec?.transport, 'http+sse');
    } finally {
      await a.close();
      await b.close();
    }
  }));
});

describe('hosted mode: refusing to start exposed without auth', { timeout: 2 * 60_000 }, () => {
  test('a non-loopback listener without tokens does not start', async () => {
    const { freePort } = await import('./lib.mjs');
    const port = await freePort();
    const dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_exposed_'));
    const cfg = path.join(dir, 'config.yaml');
    await writeFile(cfg, `auth: {token_file: ${JSON.stringify(path.join(dir, 'none.tokens'))}}\nserver: {socket: ""}\n`);
    const t0 = performance.now();
    const r = await new Promise((resolve) => {
      execFile(AIRLOCK_BIN, ['serve', '--transport', 'http', '--listen', `0.0.0.0:${port}`, '--config', cfg],
        { timeout: 60_000, env: { PATH: process.env.PATH } },
        (err, stdout, stderr) => resolve({ code: err?.code ?? 0, stderr }));
    });
    await rm(dir, { recursive: true, force: true });
    assert.ok(performance.now() - t0 < 5000, 'the refusal comes before the runtime starts');
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /refusing to serve on 0\.0\.0\.0:\d+ without authentication/);
    assert.match(r.stderr, /auth\.allow_unauthenticated/);
  });
});

describe('hosted mode: 40 calls from 8 clients against 4 sandboxes', { timeout: 10 * 60_000 }, () => {
  let d, token;
  before(async () => {
    d = await startDaemon('concurrency', { limits: { concurrency: 4, queue: 8, queue_wait_s: 20, per_client_concurrency: 10, per_client_runs_per_minute: 1000 } });
    token = await d.addToken('load');
  });
  after(async () => {
    const e = await d?.stop();
    assert.equal(e?.code, 0);
  });

  test('every call completes with its own output or gets a quick busy answer; nothing leaks', async () => {
    const clients = await Promise.all(Array.from({ length: 8 }, (_, i) => d.client(i % 2 ? 'sse' : 'http', token, { name: `load-${i}` })));
    const t0 = performance.now();
    const calls = [];
    for (let i = 0; i < 8; i++) {
      for (let j = 0; j < 5; j++) {
        const marker = `client-${i}-call-${j}`;
        calls.push(callWith(clients[i], 'run_shell', { command: `sleep 1; echo ${marker}` }).then((r) => ({ r, marker })));
      }
    }
    const results = await Promise.all(calls);
    const total = performance.now() - t0;
    let ok = 0, busy = 0;
    for (const { r, marker } of results) {
      if (!r.isError) {
        ok++;
        assert.equal(r.sc.stdout, marker + '\n', 'output matches its caller');
      } else {
        busy++;
        assert.match(r.text, /busy/i, `an error other than busy: ${r.text}`);
        assert.ok(r.ms < 25_000, `busy after ${r.ms} ms`);
      }
    }
    assert.equal(ok + busy, 40);
    assert.ok(ok >= 12, `only ${ok} of 40 ran (4 slots + 8 queued at the least)`);
    assert.ok(total < 120_000, `took ${total} ms`);
    await Promise.all(clients.map((c) => c.close()));
    await assertNoLeftovers({ instanceId: d.instanceId });
  });
});

describe('hosted mode: SIGTERM', { timeout: 10 * 60_000 }, () => {
  // Another instance keeps the shared containerd up, so what the stopped
  // daemon left (or not) can still be looked at.
  let keeper;
  before(async () => { keeper = await startDaemon('keeper'); });
  after(async () => { await keeper?.stop(); });

  test('runs in flight finish within the grace; exit 0; nothing left', async () => {
    const d = await startDaemon('sigterm-grace', { server: { shutdown_grace: '20s' } });
    const token = await d.addToken('t');
    const c = await d.client('http', token);
    const runs = [];
    const calls = [1, 2, 3].map((i) => callWith(c, 'run_shell', { command: `echo start-${i}; sleep 3; echo done-${i}` },
      { onprogress: (p) => { const id = runIdOf(p); if (id && !runs.includes(id)) runs.push(id); } }));
    await waitFor(() => runs.length === 3, 30_000, 50);
    const t0 = performance.now();
    d.proc.kill('SIGTERM');
    const results = await Promise.all(calls);
    for (const [i, r] of results.entries()) {
      assert.equal(r.isError, false, r.text);
      assert.equal(r.sc.stdout, `start-${i + 1}\ndone-${i + 1}\n`);
    }
    const e = await d.exited;
    const ms = performance.now() - t0;
    assert.deepEqual(e, { code: 0, signal: null });
    assert.ok(ms < 20_000, `exit after ${ms} ms`);
    await c.close();
    await assertNoLeftovers({ instanceId: d.instanceId, runIds: runs }).catch((e) => { throw d.annotate(e); });
    await d.stop();
  });

  test('runs past the grace are killed; exit 0 soon after; nothing left', async () => {
    const d = await startDaemon('sigterm-kill', { server: { shutdown_grace: '2s' } });
    const token = await d.addToken('t');
    const c = await d.client('sse', token);
    let runId;
    const call = callWith(c, 'run_python', { code: LONG }, { onprogress: (p) => { runId ??= runIdOf(p); } }).catch((e) => e);
    await waitFor(() => runId, 30_000, 50);
    const t0 = performance.now();
    d.proc.kill('SIGTERM');
    const e = await d.exited;
    const ms = performance.now() - t0;
    assert.deepEqual(e, { code: 0, signal: null });
    assert.ok(ms < 8000, `exit after ${ms} ms with a 2 s grace`);
    const r = await call;
    if (!(r instanceof Error)) assert.match(r.text, /shutting down/);
    await c.close(); // or its event source would try to reconnect forever
    assert.equal(await sandboxExists(runId), false);
    await assertNoLeftovers({ instanceId: d.instanceId, runIds: [runId] }).catch((e) => { throw d.annotate(e); });
    await d.stop();
  });
});
