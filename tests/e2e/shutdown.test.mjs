// End-to-end test 11: when its client goes away (stdin reaches EOF), the
// server exits on its own and leaves no sandbox behind, even with a run in
// flight.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { after, describe, test } from 'node:test';

import { STATE_DIR, assertNoLeftovers, busySandboxes, ctr, guardianPids, instanceLeftovers, leftovers, sleep, startServer, waitFor } from './lib.mjs';

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
      assert.ok(await srv.cleanedUp(10_000), 'the guardian did not finish within 10 s of the exit');
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
      assert.ok(await srv.cleanedUp(10_000), 'the guardian did not finish within 10 s of the exit');

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

// A desktop client closing a window: the official SDK ends stdin, sends
// SIGTERM 2 s later and SIGKILL 2 s after that. The server must be gone
// before the SIGTERM, and nothing of its instance may stay, even when it is
// SIGKILLed with a full pool and a networked session.
describe('leaving nothing behind when the client goes away', { timeout: 5 * 60_000 }, () => {
  const NET = ['network:', '  allow_domains: [allowed.test]', '  bridge: airlockg0', '  subnet: 10.89.238.0/24', '  proxy_port: 3150'];
  const POOL = 2;
  let keeper;
  const started = [];
  const start = async (label, extra) => {
    const s = await startServer(label, extra);
    started.push(s);
    return s;
  };
  after(async () => {
    for (const s of started.reverse()) await s.close().catch(() => {});
  });

  /**
   * A server with a full pool and a networked session that has run a call,
   * and the ids of its containers.
   */
  async function busyServer(label) {
    // The keeper holds the embedded containerd up for ctr, and starts first
    // so that its own boot-time sweep cannot do the guardian's work.
    keeper ??= await start('keeper', [...NET, 'pool: {size: 0}']);
    const srv = await start(label, [...NET, `pool: {size: ${POOL}, preload: []}`]);
    assert.ok(srv.instanceId, 'could not find the instance id of the server under test');
    const created = await srv.call('session_create', { network: 'allowlist' });
    assert.equal(created.isError, false, created.text);
    const r = await srv.python('print("in-session")', { session_id: created.sc.session_id });
    assert.equal(r.sc?.stdout, 'in-session\n', r.text);
    const idle = `labels."airlock.instance"==${srv.instanceId},labels."airlock.pool"==idle`;
    // One pool per network mode: POOL sandboxes without a network, POOL with.
    assert.ok(await waitFor(async () => (await ctr('containers', 'ls', '-q', idle)).length === 2 * POOL, 120_000, 200), 'the pool never filled');
    const ids = await ctr('containers', 'ls', '-q', `labels."airlock.instance"==${srv.instanceId}`);
    assert.equal(ids.length, 2 * POOL + 1, `want ${2 * POOL} pooled sandboxes and the session's: ${ids}`);
    const before = await instanceLeftovers(srv.instanceId, ids);
    assert.equal(before.netns.length, POOL + 1, `the networked sandboxes' namespaces: ${JSON.stringify(before)}`);
    assert.equal(before.ips.length, POOL + 1, `the networked sandboxes' IP allocations: ${JSON.stringify(before)}`);
    assert.ok(before.cgroups.length >= 1, `no sandbox cgroup found to watch: ${JSON.stringify(before)}`);
    return { srv, ids };
  }

  /** Runs act, which makes srv leave; resolves to its exit status and the ms from act to the exit. */
  async function timedExit(srv, act) {
    let exitedAt = null;
    srv.exited.then(() => { exitedAt = performance.now(); });
    const t0 = performance.now();
    await act();
    const exit = await srv.exited;
    return { exit, ms: (exitedAt ?? performance.now()) - t0 };
  }

  const empty = (lo) => Object.values(lo).every((v) => v.length === 0);

  /** Asserts nothing of srv's instance is left, waiting at most ms for it. */
  async function assertGone(srv, ids, ms) {
    const t0 = performance.now();
    let lo;
    const gone = await waitFor(async () => empty(lo = await instanceLeftovers(srv.instanceId, ids)), ms, 100);
    const snaps = (await ctr('snapshots', 'ls')).slice(1).map((l) => l.split(/\s+/)[0]).filter((k) => ids.includes(k));
    assert.ok(gone, `left of instance ${srv.instanceId} after ${ms} ms: ${JSON.stringify(lo)}`);
    assert.deepEqual(snaps, [], 'snapshots of its sandboxes');
    assert.ok(!existsSync(path.join(STATE_DIR, 'instances', srv.instanceId + '.lock')), 'instance lock file left behind');
    return performance.now() - t0;
  }

  test('closing the SDK transport: the server exits before the SDK\'s SIGTERM and its guardian leaves nothing', async (t) => {
    const { srv, ids } = await busyServer('sdk-close');
    await srv.wrap(async () => {
      const { exit, ms } = await timedExit(srv, () => srv.client.close());
      t.diagnostic(`exited ${ms.toFixed(0)} ms after the transport closed: ${JSON.stringify(exit)}`);
      assert.deepEqual(exit, { code: 0, signal: null }, 'exit status');
      // StdioClientTransport.close() sends SIGTERM 2 s after ending stdin.
      assert.ok(ms < 2000, `exited ${ms.toFixed(0)} ms after stdin closed: the SDK had sent SIGTERM`);
      const took = await assertGone(srv, ids, 10_000);
      t.diagnostic(`nothing left ${(ms + took).toFixed(0)} ms after the transport closed`);
      assert.deepEqual(await guardianPids(srv.instanceId), [], 'the guardian is still running after its work');
      assert.ok(keeper.alive(), 'the keeper died too');
    })(t);
  });

  test('SIGTERM with no run in flight: the server exits before the SDK\'s SIGKILL and its guardian leaves nothing', async (t) => {
    const { srv, ids } = await busyServer('sigterm');
    await srv.wrap(async () => {
      const { exit, ms } = await timedExit(srv, () => process.kill(srv.pid, 'SIGTERM'));
      t.diagnostic(`exited ${ms.toFixed(0)} ms after SIGTERM: ${JSON.stringify(exit)}`);
      assert.deepEqual(exit, { code: 0, signal: null }, 'exit status');
      // The SDK sends SIGKILL 2 s after its SIGTERM.
      assert.ok(ms < 2000, `exited ${ms.toFixed(0)} ms after SIGTERM: the SDK had sent SIGKILL`);
      await assertGone(srv, ids, 10_000);
    })(t);
  });

  test('SIGKILL: the guardian removes the pool, the session, its network and cgroups within 10 s', async (t) => {
    const { srv, ids } = await busyServer('sigkill');
    await srv.wrap(async () => {
      assert.equal((await guardianPids(srv.instanceId)).length, 1, 'no guardian running for the server');
      const t0 = performance.now();
      process.kill(srv.pid, 'SIGKILL');
      const exit = await srv.exited;
      assert.equal(exit.signal, 'SIGKILL');
      const took = await assertGone(srv, ids, 10_000 - (performance.now() - t0));
      t.diagnostic(`nothing left ${(performance.now() - t0).toFixed(0)} ms after SIGKILL (sweep wait ${took.toFixed(0)} ms)`);
      assert.ok(keeper.alive(), 'the keeper died too');
    })(t);
  });
});
