// Regressions of the adversarial pass (issue 14), through the real server:
// raw JSON-RPC over stdio for what an SDK would never send (a retry that
// carries someone else's approval, a 100 MB message), and two deployments
// of airlock on one host.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';

import { RawStdio, STATE_DIR, airlockCLI, auditRecords, consoleConfig, startServer, waitFor } from './lib.mjs';

const run = promisify(execFile);

const ACCEPT = { airlock_approval: { action: 'accept', content: { approve: true } } };
const MODERN_META = {
  'io.modelcontextprotocol/protocolVersion': '2026-07-28',
  'io.modelcontextprotocol/clientCapabilities': { elicitation: {} },
  'io.modelcontextprotocol/clientInfo': { name: 'mallory', version: '0' },
};

const resultText = (m) => (m.result?.content ?? []).map((c) => c.text ?? '').join('');

describe('approval: only the channel a request went to decides it', { timeout: 5 * 60_000 }, () => {
  let raw, dir, cfg, auditFile;
  before(async () => {
    let lines;
    ({ dir, lines, cfg, auditFile } = await consoleConfig('airlock_e2e_selfapprove_'));
    raw = await new RawStdio('self-approval', lines).start(); // no elicitation: the console decides
  });
  after(async () => {
    await raw?.close();
    await rm(dir, { recursive: true, force: true });
  });

  test('the requester\'s retry with "accept" is refused in both protocol generations; the console still decides', async () => {
    const code = "print('self-' + 'approved')";
    const call = raw.request('tools/call', { name: 'run_python', arguments: { code } }, { id: 'waiting', timeoutMs: 120_000 });
    const ids = await waitFor(async () => {
      const r = await airlockCLI(['approvals', 'list', '--config', cfg]);
      const l = [...r.stdout.matchAll(/^=== ([0-9a-f]{32})$/gm)].map((m) => m[1]);
      return l.length ? l : null;
    }, 30_000);
    assert.equal(ids?.length, 1, 'one request waits on the console');
    const id = ids[0];
    assert.ok(!raw.stderr.includes(id), 'the approval id is not written where the requesting client reads (stderr)');

    const legacy = await raw.request('tools/call', { name: 'run_python', arguments: { code }, requestState: id, inputResponses: ACCEPT });
    assert.equal(legacy.result?.isError, true, `2025-11-25 retry: ${JSON.stringify(legacy)}`);
    assert.match(resultText(legacy), /no approval request with that id is waiting for this client/);

    const modern = await raw.request('tools/call', { name: 'run_python', arguments: { code }, requestState: id, inputResponses: ACCEPT, _meta: MODERN_META });
    assert.ok(modern.error || modern.result?.isError === true, `2026-07-28 retry ran: ${JSON.stringify(modern)}`);
    assert.doesNotMatch(JSON.stringify(modern), /self-approved/);

    // Still waiting for the console, which denies it.
    const still = await airlockCLI(['approvals', 'list', '--config', cfg]);
    assert.match(still.stdout, new RegExp(`=== ${id}`), 'the request is still the console\'s to decide');
    const deny = await airlockCLI(['approvals', 'deny', id, '--config', cfg]);
    assert.equal(deny.code, 0, deny.stderr);
    const denied = await call;
    assert.equal(denied.result?.isError, true);
    assert.match(resultText(denied), /denied/);
    const recs = await auditRecords(auditFile);
    assert.ok(recs.length >= 1);
    assert.ok(recs.every((r) => r.decision !== 'approved' && r.outcome !== 'ran'), `nothing ran: ${JSON.stringify(recs)}`);
  });
});

describe('stdio: one message cannot take hundreds of MiB', { timeout: 5 * 60_000 }, () => {
  let raw;
  before(async () => {
    raw = await new RawStdio('big-message').start();
  });
  after(async () => {
    await raw?.close();
  });

  const rssKiB = async () => {
    const s = await (await import('node:fs/promises')).readFile(`/proc/${raw.proc.pid}/status`, 'utf8');
    return Number(/^VmRSS:\s+(\d+)\s+kB/m.exec(s)[1]);
  };

  test('a 100 MB line is refused with a JSON-RPC error to its id, memory stays flat, the next message is served', async () => {
    const before = await rssKiB();
    const refused = raw.response(42, 120_000);
    await raw.write('{"jsonrpc":"2.0","method":"tools/call","params":{"name":"run_python","arguments":{"code":"');
    const chunk = 'x'.repeat(1 << 20);
    for (let i = 0; i < 100; i++) await raw.write(chunk);
    await raw.write('"}},"id":42}\n');
    const m = await refused;
    assert.equal(m.error?.code, -32600, JSON.stringify(m));
    assert.match(m.error.message, /refused: a stdio message may hold at most \d+ bytes/);
    const grew = (await rssKiB()) - before;
    // Bounded by the message limit (8 MiB) and the collector's slack, not
    // by the message: reading it whole took 392 MiB.
    assert.ok(grew < 96 * 1024, `the server grew by ${grew} KiB reading a 100 MB message`);
    const list = await raw.request('tools/list', {});
    assert.ok(list.result?.tools?.some((t) => t.name === 'run_python'), `next message: ${JSON.stringify(list).slice(0, 300)}`);
  });
});

describe('two deployments on one host', { timeout: 10 * 60_000 }, () => {
  // A: the suite's usual state_dir; B: a state_dir of its own with its own
  // embedded containerd, bridge, subnet and table.
  const netA = ['network:', '  allow_domains: [allowed.test]', '  bridge: airlockda0', '  subnet: 10.89.240.0/24', '  table: airlock_e2e_a', '  proxy_port: 3140'];
  const netB = ['network:', '  allow_domains: [allowed.test]', '  bridge: airlockdb0', '  subnet: 10.89.241.0/24', '  table: airlock_e2e_b', '  proxy_port: 3140'];
  let a, dirB, dirC;
  before(async () => {
    a = await startServer('deployment-a', [...netA, 'pool: {size: 0}']);
    dirB = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_depb_'));
    dirC = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_depc_'));
    // B imports the image A's deployment built instead of building its own.
    const archive = (await readdir(path.join(STATE_DIR, 'images'))).find((f) => /^sandbox-.*\.tar$/.test(f));
    assert.ok(archive, `no image archive in ${STATE_DIR}/images`);
    const cfgB = path.join(dirB, 'image.yaml');
    await writeFile(cfgB, `state_dir: ${JSON.stringify(dirB)}\n`);
    const built = await airlockCLI(['image', 'import', path.join(STATE_DIR, 'images', archive), '--tag', 'airlock.local/sandbox:bookworm', '--config', cfgB], { timeoutMs: 300_000 });
    assert.equal(built.code, 0, built.stderr);
  });
  after(async () => {
    // A leaves as a desktop client lets it (stdin closed); close() waits
    // for its guardian's cleanup.
    await a?.close();
    await rm(dirB, { recursive: true, force: true });
    await rm(dirC, { recursive: true, force: true });
  });

  test('B starting and leaving removes nothing of A; a clashing C is refused naming the keys', async () => {
    const created = await a.call('session_create', { network: 'allowlist' });
    assert.equal(created.isError, false, created.text);
    const sid = created.sc.session_id;
    assert.equal((await a.python('x = 7', { session_id: sid })).isError, false);

    const b = await startServer('deployment-b', [...netB, 'pool: {size: 0}'], { stateDir: dirB });
    const rb = await b.shell('echo from-b');
    assert.equal(rb.sc.stdout, 'from-b\n', rb.text);
    // B's last instance leaves: its guardian removes its daemon, bridge
    // and table.
    b.child.stdin.end();
    const exitB = await Promise.race([b.exited, new Promise((r) => setTimeout(() => r(null), 60_000))]);
    assert.ok(exitB && exitB.code === 0, `B exited: ${JSON.stringify(exitB)}`);
    assert.ok(await b.cleanedUp(30_000), 'B\'s guardian did not finish');
    await b.close();
    // Nothing of B stays on the host: not even runsc's state root (and the
    // empty-netns bind mount runsc keeps in it).
    const depB = (await readFile(path.join(dirB, 'deployment-id'), 'utf8')).trim();
    assert.ok(!(await readFile('/proc/mounts', 'utf8')).includes(`/run/airlock/runsc/${depB}`), 'B\'s runsc root is unmounted');
    await assert.rejects(readdir(`/run/airlock/runsc/${depB}`), 'B\'s runsc root is removed');

    // A's session sandbox, bridge and firewall are all still there.
    const again = await a.python('x * 6', { session_id: sid });
    assert.equal(again.isError, false, again.text);
    assert.equal(again.sc.display, '42', 'A\'s session kept its state through B\'s start and exit');
    await run('ip', ['link', 'show', 'airlockda0']);
    await run('nft', ['list', 'table', 'inet', 'airlock_e2e_a']);
    await assert.rejects(run('ip', ['link', 'show', 'airlockdb0']), 'B removed its own bridge');
    const r = await a.shell('echo still-a', { network: 'allowlist' });
    assert.equal(r.sc?.stdout, 'still-a\n', r.text);
    await a.call('session_close', { session_id: sid });

    // C takes A's bridge: refused before anything is made, naming the key.
    const cfgC = path.join(dirC, 'config.yaml');
    await writeFile(cfgC, [`state_dir: ${JSON.stringify(dirC)}`, ...netA.map((l) => l.replace('table: airlock_e2e_a', 'table: airlock_e2e_c').replace('10.89.240.0/24', '10.89.242.0/24')), ''].join('\n'));
    const c = await airlockCLI(['gc', '--config', cfgC]);
    assert.notEqual(c.code, 0, c.stdout);
    assert.match(c.stderr, /network\.bridge/);
    assert.match(c.stderr, new RegExp(STATE_DIR.replace(/[/.]/g, '\\$&')));
    // D shares A's daemon and namespace: refused too.
    const cfgD = path.join(dirC, 'd.yaml');
    await writeFile(cfgD, [`state_dir: ${JSON.stringify(path.join(dirC, 'd'))}`, `containerd: {address: ${JSON.stringify(path.join(STATE_DIR, 'containerd', 'containerd.sock'))}}`, ''].join('\n'));
    const d = await airlockCLI(['gc', '--config', cfgD]);
    assert.notEqual(d.code, 0, d.stdout);
    assert.match(d.stderr, /containerd\.namespace/);
  });
});
