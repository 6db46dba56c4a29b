// End-to-end tests 1-10: one airlock server (the built binary, over stdio,
// driven by the official MCP TypeScript SDK client) serves every test here.
import assert from 'node:assert/strict';
import net from 'node:net';
import { readFile } from 'node:fs/promises';
import { after, before, describe, test } from 'node:test';
import { performance } from 'node:perf_hooks';

import { LIMITS, assertNoLeftovers, busySandboxes, hostIPv4s, marker, sleep, startServer, waitFor } from './lib.mjs';

const MiB = 1 << 20;
const MAX_TIMEOUT_S = 300; // limits.max_timeout_s default
const CODE_BYTES = 1 << 20; // limits.code_bytes default

/** Parses the last stdout line of a run as JSON (the probes print one). */
function lastJSON(r) {
  const lines = (r.sc?.stdout ?? '').trim().split('\n');
  try {
    return JSON.parse(lines[lines.length - 1]);
  } catch {
    assert.fail(`expected a JSON line on stdout, got:\n${r.text}`);
  }
}

function assertOK(r, what = 'run') {
  assert.ok(r.sc, `${what}: no structuredContent; text: ${r.text}`);
  assert.equal(r.isError, false, `${what}: isError; text: ${r.text}`);
  assert.equal(r.sc.exit_code, 0, `${what}: exit code; text: ${r.text}`);
}

function assertTimedOut(r, what) {
  assert.ok(r.sc, `${what}: no structuredContent; text: ${r.text}`);
  assert.equal(r.sc.timed_out, true, `${what}: timed_out; text: ${r.text}`);
  assert.equal(r.sc.reason, 'timeout', `${what}: reason`);
  assert.equal(r.isError, true, `${what}: isError`);
}

describe('airlock over stdio (one server)', { timeout: 15 * 60_000 }, () => {
  let srv;
  const w = (fn) => async (t) => srv.wrap(fn)(t);

  before(async () => {
    srv = await startServer('main');
    // Priming the tool list lets the SDK validate every structuredContent
    // against the tools' outputSchema from here on.
    await srv.client.listTools();
  });

  after(async () => {
    if (srv) await srv.close();
  });

  // 1
  test('tools/list: the run tools, input schemas, all four annotations as booleans', w(async () => {
    const { tools } = await srv.client.listTools();
    const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
    assert.deepEqual(Object.keys(byName).sort(), ['cancel_run', 'list_files', 'list_runs', 'read_file', 'run_python', 'run_shell',
      'session_close', 'session_create', 'session_fork', 'session_list', 'session_pause', 'write_file']);
    // The run registry's tools: list_runs only reads, cancel_run needs a run id.
    assert.deepEqual(byName.cancel_run.inputSchema.required, ['run_id']);
    for (const [name, readOnly] of [['list_runs', true], ['cancel_run', false]]) {
      const a = byName[name].annotations;
      for (const h of ['readOnlyHint', 'destructiveHint', 'idempotentHint', 'openWorldHint']) {
        assert.equal(typeof a?.[h], 'boolean', `${name}: annotations.${h} must be set explicitly`);
      }
      assert.equal(a.readOnlyHint, readOnly, `${name}: readOnlyHint`);
      assert.equal(a.openWorldHint, false, `${name}: openWorldHint`);
    }
    for (const [name, key] of [['run_python', 'code'], ['run_shell', 'command']]) {
      const t = byName[name];
      assert.ok(t.description && t.description.length > 50, `${name}: description`);
      const s = t.inputSchema;
      assert.equal(s.type, 'object', `${name}: inputSchema.type`);
      assert.deepEqual(Object.keys(s.properties).sort(), [key, 'session_id', 'timeout_s'].sort(), `${name}: properties`);
      assert.equal(s.properties[key].type, 'string', `${name}.${key}: type`);
      assert.deepEqual(s.required, [key], `${name}: required`);
      assert.equal(s.properties.timeout_s.type, 'integer', `${name}.timeout_s: type`);
      assert.equal(s.properties.timeout_s.minimum, 1, `${name}.timeout_s: minimum`);
      assert.equal(s.properties.timeout_s.maximum, MAX_TIMEOUT_S, `${name}.timeout_s: maximum`);
      assert.equal(s.additionalProperties, false, `${name}: additionalProperties`);
      const out = t.outputSchema;
      assert.ok(out && out.type === 'object', `${name}: outputSchema`);
      for (const k of ['run_id', 'exit_code', 'stdout', 'stderr', 'timed_out', 'oom_killed', 'duration_ms',
        'truncated', 'stdout_truncated', 'stderr_truncated', 'reason']) {
        assert.ok(k in out.properties, `${name}: outputSchema lacks ${k}`);
      }
      const a = t.annotations;
      assert.ok(a, `${name}: annotations`);
      for (const h of ['readOnlyHint', 'destructiveHint', 'idempotentHint', 'openWorldHint']) {
        assert.equal(typeof a[h], 'boolean', `${name}: annotations.${h} must be set explicitly, got ${JSON.stringify(a[h])}`);
        assert.equal(a[h], false, `${name}: annotations.${h}`);
      }
    }
  }));

  // 2
  test('runs under gVisor, not as root', w(async () => {
    const py = await srv.python('import platform; print(platform.release())');
    assertOK(py, 'platform.release');
    assert.match(py.sc.stdout, /gvisor/i);
    assert.match(py.text, /gvisor/i, 'content[0] text shows stdout');
    assert.match(py.sc.run_id, /\S/);

    const sh = await srv.shell('id -u');
    assertOK(sh, 'id -u');
    const uid = sh.sc.stdout.trim();
    assert.match(uid, /^\d+$/);
    assert.notEqual(uid, '0');
  }));

  // 3
  test('filesystem: / is read-only (EROFS), /workspace and /tmp writable and capped', w(async () => {
    const r = await srv.python(`
import errno, json, os
res = {"cwd": os.getcwd()}
def attempt(key, path, mib):
    try:
        with open(path, "wb") as f:
            chunk = b"x" * (1 << 20)
            for _ in range(mib):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        res[key] = "ok"
    except OSError as e:
        res[key] = [errno.errorcode.get(e.errno, str(e.errno)), e.strerror]
attempt("var_tmp", "/var/tmp/x", 0)
attempt("ws_1m", "/workspace/small", 1)
attempt("tmp_1m", "/tmp/small", 1)
os.remove("/workspace/small"); os.remove("/tmp/small")
attempt("ws_20m", "/workspace/big", 20)
attempt("tmp_20m", "/tmp/big", 20)
print(json.dumps(res))
`);
    assertOK(r, 'fs probe');
    const res = lastJSON(r);
    // /var/tmp is mode 1777 in Debian: only a read-only mount refuses uid 1000.
    assert.deepEqual(res.var_tmp, ['EROFS', 'Read-only file system'], 'write under /var/tmp');
    assert.equal(res.ws_1m, 'ok', '1 MiB in /workspace');
    assert.equal(res.tmp_1m, 'ok', '1 MiB in /tmp');
    assert.deepEqual(res.ws_20m, ['ENOSPC', 'No space left on device'], `20 MiB in /workspace (workspace_mb ${LIMITS.workspace_mb})`);
    assert.deepEqual(res.tmp_20m, ['ENOSPC', 'No space left on device'], `20 MiB in /tmp (tmp_mb ${LIMITS.tmp_mb})`);
    assert.equal(res.cwd, '/workspace');

    const sh = await srv.shell('head -c 20M /dev/zero > /workspace/z; echo rc=$?');
    assert.match(sh.sc.stderr, /No space left on device/);
    assert.match(sh.sc.stdout, /rc=1/);
  }));

  // 4
  test('timeouts: busy loop, SIGTERM-ignoring process, background children', w(async (t) => {
    const busy = await srv.python('while True: pass', { timeout_s: 2 });
    assertTimedOut(busy, 'busy loop');
    assert.ok(busy.ms < 3500, `busy loop took ${busy.ms.toFixed(0)} ms wall, want < 3500`);
    assert.ok(busy.sc.duration_ms >= 1900, `duration_ms ${busy.sc.duration_ms} < the 2 s timeout`);
    assert.match(busy.text, /Timed out/i);

    const stubborn = await srv.python(
      'import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint("ready", flush=True)\ntime.sleep(60)',
      { timeout_s: 2 });
    assertTimedOut(stubborn, 'SIGTERM ignored');
    assert.ok(stubborn.ms < 3500, `SIGTERM-ignoring run took ${stubborn.ms.toFixed(0)} ms wall, want < 3500`);
    assert.equal(stubborn.sc.stdout, 'ready\n', 'output written before the timeout is kept');

    const bg = await srv.shell('sleep 1000 & sleep 1000', { timeout_s: 2 });
    assertTimedOut(bg, 'shell with background child');
    t.diagnostic(`wall ms: busy ${busy.ms.toFixed(0)}, SIGTERM-ignoring ${stubborn.ms.toFixed(0)}, background ${bg.ms.toFixed(0)}`);
    assert.ok(bg.ms < 3500, `background-child run took ${bg.ms.toFixed(0)} ms wall, want < 3500`);
  }));

  // 5
  test('memory bomb is OOM-killed', w(async () => {
    const r = await srv.python(`
chunks = []
while True:
    chunks.append(bytearray(b"\\x01") * (16 << 20))
`, { timeout_s: 60 });
    assert.ok(r.sc, `no structuredContent; text: ${r.text}`);
    assert.equal(r.sc.oom_killed, true, `oom_killed; result: ${JSON.stringify({ ...r.sc, stdout: undefined, stderr: r.sc.stderr.slice(-500) })}`);
    assert.equal(r.sc.reason, 'out_of_memory');
    assert.equal(r.sc.timed_out, false);
    assert.equal(r.isError, true);
    assert.match(r.text, /out of memory/i);
  }));

  test('fork bombs are contained and the next call works', w(async () => {
    const py = await srv.python(`
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
`, { timeout_s: 5 }, { timeoutMs: 60_000 });
    assert.ok(py.sc, `python fork bomb: no structuredContent; text: ${py.text}`);
    assert.ok(py.ms < 10_000, `python fork bomb took ${py.ms.toFixed(0)} ms wall, want < 10000 (timeout_s 5)`);
    assert.equal(py.isError, true, 'a fork bomb that never ends is an error (timeout)');

    const sh = await srv.shell(':(){ :|:& };:', { timeout_s: 5 }, { timeoutMs: 60_000 });
    assert.ok(sh.sc, `bash fork bomb: no structuredContent; text: ${sh.text}`);
    assert.ok(sh.ms < 10_000, `bash fork bomb took ${sh.ms.toFixed(0)} ms wall, want < 10000 (timeout_s 5)`);

    const next = await srv.python('print(1)');
    assertOK(next, 'print(1) after the fork bombs');
    assert.equal(next.sc.stdout, '1\n');
  }));

  // 6
  test('stdout flood is capped with a marker; server RSS stays bounded', w(async (t) => {
    const cap = LIMITS.stdout_bytes;
    const mark = marker(cap);
    const base = await srv.rssKiB();
    assert.ok(base, `cannot read VmRSS of server pid ${srv.pid}`);
    let maxRSS = base;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const v = await srv.rssKiB();
        if (v && v > maxRSS) maxRSS = v;
        await sleep(50);
      }
    })();
    let big, loop;
    try {
      big = await srv.python('print("x" * 50_000_000)');
      // A sustained flood on both streams until the timeout.
      loop = await srv.python(
        'import os\nb = b"y" * (1 << 20)\nwhile True:\n    os.write(1, b)\n    os.write(2, b)', { timeout_s: 4 });
    } finally {
      sampling = false;
      await sampler;
    }
    const afterRSS = await srv.rssKiB();

    assert.ok(big.sc, `no structuredContent; text: ${big.text.slice(0, 500)}`);
    assert.equal(big.sc.exit_code, 0);
    assert.equal(big.sc.truncated, true);
    assert.equal(big.sc.stdout_truncated, true);
    assert.equal(big.sc.stderr_truncated, false);
    assert.equal(big.sc.reason, 'output_capped');
    assert.ok(big.sc.stdout.length <= cap + mark.length + 2,
      `stdout is ${big.sc.stdout.length} chars, want <= ${cap} + marker`);
    assert.ok(big.sc.stdout.startsWith('x'.repeat(cap)), `the first ${cap} bytes are kept`);
    assert.ok(big.sc.stdout.trimEnd().endsWith(mark), `stdout ends with the marker, got ...${JSON.stringify(big.sc.stdout.slice(-100))}`);
    assert.ok(big.text.includes(mark), 'the text content shows the marker too');
    assert.ok(big.text.length < 4 * cap, `text content is ${big.text.length} chars`);

    assert.ok(loop.sc, `no structuredContent; text: ${loop.text.slice(0, 500)}`);
    assertTimedOut(loop, 'sustained flood');
    assert.equal(loop.sc.stdout_truncated, true);
    assert.equal(loop.sc.stderr_truncated, true);
    assert.ok(loop.sc.stdout.length <= cap + mark.length + 2, `sustained flood stdout is ${loop.sc.stdout.length} chars`);
    assert.ok(loop.sc.stdout.trimEnd().endsWith(mark));
    assert.ok(loop.sc.stderr.trimEnd().endsWith(marker(65536)), 'stderr has its own marker');

    t.diagnostic(`server VmRSS: base ${base} KiB, peak ${maxRSS} KiB, after ${afterRSS} KiB`);
    const limitKiB = 150 * 1024;
    assert.ok(maxRSS < limitKiB, `server VmRSS peaked at ${(maxRSS / 1024).toFixed(1)} MiB during the flood (base ${(base / 1024).toFixed(1)} MiB), want < 150 MiB`);
    assert.ok(afterRSS && afterRSS < limitKiB, `server VmRSS after the flood ${afterRSS} KiB`);
  }));

  test('a single large write to stdout is not silently cut short', w(async (t) => {
    // One write(2) of 200 kB: the kept 64 KiB must be flagged as truncated.
    // (Seen: gVisor accepts only 64 KiB of a large write to its stdout pipe
    // and python -u, i.e. PYTHONUNBUFFERED=1, drops the rest of a partial
    // write without an error, so exactly 65536 bytes arrive and nothing says
    // that anything is missing.)
    const r = await srv.python('import sys\nsys.stdout.write("x" * 200_000)');
    assert.ok(r.sc, `no structuredContent; text: ${r.text.slice(0, 300)}`);
    t.diagnostic(`received ${r.sc.stdout.length} chars, truncated=${r.sc.truncated}`);
    assert.equal(r.sc.stdout_truncated, true, `200 kB written, ${r.sc.stdout.length} chars came back and stdout_truncated is false`);
    assert.ok(r.sc.stdout.trimEnd().endsWith(marker(LIMITS.stdout_bytes)), 'stdout ends with the marker');
    assert.equal(r.sc.reason, 'output_capped');

    // Output under the cap arrives whole, in order, from many writes.
    const r2 = await srv.python('import sys\nfor i in range(60):\n    sys.stdout.write("%05d" % i + "." * 995)');
    assertOK(r2, '60 kB in 1 kB writes');
    let want = '';
    for (let i = 0; i < 60; i++) want += String(i).padStart(5, '0') + '.'.repeat(995);
    assert.equal(r2.sc.stdout.length, want.length);
    assert.ok(r2.sc.stdout === want, 'stdout differs from what was written');
    assert.equal(r2.sc.truncated, false);
  }));

  // 7
  test('network: loopback only; the host is unreachable, DNS fails', w(async () => {
    let hits = 0;
    const listener = net.createServer((sock) => {
      hits++;
      sock.destroy();
    });
    await new Promise((resolve, reject) => {
      listener.once('error', reject);
      listener.listen(0, '0.0.0.0', resolve);
    });
    try {
      const port = listener.address().port;
      const hosts = await hostIPv4s();
      assert.ok(hosts.length > 0, 'found no non-loopback IPv4 address of this host');

      // Positive control: the listener does count a connection from here.
      await new Promise((resolve, reject) => {
        const c = net.connect(port, hosts[0], () => { c.destroy(); resolve(); });
        c.once('error', reject);
      });
      await waitFor(() => hits === 1, 2000, 20);
      assert.equal(hits, 1, 'control connection from the host was not counted');
      hits = 0;

      // Only addresses that end on this machine. DNS is tried only once the
      // host addresses proved unreachable (so no query can leave).
      const r = await srv.python(`
import errno, json, socket
HOSTS = ${JSON.stringify(hosts)}
PORT = ${port}
def conn(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        return "connected"
    except OSError as e:
        return errno.errorcode.get(e.errno, type(e).__name__) if e.errno else type(e).__name__
    finally:
        s.close()
res = {"loopback": conn("127.0.0.1", 1), "hosts": {h: conn(h, PORT) for h in HOSTS}}
if all(v in ("ENETUNREACH", "EHOSTUNREACH") for v in res["hosts"].values()):
    res["dns"] = {}
    for name in ("example.com", "pypi.org"):
        try:
            res["dns"][name] = ["resolved", str(socket.getaddrinfo(name, 443))]
        except socket.gaierror as e:
            res["dns"][name] = ["gaierror", str(e)]
        except OSError as e:
            res["dns"][name] = ["oserror", str(e)]
print(json.dumps(res))
`, { timeout_s: 30 });
      assertOK(r, 'network probe');
      const res = lastJSON(r);
      assert.equal(res.loopback, 'ECONNREFUSED', 'loopback exists in the sandbox (127.0.0.1:1 is refused)');
      for (const h of hosts) {
        assert.ok(['ENETUNREACH', 'EHOSTUNREACH'].includes(res.hosts[h]),
          `connect to host address ${h}:${port} from the sandbox: ${res.hosts[h]}, want unreachable`);
      }
      await sleep(200);
      assert.equal(hits, 0, 'the host listener saw a connection from the sandbox');
      assert.ok(res.dns, 'DNS not tried');
      for (const [name, [kind, detail]] of Object.entries(res.dns)) {
        assert.notEqual(kind, 'resolved', `DNS resolved ${name}: ${detail}`);
      }
    } finally {
      listener.close();
    }
  }));

  // 8
  test("the sandbox does not see the server's environment", w(async () => {
    // Control: the canary is in the server's own environment.
    const environ = await readFile(`/proc/${srv.pid}/environ`, 'utf8');
    assert.ok(environ.split('\0').includes(`AIRLOCK_E2E_CANARY=${srv.canary}`), 'canary missing from the server environment');

    const sh = await srv.shell('env');
    assertOK(sh, 'env');
    assert.match(sh.sc.stdout, /^PATH=/m, 'env printed the sandbox environment');
    assert.ok(!sh.sc.stdout.includes('AIRLOCK_E2E_CANARY'), 'canary variable name visible in the sandbox');
    assert.ok(!sh.sc.stdout.includes(srv.canary), 'canary value visible in the sandbox');

    const py = await srv.python('import os, json; print(json.dumps(dict(os.environ)))');
    assertOK(py, 'os.environ');
    const env = lastJSON(py);
    assert.ok(!('AIRLOCK_E2E_CANARY' in env));
    assert.ok(!JSON.stringify(env).includes(srv.canary));
    assert.ok(!Object.keys(env).some((k) => k.startsWith('AIRLOCK')), `AIRLOCK* variable in sandbox: ${Object.keys(env)}`);
  }));

  // 9
  test('50 sequential calls all return; nothing is left behind', { timeout: 10 * 60_000 }, w(async () => {
    const ids = new Set();
    for (let i = 0; i < 50; i++) {
      let r;
      switch (i % 5) {
        case 0:
          r = await srv.python(`print(${i})`);
          assertOK(r, `call ${i}`);
          assert.equal(r.sc.stdout, `${i}\n`);
          break;
        case 1:
          r = await srv.shell('echo before; exit 3');
          assert.equal(r.sc.exit_code, 3, `call ${i}: exit code`);
          assert.equal(r.isError, true, `call ${i}: non-zero exit is isError`);
          assert.equal(r.sc.timed_out, false);
          assert.equal(r.sc.stdout, 'before\n');
          break;
        case 2:
          r = await srv.python(`raise ValueError("boom-${i}")`);
          assert.equal(r.sc.exit_code, 1, `call ${i}: exit code`);
          assert.equal(r.isError, true);
          assert.match(r.sc.stderr, new RegExp(`ValueError: boom-${i}`));
          break;
        case 3:
          r = await srv.shell(`echo out-${i}; echo err-${i} >&2`);
          assertOK(r, `call ${i}`);
          assert.equal(r.sc.stdout, `out-${i}\n`);
          assert.equal(r.sc.stderr, `err-${i}\n`);
          break;
        case 4:
          if (i % 20 === 4) {
            r = await srv.python('import time; time.sleep(30)', { timeout_s: 1 });
            assertTimedOut(r, `call ${i}`);
            assert.ok(r.ms < 3000, `call ${i}: timeout_s 1 took ${r.ms.toFixed(0)} ms`);
          } else {
            r = await srv.python('import sys; sys.exit(3)');
            assert.equal(r.sc.exit_code, 3, `call ${i}: exit code`);
            assert.equal(r.isError, true);
          }
          break;
      }
      assert.ok(r.sc?.run_id, `call ${i}: run_id`);
      ids.add(r.sc.run_id);
    }
    assert.equal(ids.size, 50, 'run_ids are unique');

    await assertNoLeftovers({ instanceId: srv.instanceId, runIds: srv.runIds });
    const own = await busySandboxes(srv.instanceId, 3000);
    assert.deepEqual(own, [], `sandboxes of this instance (${srv.instanceId}) besides its idle pool`);
  }));

  // 10
  test('bad arguments: isError with a message that says what to change', w(async () => {
    const cases = [
      ['run_python', {}, [/"code"/, /missing/i]],
      ['run_python', { code: '' }, [/"code"/, /empty/i]],
      ['run_python', { code: '   \n' }, [/"code"/, /empty/i]],
      ['run_python', { code: 42 }, [/"code"/, /string/i]],
      ['run_python', { code: null }, [/"code"/, /missing/i]],
      ['run_python', { code: 'print(1)', approved: true }, [/"approved"/, /unknown/i]],
      ['run_python', { code: 'print(1)', timeout_s: '5' }, [/"timeout_s"/, /integer/i]],
      ['run_python', { code: 'print(1)', timeout_s: 0 }, [/"timeout_s"/, /\b1\b/, new RegExp(`\\b${MAX_TIMEOUT_S}\\b`)]],
      ['run_python', { code: 'print(1)', timeout_s: -5 }, [/"timeout_s"/, new RegExp(`\\b${MAX_TIMEOUT_S}\\b`)]],
      ['run_python', { code: 'print(1)', timeout_s: MAX_TIMEOUT_S + 1 }, [/"timeout_s"/, new RegExp(`\\b${MAX_TIMEOUT_S}\\b`)]],
      ['run_python', { code: 'print(1)', timeout_s: 1.5 }, [/"timeout_s"/, /whole|integer/i]],
      ['run_python', { code: 'x'.repeat(CODE_BYTES + 1) }, [/"code"/, new RegExp(`\\b${CODE_BYTES}\\b`)]],
      ['run_python', { code: 'print(1)\0' }, [/"code"/, /NUL/]],
      ['run_shell', {}, [/"command"/, /missing/i]],
      ['run_shell', { code: 'echo hi' }, [/"code"/, /unknown/i, /"command"/]],
      ['run_shell', { command: 'echo hi', timeout_s: 301 }, [/"timeout_s"/, /300/]],
    ];
    const failures = [];
    for (const [tool, args, want] of cases) {
      const label = `${tool} ${JSON.stringify(args).slice(0, 80)}`;
      const r = await srv.call(tool, args);
      if (r.isError !== true) failures.push(`${label}: isError is ${r.res.isError}`);
      if (r.res.structuredContent !== undefined) failures.push(`${label}: has structuredContent ${JSON.stringify(r.res.structuredContent).slice(0, 200)}`);
      for (const re of want) {
        if (!re.test(r.text)) failures.push(`${label}: message ${JSON.stringify(r.text)} does not match ${re}`);
      }
    }
    assert.deepEqual(failures, []);

    // The largest timeout is accepted (the run itself is short).
    const t = await srv.shell('echo t', { timeout_s: MAX_TIMEOUT_S });
    assertOK(t, `timeout_s ${MAX_TIMEOUT_S}`);
  }));

  // The tool descriptions promise these; each was seen broken (see README).
  test('a run longer than 30 s completes, and its sandbox is removed', { timeout: 3 * 60_000 }, w(async (t) => {
    const r = await srv.shell('sleep 32; echo done', { timeout_s: 60 }, { timeoutMs: 120_000 });
    t.diagnostic(`took ${r.ms.toFixed(0)} ms`);
    const own = await busySandboxes(srv.instanceId, 3000);
    assert.ok(r.sc, `no structuredContent; text: ${r.text}`);
    assertOK(r, 'sleep 32 with timeout_s 60');
    assert.equal(r.sc.stdout, 'done\n');
    assert.deepEqual(own, [], 'sandboxes of this instance left 3 s after the call returned');
  }));

  test('code of exactly limits.code_bytes (1 MiB) runs', { timeout: 3 * 60_000 }, w(async (t) => {
    const tail = '\nprint(7)\n';
    const code = '#' + 'x'.repeat(CODE_BYTES - 1 - tail.length) + tail;
    assert.equal(Buffer.byteLength(code), CODE_BYTES);
    const r = await srv.python(code, { timeout_s: 60 }, { timeoutMs: 120_000 });
    t.diagnostic(`took ${r.ms.toFixed(0)} ms`);
    assert.ok(r.sc, `no structuredContent after ${r.ms.toFixed(0)} ms; text: ${r.text}`);
    assertOK(r, '1 MiB of code');
    assert.equal(r.sc.stdout, '7\n');
  }));

  test('60 concurrent processes run (limits.pids is 128)', w(async () => {
    const r = await srv.shell('for i in $(seq 60); do sleep 2 & done; wait; echo survived', { timeout_s: 30 });
    assert.ok(r.sc, `no structuredContent; text: ${r.text}`);
    assert.equal(r.sc.stdout, 'survived\n', `60 processes under a 128 limit: ${r.text.slice(0, 600)}`);
    assertOK(r, '60 sleeps');
  }));

  test('the server survived the suite', w(async () => {
    assert.ok(srv.alive(), 'server process is gone');
    const t0 = performance.now();
    const r = await srv.python('print("still here")');
    assertOK(r);
    assert.ok(performance.now() - t0 < 10_000);
  }));
});
