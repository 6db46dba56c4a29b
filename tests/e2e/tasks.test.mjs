// End-to-end tests of runs as MCP tasks (protocol 2025-11-25): the built
// airlock as a daemon over streamable HTTP with two tokens, driven by the
// official TypeScript SDK's task client. Runs are real gVisor sandboxes.
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

import { assertNoLeftovers, callWith, sandboxExists, startDaemon, waitFor } from './lib.mjs';

/** Runs a tool as a task; returns the messages the SDK's stream yielded. */
async function streamTask(client, name, args, opts = {}) {
  const seen = { statuses: [], created: null, result: null, error: null };
  const t0 = performance.now();
  for await (const m of client.experimental.tasks.callToolStream({ name, arguments: args }, CallToolResultSchema, opts)) {
    if (m.type === 'taskCreated') seen.created = { task: m.task, at: performance.now() - t0 };
    else if (m.type === 'taskStatus') seen.statuses.push(m.task);
    else if (m.type === 'result') seen.result = m.result;
    else if (m.type === 'error') seen.error = m.error;
    seen.onMessage?.(m);
  }
  seen.ms = performance.now() - t0;
  return seen;
}

/** Alice's runs in flight, from list_runs. */
async function runningRuns(client) {
  const r = await callWith(client, 'list_runs', {});
  return r.sc.runs.filter((x) => x.state === 'running');
}

describe('runs as MCP tasks', { timeout: 10 * 60_000 }, () => {
  let d, alice, bob;
  const w = (fn) => async (t) => d.wrap(fn)(t);

  before(async () => {
    d = await startDaemon('tasks', { limits: { max_timeout_s: 300 } });
    alice = await d.addToken('alice');
    bob = await d.addToken('bob');
  });
  after(async () => {
    const e = await d?.stop();
    assert.equal(e?.code, 0, `daemon exit ${JSON.stringify(e)}`);
  });

  test('the server offers tasks, and run_python, run_shell and write_file as optional tasks', w(async () => {
    const c = await d.client('http', alice);
    try {
      const caps = c.getServerCapabilities();
      assert.ok(caps.tasks?.requests?.tools?.call, `tasks capability: ${JSON.stringify(caps.tasks)}`);
      assert.ok(caps.tasks?.cancel && caps.tasks?.list, `tasks capability: ${JSON.stringify(caps.tasks)}`);
      const { tools } = await c.listTools();
      const optional = tools.filter((t) => t.execution?.taskSupport === 'optional').map((t) => t.name).sort();
      assert.deepEqual(optional, ['run_python', 'run_shell', 'write_file']);
      // A plain call of a task-capable tool is the sync call it always was.
      const r = await callWith(c, 'run_python', { code: 'print(6 * 7)' });
      assert.equal(r.sc.stdout, '42\n');
    } finally {
      await c.close();
    }
  }));

  test('a 90 s task outlives a 30 s request timeout, streams status, and is cancelled and hidden as it should be', w(async () => {
    const a = await d.client('http', alice);
    const b = await d.client('http', bob);
    try {
      // A: 90 s, printing as it goes; every request the SDK makes for it
      // (the call, each tasks/get, tasks/result) has a 30 s timeout.
      const codeA = 'import time\nfor i in range(9):\n    print("tick", i, flush=True)\n    time.sleep(10)\nprint("done")\n';
      const longA = streamTask(a, 'run_python', { code: codeA, timeout_s: 150 }, { timeout: 30_000, task: {} });
      // B: sleeps, to be cancelled.
      let idB;
      const codeB = 'import time\nprint("B started", flush=True)\ntime.sleep(200)\n';
      const cancelB = streamTask(a, 'run_python', { code: codeB, timeout_s: 250 }, { timeout: 30_000, task: {} });
      // Both running, each in its own sandbox.
      const runs = await waitFor(async () => { const r = await runningRuns(a); return r.length === 2 && r; }, 60_000, 250);
      assert.ok(runs, 'two runs in flight');
      const listed = await waitFor(async () => {
        const { tasks } = await a.experimental.tasks.listTasks();
        return tasks.length >= 2 && tasks;
      }, 10_000, 100);
      assert.ok(listed, "alice's tasks/list shows her two tasks");
      // B's status shows its output; that names B's task.
      idB = await waitFor(async () => {
        for (const t of (await a.experimental.tasks.listTasks()).tasks) {
          if ((t.statusMessage ?? '').includes('B started')) return t.taskId;
        }
        return null;
      }, 60_000, 200);
      assert.ok(idB, 'no task status showed B\'s output');
      const idA = listed.map((t) => t.taskId).find((x) => x !== idB);

      // Bob sees none of them and can touch none.
      const bobs = (await b.experimental.tasks.listTasks()).tasks.map((t) => t.taskId);
      assert.ok(!bobs.includes(idA) && !bobs.includes(idB), `bob's tasks/list: ${bobs}`);
      for (const op of [() => b.experimental.tasks.getTask(idB), () => b.experimental.tasks.cancelTask(idB),
        () => b.experimental.tasks.getTaskResult(idA, CallToolResultSchema)]) {
        await assert.rejects(op(), /no task .* for this client/);
      }
      const after = await runningRuns(a);
      assert.equal(after.length, 2, "bob's cancel stopped nothing");

      // Alice cancels B: its sandbox goes within a second, A's stays.
      const sandboxes = await Promise.all(runs.map(async (r) => ({ id: r.run_id, up: await sandboxExists(r.run_id) })));
      assert.ok(sandboxes.every((s) => s.up), `sandboxes up: ${JSON.stringify(sandboxes)}`);
      const t0 = performance.now();
      const cancelled = await a.experimental.tasks.cancelTask(idB);
      assert.equal(cancelled.status, 'cancelled');
      const gone = await waitFor(async () => {
        const left = [];
        for (const r of runs) if (await sandboxExists(r.run_id)) left.push(r.run_id);
        return left.length === 1 && left;
      }, 5_000, 50);
      const ms = performance.now() - t0;
      assert.ok(gone, 'B\'s sandbox still there 5 s after tasks/cancel');
      assert.ok(ms <= 1000, `B's sandbox gone after ${Math.round(ms)} ms, want within 1 s`);
      const b2 = await cancelB;
      assert.ok(b2.error, 'the cancelled task ends in an error for the SDK');

      // A completes, 90 s after it began, with its whole output.
      const r = await longA;
      assert.equal(r.error, null, String(r.error));
      assert.ok(r.ms > 85_000, `A took ${Math.round(r.ms)} ms`);
      assert.ok(r.created.at < 10_000, `the task was created after ${Math.round(r.created.at)} ms`);
      assert.notEqual(r.result.isError, true, JSON.stringify(r.result));
      assert.equal(r.result.structuredContent.stdout, Array.from({ length: 9 }, (_, i) => `tick ${i}\n`).join('') + 'done\n');
      assert.equal(r.result.structuredContent.run_id, gone[0], 'A ran in the sandbox left standing');
      const shown = r.statuses.map((s) => s.statusMessage ?? '').join('');
      assert.match(shown, /tick 1\n/, 'A\'s output streamed as its status while it ran');
      assert.equal(r.statuses.at(-1).status, 'completed');
      // Kept after the end, for its owner only.
      const again = await a.experimental.tasks.getTaskResult(idA, CallToolResultSchema);
      assert.equal(again.structuredContent.stdout, r.result.structuredContent.stdout);
      await assert.rejects(b.experimental.tasks.getTaskResult(idA, CallToolResultSchema), /no task .* for this client/);
    } finally {
      await a.close();
      await b.close();
    }
  }));

  test('a task survives its client disconnecting, and the same client gets its result on reconnect', w(async () => {
    const a = await d.client('http', alice);
    let sessionId, taskId;
    try {
      const first = a.experimental.tasks.callToolStream({ name: 'run_shell', arguments: { command: 'sleep 3; echo survived' } },
        CallToolResultSchema, { task: {} });
      const m = await first.next();
      assert.equal(m.value.type, 'taskCreated');
      taskId = m.value.task.taskId;
      sessionId = a.transport.sessionId;
      await first.return();
    } finally {
      await a.close();
    }
    const again = await d.client('http', alice, { sessionId });
    try {
      const res = await waitFor(async () => {
        const t = await again.experimental.tasks.getTask(taskId);
        return t.status === 'completed' && t;
      }, 30_000, 250);
      assert.ok(res, 'the task did not complete after the disconnect');
      const r = await again.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
      assert.equal(r.structuredContent.stdout, 'survived\n');
    } finally {
      await again.close();
    }
  }));

  test('nothing is left behind', async (t) => {
    await assertNoLeftovers(t);
  });
});
