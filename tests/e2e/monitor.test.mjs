// End-to-end tests of gVisor's runtime monitoring: hostile programs run
// through MCP with the official TypeScript SDK client over stdio; each is
// refused by the sandbox, named in its result, counted in the metric, and
// written to its audit record. With monitor.kill_on the run ends at the
// first attempt. Ordinary programs give no attempts. Every run is real.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { auditRecords, freePort, parseMetrics, startServer } from './lib.mjs';

// Python that makes raw system calls through libc and prints the result.
const SC = `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def sc(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(name, r, os.strerror(ctypes.get_errno()) if r < 0 else "")
`;

const HOSTILE = [
  ['mount a tmpfs', 'python', SC + 'sc("mount", 165, b"none", b"/tmp", b"tmpfs", 0, None)', 'mount', 'mount'],
  ['unshare -r', 'shell', 'unshare -r true; echo "exit $?"', 'namespace', 'unshare'],
  ['ptrace TRACEME', 'python', SC + 'print(libc.ptrace(0, 0, 0, 0))', 'ptrace', 'ptrace'],
  ['setuid(0)', 'python', 'import os\ntry:\n    os.setuid(0)\nexcept PermissionError as e:\n    print("refused", e)', 'privilege', 'setuid'],
  ['finit_module', 'python', SC + 'sc("finit_module", 313, -1, b"", 0)', 'module', 'finit_module'],
  ['bpf', 'python', SC + 'sc("bpf", 321, 0, 0, 0)', 'kernel', 'bpf'],
  ['keyctl', 'python', SC + 'sc("keyctl", 250, 0, 0, 0, 0, 0)', 'kernel', 'keyctl'],
  ['write under /usr', 'shell', 'echo x > /usr/airlock-was-here; echo "exit $?"', 'readonly_write', 'openat'],
  ['raw socket', 'python', 'import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)\nexcept OSError as e:\n    print("refused", e)', 'raw_socket', 'socket'],
];

describe('runtime monitoring through MCP', { timeout: 10 * 60_000 }, () => {
  let srv, dir, auditFile, port;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_monitor_'));
    auditFile = path.join(dir, 'audit.jsonl');
    port = await freePort();
    srv = await startServer('monitor', [
      `audit: {path: ${JSON.stringify(auditFile)}}`,
      `metrics: {listen: "127.0.0.1:${port}"}`,
      'pool: {size: 0}',
    ]);
  });
  after(async () => {
    await srv?.close();
    await rm(dir, { recursive: true, force: true });
  });
  const scrape = async () => parseMetrics(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text());

  for (const [name, lang, code, kind, syscall] of HOSTILE) {
    test(`${name}: refused, named in the result, counted, audited`, async () => {
      await srv.wrap(async () => {
        const metric = `airlock_sandbox_escape_attempts_total{kind="${kind}"}`;
        const before = (await scrape()).get(metric);
        assert.equal(typeof before, 'number', `${metric} is exported before any attempt`);
        const r = lang === 'python' ? await srv.python(code) : await srv.shell(code);
        assert.equal(r.isError, false, r.text);
        const seen = (r.sc.attempts ?? []).find((a) => a.kind === kind && a.syscall === syscall);
        assert.ok(seen && seen.count >= 1, `attempts ${JSON.stringify(r.sc.attempts)} lack ${kind} (${syscall}); stdout ${r.sc.stdout}`);
        assert.match(r.text, new RegExp(`gVisor saw the code try: .*${kind} \\(${syscall}\\)`));
        assert.ok((await scrape()).get(metric) >= before + 1, `${metric} moved`);
        const rec = (await auditRecords(auditFile)).find((x) => x.id === r.sc.run_id);
        assert.ok(rec?.attempts?.some((a) => a.startsWith(`${kind} ${syscall} x`)), JSON.stringify(rec));
      })();
    });
  }

  test('ordinary programs give no attempts', async () => {
    await srv.wrap(async () => {
      const ordinary = [
        ['python', "import numpy, pandas\nprint(pandas.DataFrame({'a': numpy.arange(3)}).sum())"],
        ['python', "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.savefig('/tmp/f.png')"],
        ['python', "import subprocess\nprint(subprocess.run(['ls', '/'], capture_output=True).returncode)"],
        ['python', 'from concurrent.futures import ThreadPoolExecutor\nprint(sum(ThreadPoolExecutor(4).map(lambda x: x * x, range(100))))'],
        ['shell', 'cat /proc/self/status > /dev/null; ls /proc/self/fd > /dev/null; echo hi > a.txt; cat a.txt'],
      ];
      for (const [lang, code] of ordinary) {
        const r = lang === 'python' ? await srv.python(code) : await srv.shell(code);
        assert.equal(r.isError, false, r.text);
        assert.equal(r.sc.exit_code, 0, r.text);
        assert.equal(r.sc.attempts, undefined, `${code}: attempts ${JSON.stringify(r.sc.attempts)}`);
      }
    })();
  });
});

describe('monitor.kill_on', { timeout: 5 * 60_000 }, () => {
  let srv;
  before(async () => {
    srv = await startServer('monitor-kill', ['monitor: {kill_on: [mount, ptrace]}', 'pool: {size: 0}']);
  });
  after(async () => srv?.close());

  test('the run ends at the first attempt, with reason policy_violation', async () => {
    await srv.wrap(async () => {
      const r = await srv.python(SC + 'sc("mount", 165, b"none", b"/tmp", b"tmpfs", 0, None)\nimport time\ntime.sleep(60)\nprint("survived")');
      assert.equal(r.sc.reason, 'policy_violation', r.text);
      assert.ok(!r.sc.stdout.includes('survived'), r.sc.stdout);
      assert.equal(r.sc.attempts?.[0]?.kind, 'mount', JSON.stringify(r.sc.attempts));
    })();
  });
});
