// Soak: SOAK_RUNS calls (default 1000) from SOAK_CLIENTS concurrent SDK
// clients (default 20), each with its own token, over streamable HTTP to
// one daemon, mixing normal, failing, timing-out, out-of-memory and
// output-flood programs. Every call is accounted for in the results, the
// metrics and the audit log; afterwards the daemon's goroutines, open
// files, memory, containers and network namespaces are back within the
// bounds stated below.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';

import { auditRecords, callWith, ctr, parseMetrics, sleep, startDaemon, waitFor } from './lib.mjs';

const execFileP = promisify(execFile);
const RUNS = Number(process.env.SOAK_RUNS || 1000);
const CLIENTS = Number(process.env.SOAK_CLIENTS || 20);

// Growth allowed between the warmed-up daemon and the settled one.
const BOUNDS = { goroutines: 40, fds: 16, rssMiB: 96 };

// The mix, by call number modulo 10.
const PROGRAMS = [
  { kind: 'ok', tool: 'run_python', args: { code: 'print(sum(range(1000)))' } },
  { kind: 'ok', tool: 'run_shell', args: { command: 'echo hi; ls /workspace >/dev/null' } },
  { kind: 'failed', tool: 'run_python', args: { code: 'raise ValueError("soak")' } },
  { kind: 'ok', tool: 'run_python', args: { code: 'import json; print(json.dumps({"a": 1}))' } },
  { kind: 'timeout', tool: 'run_python', args: { code: 'import time; time.sleep(30)', timeout_s: 1 } },
  { kind: 'ok', tool: 'run_shell', args: { command: 'seq 1 100 | tail -n 1' } },
  { kind: 'out_of_memory', tool: 'run_python', args: { code: 'b = []\nwhile True: b.append(bytearray(32 << 20))' } },
  { kind: 'failed', tool: 'run_shell', args: { command: 'exit 3' } },
  { kind: 'ok', tool: 'run_python', args: { code: 'import sys\nsys.stdout.write("y" * 5_000_000)' }, flood: true },
  { kind: 'ok', tool: 'run_python', args: { code: 'print("done")' } },
];

async function netnsCount() {
  const { stdout } = await execFileP('ip', ['netns', 'list']);
  return stdout.split('\n').filter((l) => l.startsWith('airlock-')).length;
}

describe(`soak: ${RUNS} runs from ${CLIENTS} clients`, { timeout: 40 * 60_000 }, () => {
  let d;
  const tokens = [];
  before(async () => {
    d = await startDaemon('soak', {
      // Calls wait for a sandbox rather than being turned away.
      limits: { concurrency: 4, queue: CLIENTS, queue_wait_s: 300 },
    });
    for (let i = 0; i < CLIENTS; i++) tokens.push(await d.addToken(`soak-${i}`));
  });
  after(async () => {
    const e = await d?.stop();
    assert.equal(e?.code, 0, `daemon exit ${JSON.stringify(e)}`);
  });

  test('every call accounted for; nothing grows', async (t) => d.wrap(async () => {
    const scrape = async () => {
      const r = await fetch(`${d.url}/metrics`, { headers: { Authorization: `Bearer ${tokens[0]}` } });
      assert.equal(r.status, 200);
      return parseMetrics(await r.text());
    };
    const clients = [];
    for (const tok of tokens) clients.push(await d.client('http', tok));
    try {
      // Warm up (a first run of each kind), then take the baseline.
      for (const p of PROGRAMS) await callWith(clients[0], p.tool, p.args);
      await sleep(3000);
      const base = await scrape();
      const netnsBase = await netnsCount();

      const want = {};
      const got = {};
      const mismatched = [];
      let next = 0;
      const t0 = Date.now();
      await Promise.all(clients.map(async (c) => {
        for (;;) {
          const n = next++;
          if (n >= RUNS) return;
          const p = PROGRAMS[n % PROGRAMS.length];
          want[p.kind] = (want[p.kind] ?? 0) + 1;
          const r = await callWith(c, p.tool, p.args, { timeout: 600_000 });
          const kind = !r.sc ? `error: ${r.text.slice(0, 120)}`
            : r.sc.reason === 'timeout' ? 'timeout'
              : r.sc.reason === 'out_of_memory' ? 'out_of_memory'
                : r.sc.exit_code === 0 ? 'ok' : 'failed';
          got[kind] = (got[kind] ?? 0) + 1;
          if (kind !== p.kind) {
            // The whole result, so a flake says what the call really got.
            const { stdout, stderr, ...rest } = r.sc ?? {};
            mismatched.push({ call: n, want: p.kind, got: kind, ...rest, stdout: stdout?.slice(-300), stderr: stderr?.slice(-1000) });
          }
          if (p.flood) assert.equal(r.sc?.stdout_truncated, true, 'the flood is cut at the cap');
        }
      }));
      t.diagnostic(`${RUNS} calls in ${((Date.now() - t0) / 1000).toFixed(0)} s: ${JSON.stringify(got)}`);
      for (const m of mismatched) t.diagnostic(`mismatch: ${JSON.stringify(m)}`);
      assert.deepEqual(got, want, `every call got the result its program should; mismatched: ${JSON.stringify(mismatched.slice(0, 5))}`);

      // Settle: teardowns finish, the pool refills.
      await sleep(10_000);
      const end = await scrape();
      const moved = (k) => (end.get(k) ?? 0) - (base.get(k) ?? 0);
      let counted = 0;
      const byOutcome = {};
      for (const [k] of end) {
        const m = /^airlock_executions_total\{outcome="([^"]+)",tool="(run_python|run_shell)"\}$/.exec(k);
        if (m) {
          counted += moved(k);
          byOutcome[m[1]] = (byOutcome[m[1]] ?? 0) + moved(k);
        }
      }
      assert.equal(counted, RUNS, `airlock_executions_total moved by ${counted}`);
      for (const [kind, n] of Object.entries(want)) assert.equal(byOutcome[kind], n, `executions{outcome=${kind}}`);
      assert.equal(moved('airlock_resource_limit_violations_total{limit="timeout"}'), want.timeout);
      assert.equal(moved('airlock_resource_limit_violations_total{limit="memory"}'), want.out_of_memory);
      assert.ok(moved('airlock_resource_limit_violations_total{limit="output"}') >= RUNS / 10 - 1);

      const records = (await auditRecords(d.auditFile)).filter((r) => r.tool === 'run_python' || r.tool === 'run_shell');
      assert.equal(records.length, RUNS + PROGRAMS.length, 'one audit record per call (the warm-up included)');
      assert.ok(records.every((r) => r.outcome === 'ran'), 'every call ran');

      const growth = {
        goroutines: moved('go_goroutines'),
        fds: moved('process_open_fds'),
        rssMiB: moved('process_resident_memory_bytes') / (1 << 20),
      };
      t.diagnostic(`growth after the soak: ${JSON.stringify(growth)} (bounds ${JSON.stringify(BOUNDS)})`);
      for (const [k, bound] of Object.entries(BOUNDS)) assert.ok(growth[k] <= bound, `${k} grew by ${growth[k]}, bound ${bound}`);
      assert.equal(await netnsCount(), netnsBase, 'network namespaces');

      // Containers: only this daemon's warm pool is left.
      const mine = await waitFor(async () => {
        const ids = await ctr('containers', 'ls', '-q', `labels."airlock.instance"==${d.instanceId}`);
        const busy = [];
        for (const id of ids) {
          const info = JSON.parse((await ctr('containers', 'info', id)).join('\n'));
          if (!['idle', 'warming'].includes(info.Labels?.['airlock.pool'])) busy.push(id);
        }
        return busy.length === 0 ? ids : null;
      }, 30_000, 1000);
      assert.ok(mine, 'only pooled sandboxes are left');
      assert.ok(mine.length <= 2, `${mine.length} pooled sandboxes, pool.size is 2`);
    } finally {
      await Promise.all(clients.map((c) => c.close()));
    }
  })());
});
