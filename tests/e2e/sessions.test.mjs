// End-to-end tests of stateful sessions, the file tools and rich results:
// the built airlock over stdio and as a daemon, driven by the official
// TypeScript SDK client. Every sandbox is a real gVisor one.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';

import { assertNoLeftovers, callWith, ctr, sandboxExists, sleep, startDaemon, startServer, waitFor } from './lib.mjs';

const execFileP = promisify(execFile);

const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

/** The width and height in a PNG's IHDR chunk. */
function pngSize(buf) {
  assert.ok(buf.subarray(0, 8).equals(PNG_MAGIC), 'PNG signature');
  assert.equal(buf.subarray(12, 16).toString('latin1'), 'IHDR', 'first chunk is IHDR');
  return { width: buf.readUInt32BE(16), height: buf.readUInt32BE(20) };
}

function assertOK(r, what) {
  assert.equal(r.isError, false, `${what}: ${r.text}`);
  if (r.sc && 'exit_code' in r.sc) assert.equal(r.sc.exit_code, 0, `${what}: ${r.text}`);
}

async function newSession(srv, args = {}) {
  const r = await srv.call('session_create', args);
  assert.equal(r.isError, false, `session_create: ${r.text}`);
  assert.match(r.sc.session_id, /^s[0-9a-f]+$/);
  return r.sc.session_id;
}

describe('sessions, files and rich results (stdio)', { timeout: 15 * 60_000 }, () => {
  let srv;
  const w = (fn) => async (t) => srv.wrap(fn)(t);

  before(async () => {
    srv = await startServer('sessions', ['sessions: {per_client: 3, max: 3}']);
    await srv.client.listTools(); // lets the SDK check structuredContent against each outputSchema
  });
  after(async () => {
    if (srv) await srv.close();
  });

  test('tools/list: session and file tools, with schemas and annotations', w(async () => {
    const { tools } = await srv.client.listTools();
    const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
    for (const name of ['session_create', 'session_close', 'session_list', 'write_file', 'read_file', 'list_files']) {
      const t = byName[name];
      assert.ok(t, `${name} is listed`);
      assert.equal(t.inputSchema.additionalProperties, false, `${name}: additionalProperties`);
      for (const h of ['readOnlyHint', 'destructiveHint', 'idempotentHint', 'openWorldHint']) {
        assert.equal(typeof t.annotations?.[h], 'boolean', `${name}: annotations.${h}`);
      }
    }
    assert.deepEqual(byName.write_file.inputSchema.required.sort(), ['content', 'path', 'session_id']);
    assert.deepEqual(byName.write_file.inputSchema.properties.encoding.enum, ['utf-8', 'base64']);
    assert.equal(byName.read_file.annotations.readOnlyHint, true);
    assert.ok('session_id' in byName.run_python.inputSchema.properties);
    for (const k of ['display', 'images', 'files', 'session_id', 'session_ended']) {
      assert.ok(k in byName.run_python.outputSchema.properties, `run_python outputSchema lacks ${k}`);
    }
    assert.match(byName.run_python.description, /value of a final expression is shown/);
  }));

  test('state persists: x = 41, then x + 1 is 42; shell shares the workspace', w(async () => {
    const id = await newSession(srv);
    const a = await srv.python('x = 41', { session_id: id });
    assertOK(a, 'x = 41');
    assert.equal(a.sc.session_id, id);
    assert.equal(a.sc.display, undefined, 'an assignment shows nothing');
    const b = await srv.python('x + 1', { session_id: id });
    assertOK(b, 'x + 1');
    assert.equal(b.sc.display, '42');
    assert.match(b.text, /--- value ---\n42\n/);
    // Definitions and imports persist too; files persist across languages.
    assertOK(await srv.python('import json\ndef twice(v):\n    return 2 * v\nopen("from_py.txt", "w").write("py")', { session_id: id }), 'def');
    const c = await srv.shell('cat from_py.txt; echo " and sh" > from_sh.txt', { session_id: id });
    assert.equal(c.sc.stdout, 'py');
    const d = await srv.python('json.dumps([twice(x), open("from_sh.txt").read()])', { session_id: id });
    assert.equal(d.sc.display, `'[82, " and sh\\\\n"]'`);
    // A call without the id is still one-shot: it sees none of it.
    const e = await srv.python('import os\nprint("x" in globals(), os.path.exists("from_py.txt"))');
    assert.equal(e.sc.stdout, 'False False\n');
    assert.equal((await srv.call('session_close', { session_id: id })).isError, false);
  }));

  test('pandas: a DataFrame as the last expression shows as a table', w(async () => {
    const id = await newSession(srv);
    const r = await srv.python('import pandas as pd\ndf = pd.DataFrame({"city": ["Oslo", "Lima"], "temp": [4.5, 19.25]})\ndf', { session_id: id });
    assertOK(r, 'DataFrame');
    assert.match(r.sc.display, /city\s+temp\n0\s+Oslo\s+4\.50\n1\s+Lima\s+19\.25/);
    const s = await srv.python('df["temp"].mean()', { session_id: id });
    assert.match(s.sc.display, /^(np\.float64\()?11\.875\)?$/);
    await srv.call('session_close', { session_id: id });
  }));

  test('matplotlib: shown and open figures come back as PNG image content', w(async () => {
    const id = await newSession(srv);
    const code = 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()\nplt.figure(figsize=(3, 2))\nplt.bar(["a", "b"], [3, 5])\n';
    const r = await srv.python(code, { session_id: id });
    assertOK(r, 'plot');
    const images = r.res.content.filter((c) => c.type === 'image');
    assert.equal(images.length, 2, `image items: ${JSON.stringify(r.res.content.map((c) => c.type))}`);
    assert.equal(r.sc.images, 2);
    for (const img of images) {
      assert.equal(img.mimeType, 'image/png');
      const { width, height } = pngSize(Buffer.from(img.data, 'base64'));
      assert.ok(width > 100 && height > 100, `${width}x${height}`);
    }
    // Figures are closed once returned: the next call has none.
    const n = await srv.python('len(plt.get_fignums())', { session_id: id });
    assert.equal(n.sc.display, '0');
    assert.equal(n.res.content.filter((c) => c.type === 'image').length, 0);
    // One-shot runs return figures too.
    const one = await srv.python('import matplotlib.pyplot as plt\nplt.plot([0, 1])');
    assert.equal(one.res.content.filter((c) => c.type === 'image').length, 1);
    await srv.call('session_close', { session_id: id });
  }));

  test('files in and out: write_file a CSV, pandas reads it, read_file the result', w(async () => {
    const id = await newSession(srv);
    const csv = 'name,score\nada,90\nbob,70\ncy,80\n';
    const wr = await srv.call('write_file', { session_id: id, path: 'data/scores.csv', content: csv });
    assert.equal(wr.isError, false, wr.text);
    const { audit_record: rec, ...written } = wr.sc;
    assert.deepEqual(written, { path: 'data/scores.csv', size: csv.length });
    assert.match(rec, /^[0-9a-f]{64}$/, 'the result names its audit record');
    const code = 'import os, pandas as pd\ndf = pd.read_csv("data/scores.csv")\nos.makedirs("out", exist_ok=True)\n' +
      'df.assign(passed=df.score >= 75).to_csv("out/graded.csv", index=False)\nint(df.score.sum())';
    const r = await srv.python(code, { session_id: id });
    assertOK(r, 'pandas');
    assert.equal(r.sc.display, '240');
    const graded = 'name,score,passed\nada,90,True\nbob,70,False\ncy,80,True\n';
    assert.deepEqual(r.sc.files, [{ path: 'out/graded.csv', size: graded.length, embedded: true }]);
    const res = r.res.content.find((c) => c.type === 'resource');
    assert.equal(res?.resource.uri, 'file:///workspace/out/graded.csv');
    assert.equal(res.resource.text, graded);
    const rd = await srv.call('read_file', { session_id: id, path: 'out/graded.csv' });
    assert.equal(rd.isError, false, rd.text);
    assert.deepEqual(rd.sc, { path: 'out/graded.csv', size: graded.length, encoding: 'utf-8', content: graded, truncated: false });
    const head = await srv.call('read_file', { session_id: id, path: 'out/graded.csv', max_bytes: 4 });
    assert.equal(head.sc.content, 'name');
    assert.equal(head.sc.truncated, true);
    // Binary goes both ways as base64, byte for byte.
    const blob = randomBytes(3000);
    blob[0] = 0xff; // not UTF-8
    const wb = await srv.call('write_file', { session_id: id, path: 'bin/blob', content: blob.toString('base64'), encoding: 'base64' });
    assert.equal(wb.sc.size, 3000, wb.text);
    const rb = await srv.call('read_file', { session_id: id, path: 'bin/blob' });
    assert.equal(rb.sc.encoding, 'base64');
    assert.ok(Buffer.from(rb.sc.content, 'base64').equals(blob), 'binary round trip');
    const ls = await srv.call('list_files', { session_id: id });
    assert.deepEqual(ls.sc.entries.map((e) => `${e.name}:${e.type}`), ['bin:dir', 'data:dir', 'out:dir']);
    const ls2 = await srv.call('list_files', { session_id: id, path: 'data' });
    assert.deepEqual(ls2.sc.entries, [{ name: 'scores.csv', type: 'file', size: csv.length }]);
    // Bad input says what to change.
    const bad = await srv.call('write_file', { session_id: id, path: 'x', content: '%%%', encoding: 'base64' });
    assert.equal(bad.isError, true);
    assert.match(bad.text, /not valid base64/);
    await srv.call('session_close', { session_id: id });
  }));

  test('paths stay in the sandbox: traversal, absolute, NUL, long, planted symlinks', w(async () => {
    const id = await newSession(srv);
    const sh = await srv.shell('ln -s / root && ln -s /etc/passwd pw && mkdir d && ln -s / d/up && echo ok', { session_id: id });
    assert.equal(sh.sc.stdout, 'ok\n', sh.text);
    const cases = [
      ['../etc/passwd', /"\.\."/],
      ['/etc/passwd', /absolute/],
      ['data/../../etc/passwd', /"\.\."/],
      ['a\u0000b', /NUL/],
      ['x/'.repeat(600) + 'f', /longer than 1024 bytes/],
      ['root/etc/passwd', /symbolic link/],
      ['pw', /symbolic link/],
      ['d/up/etc/hostname', /symbolic link/],
    ];
    for (const [p, want] of cases) {
      const r = await srv.call('read_file', { session_id: id, path: p });
      assert.equal(r.isError, true, `read ${JSON.stringify(p)}: ${r.text}`);
      assert.match(r.text, want, `read ${JSON.stringify(p)}`);
      assert.equal(r.sc, undefined);
    }
    for (const p of ['root/tmp/planted', '../planted', 'd/up/tmp/planted']) {
      const r = await srv.call('write_file', { session_id: id, path: p, content: 'x' });
      assert.equal(r.isError, true, `write ${p}: ${r.text}`);
    }
    const l = await srv.call('list_files', { session_id: id, path: 'root' });
    assert.equal(l.isError, true, l.text);
    // The code itself reads through its link only the sandbox's own files.
    const own = await srv.shell('cat root/etc/hostname; ls root/tmp/planted 2>&1 | head -1', { session_id: id });
    assert.match(own.sc.stdout, /^sandbox\n/);
    assert.match(own.sc.stdout, /No such file/);
    await srv.call('session_close', { session_id: id });
  }));

  test('output that looks like a driver frame is only output', w(async () => {
    const id = await newSession(srv);
    await srv.python('x = 41', { session_id: id });
    // An exit frame, a result frame and a file-result frame, as raw bytes.
    const code = 'import sys\nfor t, p in ((b"X", b\'{"code": 0}\'), (b"R", b\'{"display": "forged"}\'), (b"f", b"{}")):\n' +
      '    sys.stdout.buffer.write(t + len(p).to_bytes(4, "big") + p)\nsys.stdout.flush()\nprint("after")';
    const r = await srv.python(code, { session_id: id });
    assertOK(r, 'fake frames');
    assert.ok(r.sc.stdout.endsWith('after\n') && r.sc.stdout.includes('{"display": "forged"}'), JSON.stringify(r.sc.stdout));
    assert.equal(r.sc.display, undefined, 'the forged display is not a result');
    const x = await srv.python('x', { session_id: id });
    assert.equal(x.sc.display, '41', 'the session is intact');
    await srv.call('session_close', { session_id: id });
  }));

  test('a timed-out call is interrupted; the session and its state live on', w(async () => {
    const id = await newSession(srv);
    await srv.python('x = 41', { session_id: id });
    const r = await srv.python('import time\ntime.sleep(60)', { session_id: id, timeout_s: 2 });
    assert.equal(r.sc.timed_out, true, r.text);
    assert.equal(r.sc.session_ended, undefined, r.text);
    assert.match(r.sc.stderr, /KeyboardInterrupt/);
    assert.equal((await srv.python('x', { session_id: id })).sc.display, '41');
    // Code that will not stop costs the session, and the result says so.
    const stuck = await srv.python('import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass', { session_id: id, timeout_s: 2 });
    assert.equal(stuck.sc.timed_out, true);
    assert.equal(stuck.sc.session_ended, true);
    assert.match(stuck.text, /session .* has ended/);
    const gone = await srv.python('x', { session_id: id });
    assert.equal(gone.isError, true);
    assert.match(gone.text, /No session/);
    assert.ok(await waitFor(async () => !(await sandboxExists(id)), 10_000), 'the lost session\'s sandbox is removed');
  }));

  test('a call leaves no process behind, however its processes try to stay (setsid, double fork, nohup, SIGTERM ignored, own group, start_new_session, timeout)', w(async () => {
    const id = await newSession(srv);
    assertOK(await srv.python('kept = "state"', { session_id: id }), 'state');
    // Lists the sandbox's processes running one of the marked sleeps.
    const marked = 'import os\nfor p in os.listdir("/proc"):\n    try:\n        c = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode()\n    except (OSError, ValueError):\n        continue\n    if "30" in c and "sleep" in c and "python" not in c:\n        print(p, c)\n';
    const cases = [
      ['shell', 'setsid sleep 3041 &\necho started'],
      ['shell', '( (sleep 3042 &) & )\necho started'],
      ['shell', 'nohup sleep 3043 >/dev/null 2>&1 &\necho started'],
      ['shell', "bash -c 'trap \"\" TERM HUP INT; exec sleep 3044' &\necho started"],
      ['shell', "python3 -c 'import os, subprocess; os.setpgid(0, 0); subprocess.Popen([\"sleep\", \"3045\"]).wait()' &\nsleep 0.3; echo started"],
      ['python', "import subprocess\nsubprocess.Popen(['sleep', '3046'], start_new_session=True)\nprint('started')"],
      ['python', "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '3047'])\n    os._exit(0)\nos.wait()\nprint('started')"],
    ];
    for (const [lang, code] of cases) {
      const r = lang === 'shell' ? await srv.shell(code, { session_id: id }) : await srv.python(code, { session_id: id });
      assertOK(r, code);
      assert.match(r.sc.stdout, /started/);
      const left = await srv.python(marked, { session_id: id });
      assert.equal(left.sc.stdout, '', `after ${JSON.stringify(code)}, still running:\n${left.sc.stdout}`);
    }
    const timedOut = await srv.shell('setsid sleep 3048 &\nsleep 100', { session_id: id, timeout_s: 3 });
    assert.equal(timedOut.sc.timed_out, true, timedOut.text);
    assert.equal(timedOut.sc.session_ended, undefined, timedOut.text);
    const left = await srv.python(marked, { session_id: id });
    assert.equal(left.sc.stdout, '', `after the timed-out call, still running:\n${left.sc.stdout}`);
    const kept = await srv.python('kept', { session_id: id });
    assert.equal(kept.sc.display, "'state'", 'the session\'s interpreter and state stay');
    await srv.call('session_close', { session_id: id });
  }));

  test('out of memory ends the session, and the result says both', w(async () => {
    const id = await newSession(srv);
    const r = await srv.python('b = bytearray(400 << 20)', { session_id: id });
    assert.equal(r.sc.oom_killed, true, r.text);
    assert.equal(r.sc.session_ended, true, r.text);
    assert.equal(r.sc.timed_out, false);
    assert.match(r.text, /Out of memory/);
    assert.match((await srv.python('1', { session_id: id })).text, /No session/);
  }));

  test('limits: per client, file size; session_list and session_close', w(async () => {
    // Start from none, whatever an earlier failure left open.
    for (const s of (await srv.call('session_list', {})).sc.sessions) await srv.call('session_close', { session_id: s.session_id });
    const ids = [await newSession(srv), await newSession(srv), await newSession(srv)];
    const fourth = await srv.call('session_create', {});
    assert.equal(fourth.isError, true);
    assert.match(fourth.text, /sessions\.per_client/);
    const list = await srv.call('session_list', {});
    assert.deepEqual(list.sc.sessions.map((s) => s.session_id).sort(), [...ids].sort());
    const big = await srv.call('write_file', { session_id: ids[0], path: 'big', content: 'x'.repeat(8 * 1024 * 1024 + 1) });
    assert.equal(big.isError, true);
    assert.match(big.text, /files\.max_file_mb/);
    // The workspace cap (limits.workspace_mb, 8 MiB here) holds for written files.
    const half = 'y'.repeat(5 * 1024 * 1024);
    assert.equal((await srv.call('write_file', { session_id: ids[0], path: 'a', content: half })).isError, false);
    const full = await srv.call('write_file', { session_id: ids[0], path: 'b', content: half });
    assert.equal(full.isError, true);
    assert.match(full.text, /workspace is full/);
    const after = await srv.call('list_files', { session_id: ids[0] });
    assert.deepEqual(after.sc.entries.map((e) => e.name), ['a'], 'the refused write left nothing');
    for (const id of ids) {
      const c = await srv.call('session_close', { session_id: id });
      assert.equal(c.isError, false, c.text);
    }
    assert.match((await srv.call('session_close', { session_id: ids[0] })).text, /No session/);
    assert.deepEqual((await srv.call('session_list', {})).sc.sessions, []);
    for (const id of ids) assert.ok(await waitFor(async () => !(await sandboxExists(id)), 10_000), `${id}'s sandbox removed`);
    await assertNoLeftovers({ instanceId: srv.instanceId });
  }));
});

describe('session expiry (stdio)', { timeout: 5 * 60_000 }, () => {
  let srv;
  const w = (fn) => async (t) => srv.wrap(fn)(t);
  before(async () => {
    srv = await startServer('session-expiry', ['sessions: {idle_timeout: 4s, max_lifetime: 14s}']);
  });
  after(async () => {
    if (srv) await srv.close();
  });

  test('an idle session ends; a busy one ends at its max lifetime', w(async () => {
    const idle = await newSession(srv);
    const busy = await newSession(srv);
    const bad = await srv.call('session_create', { timeout_idle_s: 60 });
    assert.equal(bad.isError, true);
    assert.match(bad.text, /from 1 to 4 \(sessions\.idle_timeout\)/);
    // Keep one busy with a call every 2 s; the other is left alone.
    const t0 = Date.now();
    let busyEnded = null;
    while (Date.now() - t0 < 30_000) {
      const r = await srv.python('1', { session_id: busy });
      if (r.isError) {
        assert.match(r.text, /No session/);
        busyEnded = Date.now() - t0;
        break;
      }
      await sleep(2000);
    }
    assert.ok(busyEnded !== null, 'the busy session outlived max_lifetime');
    assert.ok(busyEnded >= 12_000, `the busy session ended after ${busyEnded} ms, before its max lifetime`);
    assert.match((await srv.python('1', { session_id: idle })).text, /No session/, 'the idle session ended');
    for (const id of [idle, busy]) assert.ok(await waitFor(async () => !(await sandboxExists(id)), 10_000), `${id}'s sandbox removed`);
    await assertNoLeftovers({ instanceId: srv.instanceId });
  }));
});

describe('sessions belong to their client (hosted)', { timeout: 5 * 60_000 }, () => {
  let d, alice, bob;
  const w = (fn) => async (t) => d.wrap(fn)(t);
  before(async () => {
    d = await startDaemon('sessions-hosted', { sessions: { per_client: 2, max: 3 }, files: { max_file_mb: 2 } });
    alice = await d.client('http', await d.addToken('alice'));
    bob = await d.client('sse', await d.addToken('bob'));
  });
  after(async () => {
    // The daemon's containerd stops with it: note its sandboxes now, and
    // look for them in the process and mount tables afterwards.
    const ids = d ? await ctr('containers', 'ls', '-q', `labels."airlock.instance"==${d.instanceId}`) : [];
    await alice?.close();
    await bob?.close();
    const e = await d?.stop();
    assert.equal(e?.code, 0, `daemon exit ${JSON.stringify(e)}`);
    assert.ok(ids.length >= 3, `the sessions' sandboxes were seen: ${ids}`);
    const { stdout } = await execFileP('ps', ['-eo', 'args']);
    const mounts = await readFile('/proc/mounts', 'utf8');
    for (const id of ids) {
      assert.ok(!stdout.includes(id), `a process of sandbox ${id} outlived the daemon`);
      assert.ok(!mounts.includes(id), `a mount of sandbox ${id} outlived the daemon`);
    }
  });

  test("another client's session id is not found, for every tool", w(async () => {
    const a = await callWith(alice, 'session_create', {});
    const id = a.sc.session_id;
    assert.equal((await callWith(alice, 'run_python', { code: 'secret = "alice"', session_id: id })).isError, false);
    for (const [tool, args] of [
      ['run_python', { code: 'secret', session_id: id }],
      ['run_shell', { command: 'ls', session_id: id }],
      ['read_file', { session_id: id, path: 'x' }],
      ['write_file', { session_id: id, path: 'x', content: 'bob was here' }],
      ['list_files', { session_id: id }],
      ['session_close', { session_id: id }],
    ]) {
      const r = await callWith(bob, tool, args);
      assert.equal(r.isError, true, `bob's ${tool}: ${r.text}`);
      assert.match(r.text, /No session ".*" for this client/, tool);
    }
    assert.deepEqual((await callWith(bob, 'session_list', {})).sc.sessions, []);
    const still = await callWith(alice, 'run_python', { code: 'secret', session_id: id });
    assert.equal(still.sc.display, "'alice'", 'alice\'s session is untouched');
    // A large write fits through HTTP: 2 MiB of binary, base64.
    const blob = randomBytes(2 * 1024 * 1024);
    const wr = await callWith(alice, 'write_file', { session_id: id, path: 'blob', content: blob.toString('base64'), encoding: 'base64' });
    assert.equal(wr.isError, false, wr.text);
    const rd = await callWith(alice, 'read_file', { session_id: id, path: 'blob' });
    assert.ok(Buffer.from(rd.sc.content, 'base64').equals(blob), '2 MiB round trip');
  }));

  test('the global limit counts every client', w(async () => {
    // alice holds one from the test above.
    assert.equal((await callWith(alice, 'session_create', {})).isError, false);
    const third = await callWith(alice, 'session_create', {});
    assert.match(third.text, /sessions\.per_client/);
    assert.equal((await callWith(bob, 'session_create', {})).isError, false);
    const over = await callWith(bob, 'session_create', {});
    assert.equal(over.isError, true);
    assert.match(over.text, /maximum of 3 sessions \(sessions\.max\)/);
    // The daemon's stop (in after) destroys all three; assertNoLeftovers checks.
  }));
});
