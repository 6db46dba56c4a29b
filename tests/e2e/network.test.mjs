// End-to-end: a networked run through the MCP client. The "internet" is a
// network namespace this test creates, joined to the host by a veth, with an
// HTTP server inside on 10.78.0.2; no traffic goes anywhere else.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';

import { freePort, parseMetrics, sleep, startServer, waitFor } from './lib.mjs';

const run = promisify(execFile);
const NS = 'airlock_e2e_inet';
const HOST_IP = '10.78.0.1';
const INET_IP = '10.78.0.2';

const NETWORK_CONFIG = [
  'network:',
  '  allow_domains: [allowed.test]',
  `  hosts: [{name: allowed.test, addrs: ["${INET_IP}"]}, {name: other.test, addrs: ["${INET_IP}"]}]`,
  '  allow_private: [10.78.0.0/24]',
  '  bridge: airlocke0',
  '  subnet: 10.89.251.0/24',
  '  proxy_port: 3130',
];

describe('networked runs over MCP', { timeout: 5 * 60_000 }, () => {
  let srv;
  let web;
  let dir;

  before(async () => {
    await run('ip', ['netns', 'del', NS]).catch(() => {});
    await run('ip', ['link', 'del', 've2e-h']).catch(() => {});
    await run('ip', ['netns', 'add', NS]);
    await run('ip', ['link', 'add', 've2e-h', 'type', 'veth', 'peer', 'name', 've2e-n']);
    await run('ip', ['link', 'set', 've2e-n', 'netns', NS]);
    await run('ip', ['addr', 'add', `${HOST_IP}/24`, 'dev', 've2e-h']);
    await run('ip', ['link', 'set', 've2e-h', 'up']);
    await run('ip', ['-n', NS, 'addr', 'add', `${INET_IP}/24`, 'dev', 've2e-n']);
    await run('ip', ['-n', NS, 'link', 'set', 've2e-n', 'up']);
    dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_www_'));
    await writeFile(path.join(dir, 'hello.txt'), 'hello over mcp\n');
    web = spawn('ip', ['netns', 'exec', NS, '/usr/bin/python3', '-m', 'http.server', '80', '--bind', INET_IP, '--directory', dir], { stdio: 'ignore' });
    for (let i = 0; i < 50; i++) {
      try {
        await run('/usr/bin/python3', ['-c', `import socket; socket.create_connection(("${INET_IP}", 80), timeout=1)`]);
        break;
      } catch {
        await sleep(100);
      }
    }
    srv = await startServer('network', NETWORK_CONFIG);
  });

  after(async () => {
    await srv?.close().catch(() => {});
    web?.kill();
    await run('ip', ['netns', 'del', NS]).catch(() => {});
    await run('ip', ['link', 'del', 've2e-h']).catch(() => {});
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test('tools advertise the network arguments and the allowed domain', async () => {
    const { tools } = await srv.client.listTools();
    const shell = tools.find((t) => t.name === 'run_shell');
    assert.deepEqual(Object.keys(shell.inputSchema.properties).sort(), ['allow_domains', 'command', 'network', 'session_id', 'timeout_s']);
    const create = tools.find((t) => t.name === 'session_create');
    assert.deepEqual(Object.keys(create.inputSchema.properties).sort(), ['allow_domains', 'network', 'timeout_idle_s']);
    assert.match(shell.description, /allowed\.test/);
    assert.equal(shell.annotations.openWorldHint, true);
  });

  test('an allowed name is fetched; another is refused and reported', async () => {
    const ok = await srv.shell('curl -sS --max-time 10 http://allowed.test/hello.txt', { network: 'allowlist' });
    assert.equal(ok.isError, false, ok.text);
    assert.equal(ok.sc.stdout, 'hello over mcp\n');
    assert.deepEqual(ok.sc.egress_denied, []);

    const no = await srv.shell('curl -fsS --max-time 10 http://other.test/hello.txt', { network: 'allowlist' });
    assert.equal(no.isError, true);
    assert.deepEqual(no.sc.egress_denied, [{ host: 'other.test', port: 80, reason: 'not in allow-list' }]);
    assert.match(no.text, /other\.test:80: not in allow-list/);
  });

  test('a session keeps the network it was created with; each call reports its own refusals', async () => {
    const created = await srv.call('session_create', { network: 'allowlist' });
    assert.equal(created.isError, false, created.text);
    const id = created.sc.session_id;
    assert.equal(created.sc.network, 'allowlist');
    assert.deepEqual(created.sc.allow_domains, ['allowed.test']);
    try {
      const no = await srv.shell('curl -fsS --max-time 10 http://other.test/hello.txt', { session_id: id });
      assert.equal(no.isError, true);
      assert.deepEqual(no.sc.egress_denied, [{ host: 'other.test', port: 80, reason: 'not in allow-list' }]);
      const ok = await srv.shell('curl -sS --max-time 10 http://allowed.test/hello.txt', { session_id: id });
      assert.equal(ok.sc.stdout, 'hello over mcp\n', ok.text);
      assert.deepEqual(ok.sc.egress_denied, [], 'the earlier call\'s refusal is not this one\'s');
      const py = await srv.python('import urllib.request\nurllib.request.urlopen("http://allowed.test/hello.txt", timeout=10).read().decode()', { session_id: id });
      assert.equal(py.sc.display, "'hello over mcp\\n'", py.text);
      const change = await srv.shell('true', { session_id: id, network: 'none' });
      assert.equal(change.isError, true);
      assert.match(change.text, /chosen at session_create/);
      const grant = await srv.call('session_create', { network: 'allowlist', allow_domains: ['other.test'] });
      assert.equal(grant.isError, true);
    } finally {
      await srv.call('session_close', { session_id: id });
    }
    const offline = await srv.call('session_create', {});
    const off = await srv.shell('curl -sS --max-time 5 http://allowed.test/hello.txt', { session_id: offline.sc.session_id });
    assert.equal(off.isError, true);
    assert.doesNotMatch(off.sc.stdout, /hello over mcp/);
    await srv.call('session_close', { session_id: offline.sc.session_id });
  });

  test('a CONNECT tunnel to an allowed name on a plain-HTTP port cannot carry another Host', async () => {
    // What curl --connect-to does, by hand: CONNECT allowed.test:80, then
    // a request for denied.test inside the tunnel.
    const code = [
      'import os, socket, urllib.parse',
      'u = urllib.parse.urlparse(os.environ["HTTP_PROXY"])',
      's = socket.create_connection((u.hostname, u.port), timeout=10)',
      's.sendall(b"CONNECT allowed.test:80 HTTP/1.1\\r\\nHost: allowed.test:80\\r\\n\\r\\n")',
      'print(s.recv(4096).split(b"\\r\\n")[0].decode())',
      's.sendall(b"GET /hello.txt HTTP/1.1\\r\\nHost: denied.test\\r\\nConnection: close\\r\\n\\r\\n")',
      'got = b""',
      'while True:',
      '    try:',
      '        b = s.recv(4096)',
      '    except OSError:',
      '        break',
      '    if not b:',
      '        break',
      '    got += b',
      'print("inside:", got.decode(errors="replace") or "(closed)")',
    ].join('\n');
    const r = await srv.python(code, { network: 'allowlist' });
    assert.match(r.sc.stdout, /^HTTP\/1\.1 200/m, r.text);
    assert.match(r.sc.stdout, /inside: \(closed\)/, 'the tunnel closed instead of carrying plain HTTP');
    assert.doesNotMatch(r.sc.stdout, /hello over mcp/);
    assert.deepEqual(r.sc.egress_denied, [{ host: 'allowed.test', port: 80, reason: 'SNI mismatch' }]);
    // Plain HTTP still works the proxy's way, with the Host it sets.
    const ok = await srv.shell('curl -sS --max-time 10 http://allowed.test/hello.txt', { network: 'allowlist' });
    assert.equal(ok.sc.stdout, 'hello over mcp\n', ok.text);
  });

  test('without network the same call has no network', async () => {
    const r = await srv.shell('curl -sS --max-time 5 http://allowed.test/hello.txt');
    assert.equal(r.isError, true);
    assert.doesNotMatch(r.sc.stdout, /hello over mcp/);
  });

  test('widening the allow-list is an argument error', async () => {
    const r = await srv.shell('true', { network: 'allowlist', allow_domains: ['evil.test'] });
    assert.equal(r.isError, true);
    assert.equal(r.sc, undefined);
    assert.match(r.text, /evil\.test/);
    assert.match(r.text, /allowed\.test/);
  });

  test('metrics: every metric moves as runs happen, scraped from metrics.listen', async () => {
    const port = await freePort();
    const m = await startServer('network-metrics', [
      'network:',
      '  allow_domains: [allowed.test, meta.test]',
      // meta.test stands for a name that resolves to the metadata address:
      // the proxy refuses it before any packet is sent.
      `  hosts: [{name: allowed.test, addrs: ["${INET_IP}"]}, {name: meta.test, addrs: ["169.254.169.254"]}]`,
      '  allow_private: [10.78.0.0/24]',
      '  bridge: airlocke0',
      '  subnet: 10.89.251.0/24',
      '  proxy_port: 3130',
      'metrics:',
      `  listen: 127.0.0.1:${port}`,
    ]);
    const scrape = async () => parseMetrics(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text());
    // A port 443 on the test's "internet", so a CONNECT gets as far as the
    // ClientHello check (nothing reaches it: the SNI does not match).
    const tls = spawn('ip', ['netns', 'exec', NS, '/usr/bin/python3', '-m', 'http.server', '443', '--bind', INET_IP], { stdio: 'ignore' });
    try {
      await m.wrap(async () => {
        const before = await scrape();
        for (const name of ['airlock_circuit_open', 'airlock_sessions_active', 'airlock_pool_ready{network="none"}',
          'airlock_resource_limit_violations_total{limit="pids"}', 'airlock_sandbox_escape_attempts_total{kind="unregistered_source"}']) {
          assert.ok(before.has(name), `${name} is exported from the start`);
        }
        assert.equal(before.get('airlock_circuit_open'), 0);
        assert.ok(await waitFor(async () => (await scrape()).get('airlock_pool_ready{network="none"}') > 0, 120_000), 'the pool fills');

        const net = { network: 'allowlist' };
        const calls = [
          ['ok', () => m.python('print(1)')],
          ['failed', () => m.shell('exit 3')],
          ['timeout', () => m.python('import time; time.sleep(30)', { timeout_s: 1 })],
          ['oom', () => m.python('b = []\nwhile True: b.append(bytearray(32 << 20))')],
          ['output', () => m.python('print("x" * 1_000_000)')],
          ['disk', () => m.shell('head -c 20M /dev/zero > /workspace/big; echo done')],
          ['allow', () => m.shell('curl -sS --max-time 10 http://allowed.test/hello.txt', net)],
          ['denied', () => m.shell('curl -sS --max-time 10 http://other.test/', net)],
          ['forbidden', () => m.shell('curl -sS --max-time 10 http://meta.test/', net)],
          ['ip literal', () => m.shell(`curl -sS --max-time 10 http://${INET_IP}/hello.txt`, net)],
          ['sni', () => m.shell('curl -sSk --max-time 10 --connect-to other.test:443:allowed.test:443 https://other.test/', net)],
          // Past the proxy, to the gateway: the host firewall drops it.
          ['firewall', () => m.shell('curl -sS --noproxy "*" --max-time 3 http://10.89.251.1:9/', net)],
        ];
        const got = {};
        for (const [what, call] of calls) got[what] = await call();
        assert.equal(got.ok.isError, false, got.ok.text);
        assert.equal(got.timeout.sc.reason, 'timeout', got.timeout.text);
        assert.equal(got.oom.sc.reason, 'out_of_memory', got.oom.text);
        assert.equal(got.output.sc.stdout_truncated, true, got.output.text);
        assert.equal(got.allow.sc.stdout, 'hello over mcp\n', got.allow.text);

        const created = await m.call('session_create', {});
        const during = await scrape();
        await m.call('session_close', { session_id: created.sc.session_id });
        const after = await scrape();
        const moved = (k) => (after.get(k) ?? 0) - (before.get(k) ?? 0);
        // Each call's outcome as its result tells it, counted by tool.
        const want = {};
        for (const [what, r] of Object.entries(got)) {
          const tool = ['ok', 'timeout', 'oom', 'output'].includes(what) ? 'run_python' : 'run_shell';
          const outcome = r.sc.reason === 'timeout' ? 'timeout' : r.sc.reason === 'out_of_memory' ? 'out_of_memory' : r.sc.exit_code === 0 ? 'ok' : 'failed';
          const k = `airlock_executions_total{outcome="${outcome}",tool="${tool}"}`;
          want[k] = (want[k] ?? 0) + 1;
          const d = `airlock_execution_duration_seconds_count{tool="${tool}"}`;
          want[d] = (want[d] ?? 0) + 1;
        }
        Object.assign(want, {
          'airlock_resource_limit_violations_total{limit="timeout"}': 1,
          'airlock_resource_limit_violations_total{limit="memory"}': 1,
          'airlock_resource_limit_violations_total{limit="output"}': 1,
          'airlock_resource_limit_violations_total{limit="disk"}': 1,
          'airlock_approvals_total{decision="auto"}': calls.length,
          'airlock_egress_requests_total{decision="allow"}': 1,
          'airlock_sandbox_escape_attempts_total{kind="denied_destination"}': 1,
          'airlock_sandbox_escape_attempts_total{kind="forbidden_address"}': 1,
          'airlock_sandbox_escape_attempts_total{kind="ip_literal"}': 1,
          'airlock_sandbox_escape_attempts_total{kind="sni_mismatch"}': 1,
        });
        assert.equal(want['airlock_executions_total{outcome="timeout",tool="run_python"}'], 1);
        assert.equal(want['airlock_executions_total{outcome="out_of_memory",tool="run_python"}'], 1);
        for (const [k, n] of Object.entries(want)) assert.equal(moved(k), n, `${k} moved by ${moved(k)}, want ${n}`);
        assert.ok(moved('airlock_egress_requests_total{decision="deny"}') >= 4, 'denials counted by the proxy');
        assert.ok(moved('airlock_sandbox_escape_attempts_total{kind="firewall_drop"}') >= 1, 'the firewall drop counted');
        const starts = moved('airlock_sandbox_start_seconds_count{kind="cold"}') + moved('airlock_sandbox_start_seconds_count{kind="pool"}');
        assert.ok(starts >= calls.length, `sandbox starts moved by ${starts}`);
        assert.equal(during.get('airlock_sessions_active'), 1);
        assert.equal(after.get('airlock_sessions_active'), 0);
        assert.equal(after.get('airlock_resource_limit_violations_total{limit="pids"}'), 0, 'pids is not observable from outside the sandbox');
      })();
    } finally {
      tls.kill();
      await m.close();
    }
  });

  test('just-in-time grant: a refused domain, asked for again, is granted by the approver for one call', async () => {
    const shown = [];
    const jit = await startServer('network-jit', [
      ...NETWORK_CONFIG,
      // Offline and allow-listed runs go through; only a grant asks.
      'approval: {mode: rules, rules: [{action: approve}], grantable_domains: [other.test], console: {listen: ""}}',
    ], { onElicit: async (req) => { shown.push(req.params.message); return { action: 'accept', content: { approve: true } }; } });
    try {
      const refused = await jit.shell('curl -fsS --max-time 10 http://other.test/hello.txt', { network: 'allowlist' });
      assert.deepEqual(refused.sc.egress_denied, [{ host: 'other.test', port: 80, reason: 'not in allow-list' }]);
      assert.equal(shown.length, 0, 'allow-listed runs are auto-approved by the rule');

      const granted = await jit.shell('curl -fsS --max-time 10 http://other.test/hello.txt',
        { network: 'allowlist', allow_domains: ['allowed.test', 'other.test'] });
      assert.equal(granted.isError, false, granted.text);
      assert.equal(granted.sc.stdout, 'hello over mcp\n');
      assert.equal(shown.length, 1, 'the grant asked the human');
      assert.match(shown[0], /outside the operator's allow-list, granted for this call only if you approve: other\.test/);

      // The grant was for that call only.
      const again = await jit.shell('curl -fsS --max-time 10 http://other.test/hello.txt', { network: 'allowlist' });
      assert.deepEqual(again.sc.egress_denied, [{ host: 'other.test', port: 80, reason: 'not in allow-list' }]);
    } finally {
      await jit.close();
    }
  });
});

