// End-to-end test 11: when its client goes away (stdin reaches EOF), the
// server exits on its own and leaves no sandbox behind, even with a run in
// flight.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { after, describe, test } from 'node:test';

import { STATE_DIR, assertNoLeftovers, busySandboxes, ctr, leftovers, sleep, startServer, waitFor } from './lib.mjs';

const EXIT_WITHIN_MS = 15_000;

/** Ends the server's stdin (what a client closing does) and waits for its exit. */
async function eofAndWait(srv) {
  assert.ok(srv.child, 'no handle on the server process (SDK internals changed?)');
  const t0 = performance.now();
  srv.child.stdin.end();
  let timer;
  const exit = await Promise.race([srv.exited, new Promise((r) => { timer = setTimeout(() => r(null), EXIT_WITHIN_MS); })]);
  clearTimeout(timer);
  return { exit, ms: performance.now() - t0 };
}

describe('shutdown on client EOF', { timeout: 5 * 60_000 }, () => {
  const started = [];
  const start = async (label) => {
    const s = await startServer(label);
    started.push(s);
    return s;
  };

  after(async () => {
    for (const s of started.reverse()) await s.close().catch(() => {});
  });

  test('an idle server exits on EOF', async (t) => {
    const srv = await start('idle');
    await srv.wrap(async () => {
      const r = await srv.python('print(1)');
      assert.equal(r.sc?.stdout, '1\n');
      const { exit, ms } = await eofAndWait(srv);
      t.diagnostic(`exited after ${ms.toFixed(0)} ms: ${JSON.stringify(exit)}`);
      assert.ok(exit, `server pid ${srv.pid} still running ${EXIT_WITHIN_MS} ms after EOF on stdin`);
      assert.deepEqual(exit, { code: 0, signal: null }, 'exit status after EOF');
      assert.ok(!srv.alive(), 'process still exists');
      if (srv.instanceId) {
        assert.ok(!existsSync(path.join(STATE_DIR, 'instances', srv.instanceId + '.lock')), 'instance lock file left behind');
      }
    })(t);
  });

  test('a server with a run in flight exits on EOF and removes its sandbox', async (t) => {
    // The keeper holds the shared embedded containerd up, so ctr can look
    // after the server under test is gone. It starts first, so its boot-time
    // sweep of dead instances cannot tidy up for the server under test.
    const keeper = await start('keeper');
    const srv = await start('inflight');
    await srv.wrap(async () => {
      assert.ok(srv.instanceId, 'could not find the instance id of the server under test');
      const filter = `labels."airlock.instance"==${srv.instanceId}`;
      const inflight = srv.shell('sleep 1000', { timeout_s: 300 }, { timeoutMs: 600_000 }).then(
        (r) => ({ resolved: r }),
        (err) => ({ rejected: err }),
      );
      const running = await waitFor(async () => {
        const c = await busySandboxes(srv.instanceId);
        const tasks = await ctr('tasks', 'ls', '-q');
        return c.length === 1 && tasks.includes(c[0]) ? c[0] : null;
      }, 30_000, 100);
      assert.ok(running, 'the in-flight sandbox never showed up in containerd');
      await sleep(500);

      const { exit, ms } = await eofAndWait(srv);
      t.diagnostic(`exited after ${ms.toFixed(0)} ms: ${JSON.stringify(exit)}`);
      assert.ok(exit, `server pid ${srv.pid} still running ${EXIT_WITHIN_MS} ms after EOF with a run in flight`);
      assert.equal(exit.signal, null, 'killed by a signal');
      assert.ok(!srv.alive(), 'process still exists');

      const outcome = await inflight;
      assert.ok(outcome.rejected || outcome.resolved, 'in-flight call settled');

      const mine = await leftovers({ containerFilter: filter });
      assert.deepEqual(mine.containers, [], `containers labelled with the exited instance ${srv.instanceId}`);
      // The exited instance is dead: nothing of it is excused.
      await assertNoLeftovers({ instanceId: srv.instanceId });
      const all = await leftovers();
      assert.ok(!all.tasks.includes(running), `task ${running} remains`);
      assert.ok(!all.snapshots.includes(running), `snapshot ${running} remains`);
      assert.deepEqual(all.mounts.filter((l) => l.includes(running)), [], `mounts of ${running} remain`);
      assert.ok(keeper.alive(), 'the keeper server died too');
    })(t);
  });
});
