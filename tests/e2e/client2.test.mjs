// End-to-end tests with the 2026-07-28 generation of the official TypeScript
// SDK, @modelcontextprotocol/client 2.x, against the built airlock over
// stdio and streamable HTTP: what it negotiates, runs, sessions, approval
// through multi round-trip input requests, and cancellation. The 1.x SDK
// (@modelcontextprotocol/sdk), which the rest of the suite drives, still
// gets the 2025-11-25 protocol. Every sandbox is a real gVisor one.
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import { PROTOCOL_VERSION_META_KEY } from '@modelcontextprotocol/client';

import { assertNoLeftovers, callWith, callWith2, sandboxExists, startDaemon, startServer, waitFor } from './lib.mjs';

const MODERN = '2026-07-28';
const LEGACY = '2025-11-25';
/** The 2.x client's negotiation is opt-in; 'auto' probes server/discover first. */
const AUTO = { versionNegotiation: { mode: 'auto' } };

const TOOLS = ['cancel_run', 'list_files', 'list_runs', 'read_file', 'run_python', 'run_shell',
  'session_close', 'session_create', 'session_fork', 'session_list', 'session_pause', 'write_file'];

/** Code that prints its run's first line at once, then sleeps. */
const LONG = 'import time\nprint("started", flush=True)\ntime.sleep(120)\n';

/** The run id in a progress message "[RUNID stdout] …". */
const runIdOf = (p) => /^\[([0-9a-f]{16}) /.exec(p.message ?? '')?.[1];

/** The tests both transports share; call(name, args, opts) calls a tool with the 2.x client. */
function sharedTests(kind, w, client, call) {
  test(`${kind}: the 2.x client negotiated ${MODERN}`, w(async () => {
    const c = client();
    assert.equal(c.getNegotiatedProtocolVersion(), MODERN);
    assert.equal(c.getProtocolEra(), 'modern');
    assert.equal(c.getServerVersion()?.name, 'airlock', 'server/discover named the server');
    assert.ok(c.getServerCapabilities()?.tools, `tools capability: ${JSON.stringify(c.getServerCapabilities())}`);
  }));

  test(`${kind}: tools/list has run_python with its schemas`, w(async () => {
    const { tools } = await client().listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), TOOLS);
    const py = tools.find((t) => t.name === 'run_python');
    assert.deepEqual(py.inputSchema.required, ['code']);
    assert.ok('stdout' in py.outputSchema.properties, 'run_python has an outputSchema with stdout');
  }));

  test(`${kind}: run_python returns its stdout in structuredContent`, w(async () => {
    const r = await call('run_python', { code: `print(6 * 7, "${kind}")` });
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc.stdout, `42 ${kind}\n`);
    assert.equal(r.sc.exit_code, 0);
    assert.match(r.sc.run_id, /^[0-9a-f]{16}$/);
  }));

  test(`${kind}: a session keeps a variable between calls, then closes`, w(async () => {
    const created = await call('session_create', {});
    assert.equal(created.isError, false, created.text);
    const id = created.sc.session_id;
    assert.match(id, /^s[0-9a-f]+$/);
    const a = await call('run_python', { code: 'x = 41', session_id: id });
    assert.equal(a.isError, false, a.text);
    const b = await call('run_python', { code: 'print(x + 1)', session_id: id });
    assert.equal(b.isError, false, b.text);
    assert.equal(b.sc.stdout, '42\n');
    assert.equal(b.sc.session_id, id);
    const closed = await call('session_close', { session_id: id });
    assert.equal(closed.isError, false, closed.text);
    const gone = await call('run_python', { code: 'print(x)', session_id: id });
    assert.equal(gone.isError, true, gone.text);
    assert.match(gone.text, /No session/);
  }));

  test(`${kind}: aborting the call's signal kills the run's sandbox within 1 s`, w(async (t) => {
    const ac = new AbortController();
    let runId;
    let progress = 0;
    const pending = call('run_python', { code: LONG }, {
      signal: ac.signal,
      onprogress: (p) => { progress++; runId ??= runIdOf(p); },
    }).then((r) => r, (e) => e);
    // As in hosted.test.mjs: the first progress message ("[RUN stdout]
    // started") names the run once its code runs.
    await waitFor(() => runId, 30_000, 50);
    assert.ok(runId, `no progress notification named the run (${progress} notifications)`);
    assert.ok(await sandboxExists(runId), 'sandbox running before the abort');
    const t0 = performance.now();
    ac.abort();
    const gone = await waitFor(async () => !(await sandboxExists(runId)), 5_000, 50);
    const ms = performance.now() - t0;
    const r = await pending;
    assert.ok(r instanceof Error, `the aborted call resolved instead of rejecting: ${r?.text}`);
    assert.ok(gone, `sandbox of run ${runId} still there 5 s after the abort`);
    assert.ok(ms <= 1000, `sandbox of run ${runId} gone after ${Math.round(ms)} ms, want within 1 s`);
    // The server saw a cancellation, not an ordinary end.
    const info = await waitFor(async () => {
      const x = (await call('list_runs', {})).sc?.runs?.find((y) => y.run_id === runId);
      return x?.state === 'finished' ? x : null;
    }, 5_000, 100);
    assert.equal(info?.outcome, 'cancelled', `list_runs: ${JSON.stringify(info)}`);
    t.diagnostic(`run ${runId}: sandbox gone ${Math.round(ms)} ms after the abort (${r.name}: ${r.message.split('\n')[0]})`);
  }));
}

describe('2.x client over stdio', { timeout: 10 * 60_000 }, () => {
  let srv;
  const w = (fn) => async (t) => srv.wrap(fn)(t);

  before(async () => {
    srv = await startServer('client2-stdio', [], { client2: AUTO });
  });
  after(async () => {
    await srv?.close();
  });

  test('stdio: no initialize; every request carries the 2026-07-28 _meta envelope', w(async () => {
    assert.match(srv.instanceId ?? '', /^[0-9a-f]{12}$/, 'the session process\'s instance');
    await srv.client.listTools();
    const requests = srv.sent.filter((m) => m.method && m.id !== undefined);
    assert.ok(requests.length > 0);
    assert.ok(!requests.some((m) => m.method === 'initialize'), `the session process got initialize: ${JSON.stringify(requests.map((m) => m.method))}`);
    for (const m of requests) assert.equal(m.params?._meta?.[PROTOCOL_VERSION_META_KEY], MODERN, `${m.method}: _meta ${JSON.stringify(m.params?._meta)}`);
  }));

  sharedTests('stdio', w, () => srv.client, (name, args, opts) => srv.call2(name, args, opts));

  test('stdio: the abort reached the server as notifications/cancelled in the 2026-07-28 envelope', w(async () => {
    const cancels = srv.sent.filter((m) => m.method === 'notifications/cancelled');
    assert.equal(cancels.length, 1, JSON.stringify(cancels));
    assert.equal(cancels[0].params._meta?.[PROTOCOL_VERSION_META_KEY], MODERN);
    const call = srv.sent.find((m) => m.id === cancels[0].params.requestId);
    assert.equal(call?.params?.name, 'run_python', 'it names the run_python request');
  }));

  test('stdio: nothing is left behind, of this server or of its probe siblings', w(async () => {
    // The audit counts every airlock container, mount and task of this
    // containerd, so a dead instance's leftovers (the sibling the 2.x stdio
    // transport spawned to probe server/discover, then killed) fail it too.
    await assertNoLeftovers({ instanceId: srv.instanceId, runIds: srv.runIds });
  }));
});

describe('2.x client: approval through a multi round-trip input request (stdio)', { timeout: 10 * 60_000 }, () => {
  let srv;
  const user = {
    shown: [],
    next: { action: 'decline' },
    onElicit: async (req) => {
      user.shown.push(req.params.message);
      return user.next;
    },
  };
  const w = (fn) => async (t) => srv.wrap(fn)(t);

  before(async () => {
    srv = await startServer('client2-approval', ['approval: {mode: always, timeout: 4s, console: {listen: ""}}'],
      { client2: AUTO, onElicit: user.onElicit });
  });
  after(async () => {
    await srv?.close();
  });

  /** The tools/call requests the client sent from index `from` on. */
  const callsSince = (from) => srv.sent.slice(from).filter((m) => m.method === 'tools/call');

  test('accept: the client answers the input request, retries, and the code runs', w(async () => {
    assert.equal(srv.client.getNegotiatedProtocolVersion(), MODERN);
    user.next = { action: 'accept', content: { approve: true } };
    const shown = user.shown.length;
    const sent = srv.sent.length;
    const received = srv.received.length;
    const r = await srv.python("print('approved-' + 'run')");
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc.stdout, 'approved-run\n');
    assert.equal(user.shown.length, shown + 1, 'the user was asked once');
    assert.match(user.shown.at(-1), /Approve this run_python call\?/);
    assert.match(user.shown.at(-1), /print\('approved-' \+ 'run'\)/);
    // On the wire: the first call came back input_required with the
    // question; the retry carried the answer and the request state.
    const asked = srv.received.slice(received).find((m) => m.result?.resultType === 'input_required');
    assert.ok(asked, `no input_required result among ${JSON.stringify(srv.received.slice(received)).slice(0, 2000)}`);
    assert.equal(asked.result.inputRequests?.airlock_approval?.method, 'elicitation/create', JSON.stringify(asked.result));
    assert.ok(asked.result.requestState, 'the input request has a request state');
    const calls = callsSince(sent);
    assert.equal(calls.length, 2, `tools/call requests: ${JSON.stringify(calls)}`);
    assert.equal(calls[0].params.inputResponses, undefined);
    assert.deepEqual(calls[1].params.inputResponses?.airlock_approval, { action: 'accept', content: { approve: true } });
    assert.equal(calls[1].params.requestState, asked.result.requestState);
    assert.ok(!srv.received.some((m) => m.method === 'elicitation/create'), 'no server-to-client elicitation/create request on a 2026-07-28 connection');
  }));

  test('decline and cancel: "Not run", no run result, no sandbox', w(async () => {
    for (const action of ['decline', 'cancel']) {
      user.next = { action };
      const shown = user.shown.length;
      const r = await srv.shell('echo should-not-run');
      assert.equal(user.shown.length, shown + 1, `${action}: the user was asked once`);
      assert.equal(r.isError, true, `${action}: ${r.text}`);
      assert.match(r.text, /^Not run:/, action);
      assert.equal(r.sc, undefined, `${action}: a denial has no run result`);
    }
    await assertNoLeftovers({ instanceId: srv.instanceId });
  }));
});

describe('2.x client over streamable HTTP, with the 1.x SDK beside it', { timeout: 10 * 60_000 }, () => {
  let d, token, c;
  const wire = [];
  const w = (fn) => async (t) => d.wrap(fn)(t);

  before(async () => {
    d = await startDaemon('client2-http');
    token = await d.addToken('alice');
    c = await d.client2(token, { options: AUTO, onRequest: (url, init) => wire.push({ method: init.method, headers: init.headers, body: init.body }) });
  });
  after(async () => {
    await c?.close();
    const e = await d?.stop();
    assert.equal(e?.code, 0, `daemon exit ${JSON.stringify(e)}`);
  });

  test('http: stateless: server/discover instead of initialize, the version header on every POST, no session id', w(async () => {
    await c.listTools();
    const posts = wire.filter((x) => x.method === 'POST').map((x) => ({ ...x, msg: JSON.parse(x.body) }));
    assert.equal(posts[0].msg.method, 'server/discover', `first request: ${posts[0].body}`);
    assert.ok(!posts.some((x) => x.msg.method === 'initialize'), 'no initialize');
    for (const x of posts) {
      assert.equal(x.headers.get('mcp-protocol-version'), MODERN, `${x.msg.method}: MCP-Protocol-Version`);
      assert.equal(x.headers.get('mcp-session-id'), null, `${x.msg.method}: Mcp-Session-Id`);
    }
    assert.equal(c.transport.sessionId, undefined, 'no MCP session');
  }));

  sharedTests('http', w, () => c, (name, args, opts) => callWith2(c, name, args, opts));

  test('http: the abort closed the request; no notifications/cancelled was posted', w(async () => {
    const methods = wire.filter((x) => x.method === 'POST').map((x) => JSON.parse(x.body).method);
    assert.ok(methods.includes('tools/call'));
    assert.ok(!methods.includes('notifications/cancelled'), methods.join(','));
  }));

  test('http: the 2.x client without versionNegotiation stays on 2025-11-25 and works', w(async () => {
    const legacy = await d.client2(token);
    try {
      assert.equal(legacy.getNegotiatedProtocolVersion(), LEGACY);
      assert.equal(legacy.getProtocolEra(), 'legacy');
      const r = await callWith2(legacy, 'run_python', { code: 'print("legacy-2x")' });
      assert.equal(r.sc.stdout, 'legacy-2x\n', r.text);
    } finally {
      await legacy.close();
    }
  }));

  test('http: the 1.x SDK negotiates 2025-11-25', w(async () => {
    const old = await d.client('http', token);
    try {
      assert.equal(old.transport.protocolVersion, LEGACY);
      assert.ok(old.transport.sessionId, 'a 2025-11-25 client has an MCP session');
      const r = await callWith(old, 'run_python', { code: 'print("sdk-1x")' });
      assert.equal(r.sc.stdout, 'sdk-1x\n', r.text);
    } finally {
      await old.close();
    }
  }));

  test('http: nothing of this daemon is left behind', w(async () => {
    await assertNoLeftovers({ instanceId: d.instanceId });
  }));
});

describe('2.x client: approval through a multi round-trip input request (streamable HTTP, stateless)', { timeout: 10 * 60_000 }, () => {
  let d, c;
  const wire = [];
  const user = { shown: [], next: { action: 'decline' } };
  const w = (fn) => async (t) => d.wrap(fn)(t);

  before(async () => {
    d = await startDaemon('client2-http-approval', { approval: { mode: 'always', timeout: '4s', console: { listen: '' } } });
    const token = await d.addToken('carol');
    c = await d.client2(token, {
      options: AUTO,
      onElicit: async (req) => {
        user.shown.push(req.params.message);
        return user.next;
      },
      onRequest: (url, init) => wire.push({ method: init.method, body: init.body }),
    });
  });
  after(async () => {
    await c?.close();
    const e = await d?.stop();
    assert.equal(e?.code, 0, `daemon exit ${JSON.stringify(e)}`);
  });

  /** The tools/call requests the client posted from index `from` on. */
  const callsSince = (from) => wire.slice(from).filter((x) => x.method === 'POST')
    .map((x) => JSON.parse(x.body)).filter((m) => m.method === 'tools/call');

  test('accept: the answer comes back on a second POST with the request state, and the code runs', w(async () => {
    assert.equal(c.getNegotiatedProtocolVersion(), MODERN);
    user.next = { action: 'accept', content: { approve: true } };
    const shown = user.shown.length;
    const sent = wire.length;
    const r = await callWith2(c, 'run_python', { code: "print('http-' + 'approved')" });
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc.stdout, 'http-approved\n');
    assert.equal(user.shown.length, shown + 1, 'the user was asked once');
    assert.match(user.shown.at(-1), /print\('http-' \+ 'approved'\)/);
    const calls = callsSince(sent);
    assert.equal(calls.length, 2, `tools/call requests: ${JSON.stringify(calls)}`);
    assert.equal(calls[0].params.inputResponses, undefined);
    assert.deepEqual(calls[1].params.inputResponses?.airlock_approval, { action: 'accept', content: { approve: true } });
    assert.ok(calls[1].params.requestState, 'the retry carries the request state');
  }));

  test('decline: "Not run", no run result, no sandbox', w(async () => {
    user.next = { action: 'decline' };
    const shown = user.shown.length;
    const r = await callWith2(c, 'run_shell', { command: 'echo should-not-run' });
    assert.equal(user.shown.length, shown + 1, 'the user was asked once');
    assert.equal(r.isError, true, r.text);
    assert.match(r.text, /^Not run:/);
    assert.equal(r.sc, undefined, 'a denial has no run result');
    await assertNoLeftovers({ instanceId: d.instanceId });
  }));
});
