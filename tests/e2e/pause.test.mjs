// End-to-end tests of paused sessions: session_pause, the idle pause
// (sessions.pause_after), a paused session surviving an airlock restart,
// session_fork, and a damaged checkpoint. The built airlock over stdio,
// real gVisor sandboxes checkpointed and restored by runsc.
import assert from 'node:assert/strict';
import { readdir, readFile, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { after, describe, test } from 'node:test';

import { STATE_DIR, assertNoLeftovers, sandboxExists, startServer, waitFor } from './lib.mjs';

/** The checkpoint directory of session id (one deployment per state_dir). */
async function checkpointDir(id) {
  const base = path.join(STATE_DIR, 'checkpoints');
  for (const dep of await readdir(base)) {
    const dir = path.join(base, dep, id);
    try {
      await stat(path.join(dir, 'manifest.json'));
      return dir;
    } catch {
      // another deployment's
    }
  }
  return null;
}

async function newSession(srv) {
  const r = await srv.call('session_create', {});
  assert.equal(r.isError, false, `session_create: ${r.text}`);
  return r.sc.session_id;
}

async function listed(srv, id) {
  const r = await srv.call('session_list', {});
  return r.sc.sessions.find((s) => s.session_id === id);
}

describe('paused sessions (stdio)', { timeout: 10 * 60_000 }, () => {
  const servers = [];
  const start = async (label, extra = []) => {
    const s = await startServer(label, extra);
    servers.push(s);
    await s.client.listTools(); // the SDK checks structuredContent against each outputSchema
    return s;
  };
  after(async () => {
    for (const s of servers) await s.close();
  });

  test('session_pause frees the sandbox; after an airlock restart the next call resumes it', async () => {
    const a = await start('pause-a', ['sessions: {pause_after: 0s}']);
    const id = await newSession(a);
    const r1 = await a.python('import os\nx = 41\nos.makedirs("d")\nos.chdir("d")\nopen("f.txt", "w").write("kept")', { session_id: id });
    assert.equal(r1.sc.exit_code, 0, r1.text);
    const p = await a.call('session_pause', { session_id: id });
    assert.equal(p.isError, false, p.text);
    assert.equal(p.sc.paused, true);
    assert.equal((await listed(a, id)).paused, true);
    assert.equal(await sandboxExists(id), false, 'a paused session has no sandbox');
    assert.ok(await checkpointDir(id), 'its checkpoint is on disk');
    await a.close();

    const b = await start('pause-b', ['sessions: {pause_after: 0s}']);
    // The new airlock lists it before any call, still paused.
    assert.equal((await listed(b, id))?.paused, true, 'session_list after the restart shows the paused session');
    const r2 = await b.python('(x + 1, os.getcwd(), open("f.txt").read())', { session_id: id });
    assert.equal(r2.isError, false, r2.text);
    assert.equal(r2.sc.display, "(42, '/workspace/d', 'kept')");
    assert.ok(r2.sc.resumed_ms > 0, `resumed_ms ${r2.sc.resumed_ms}`);
    assert.match(r2.text, /paused; this call resumed it first \(\d+ ms\)/);
    assert.equal(await checkpointDir(id), null, 'the checkpoint is gone once resumed');
    const f = await b.call('read_file', { session_id: id, path: 'd/f.txt' });
    assert.equal(f.sc.content, 'kept');

    // A fork has the same state and goes its own way.
    const fk = await b.call('session_fork', { session_id: id });
    assert.equal(fk.isError, false, fk.text);
    const fid = fk.sc.session_id;
    assert.notEqual(fid, id);
    assert.equal((await b.python('x = 0\nx', { session_id: fid })).sc.display, '0');
    assert.equal((await b.python('x', { session_id: id })).sc.display, '41');
    for (const s of [id, fid]) assert.equal((await b.call('session_close', { session_id: s })).isError, false);
    await assertNoLeftovers({ instanceId: b.instanceId });
  });

  test('an idle session pauses on its own after sessions.pause_after', async () => {
    const srv = await start('pause-idle', ['sessions: {pause_after: 1s}']);
    const id = await newSession(srv);
    assert.equal((await srv.python('y = [1, 2]', { session_id: id })).sc.exit_code, 0);
    assert.ok(await waitFor(async () => (await listed(srv, id))?.paused, 30_000, 500), 'paused within 30 s');
    assert.equal(await sandboxExists(id), false);
    const r = await srv.python('y', { session_id: id });
    assert.equal(r.sc.display, '[1, 2]');
    assert.ok(r.sc.resumed_ms > 0);
    await srv.call('session_close', { session_id: id });
  });

  test('a damaged checkpoint ends the session with a message, never resumes it', async () => {
    const srv = await start('pause-damaged', ['sessions: {pause_after: 0s}']);
    const id = await newSession(srv);
    await srv.python('z = 1', { session_id: id });
    assert.equal((await srv.call('session_pause', { session_id: id })).isError, false);
    const dir = await checkpointDir(id);
    const mf = JSON.parse(await readFile(path.join(dir, 'manifest.json'), 'utf8'));
    const victim = path.join(dir, 'image', mf.files[0].name);
    const buf = await readFile(victim);
    buf[buf.length >> 1] ^= 0xff;
    await writeFile(victim, buf);
    const r = await srv.python('z', { session_id: id });
    assert.equal(r.isError, true);
    assert.match(r.text, /session has ended .*damaged.*start another with session_create/);
    assert.equal(await checkpointDir(id), null, 'the damaged checkpoint is removed');
    const again = await srv.python('z', { session_id: id });
    assert.match(again.text, /No session/);
  });
});
