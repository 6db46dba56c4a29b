// End-to-end tests of the approval gate and the audit log: the built
// airlock over stdio, the official TypeScript SDK client declaring
// elicitation (its user scripted per test), the web console through
// `airlock approvals`, and `airlock audit tail`. Every run is real.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';

import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

import { STATE_DIR, assertNoLeftovers, auditRecords, airlockCLI, consoleConfig, sleep, startServer, waitFor } from './lib.mjs';

const execFileP = promisify(execFile);

/** A scripted user: answers the next elicitations with `next`, keeps what it was shown. */
function scriptedUser() {
  const user = {
    shown: [],
    next: { action: 'decline' },
    async onElicit(req) {
      user.shown.push(req.params.message);
      const n = user.next;
      if (n === 'never') return new Promise(() => {}); // the user walked away
      return n;
    },
  };
  return user;
}

const APPROVE = { action: 'accept', content: { approve: true } };

describe('approval through elicitation (stdio)', { timeout: 10 * 60_000 }, () => {
  let srv, dir, auditFile;
  const user = scriptedUser();
  const w = (fn) => async (t) => srv.wrap(fn)(t);

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_approval_'));
    auditFile = path.join(dir, 'audit.jsonl');
    srv = await startServer('approval', [
      'approval: {mode: always, timeout: 4s, console: {listen: ""}}',
      `audit: {path: ${JSON.stringify(auditFile)}}`,
    ], { onElicit: user.onElicit });
  });
  after(async () => {
    await srv?.close();
    await rm(dir, { recursive: true, force: true });
  });

  test('accept runs the code; the user saw exactly it, with its limits', w(async () => {
    user.next = APPROVE;
    const before = user.shown.length;
    const r = await srv.python("print('approved-' + 'run')");
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc.stdout, 'approved-run\n');
    assert.equal(user.shown.length, before + 1, 'the user was asked once');
    const msg = user.shown.at(-1);
    assert.match(msg, /Approve this run_python call\?/);
    assert.match(msg, /print\('approved-' \+ 'run'\)/);
    assert.match(msg, /Limits: timeout 30 s, memory 256 MiB/);
    assert.match(msg, /Network: none/);
  }));

  test('a run as a task is input_required while the user decides, then completes', w(async () => {
    let release;
    user.next = new Promise((r) => { release = r; });
    const statuses = [];
    let result = null, error = null;
    for await (const m of srv.client.experimental.tasks.callToolStream(
      { name: 'run_python', arguments: { code: "print('task-' + 'approved')" } }, CallToolResultSchema, { task: {} })) {
      if (m.type === 'taskStatus') {
        statuses.push(m.task.status);
        if (m.task.status === 'input_required') release(APPROVE);
      } else if (m.type === 'result') result = m.result;
      else if (m.type === 'error') error = m.error;
    }
    assert.equal(error, null, String(error));
    assert.ok(statuses.includes('input_required'), `statuses seen: ${statuses}`);
    assert.match(user.shown.at(-1), /print\('task-' \+ 'approved'\)/);
    assert.notEqual(result.isError, true, JSON.stringify(result));
    assert.equal(result.structuredContent.stdout, 'task-approved\n');
  }));

  test('decline and cancel do not run; no sandbox is made', w(async () => {
    for (const action of ['decline', 'cancel']) {
      user.next = { action };
      const r = await srv.shell('echo should-not-run');
      assert.equal(r.isError, true, `${action}: ${r.text}`);
      assert.match(r.text, /^Not run:/, action);
      assert.equal(r.sc, undefined, `${action}: a denial has no run result`);
    }
    user.next = { action: 'accept', content: { approve: false } };
    const r = await srv.shell('echo should-not-run');
    assert.equal(r.isError, true, `accept without the box ticked: ${r.text}`);
    await assertNoLeftovers({ instanceId: srv.instanceId });
  }));

  test('no answer within approval.timeout denies', w(async () => {
    user.next = 'never';
    const t0 = Date.now();
    const r = await srv.python('print(1)', {}, { timeoutMs: 30_000 });
    const ms = Date.now() - t0;
    assert.equal(r.isError, true, r.text);
    assert.match(r.text, /expired/);
    assert.ok(ms >= 3500 && ms < 15_000, `denied after ${ms} ms, want about the 4 s timeout`);
  }));

  test('code cannot forge the end of the code: every line numbered, the real end states count and hash', w(async () => {
    user.next = { action: 'decline' };
    const code = "print('hello')\n───── end of code ─────\n" +
      'Expires 2026-12-03T17:00:00Z (in 300 s). Approve only what you have read in full.\n' +
      '\u3164\n'.repeat(60) + ' \n'.repeat(40) + "__import__('os').system('id')\n";
    const r = await srv.python(code);
    assert.equal(r.isError, true, r.text);
    const lines = user.shown.at(-1).split('\n');
    const frame = lines.flatMap((l, i) => (l.startsWith('─────') ? [i] : []));
    assert.equal(frame.length, 2, `two frame lines, begin and end:\n${lines.join('\n')}`);
    const sha = createHash('sha256').update(code).digest('hex');
    assert.equal(lines[frame[1]], `───── end of code: 104 lines, sha256 ${sha} ─────`);
    const inside = lines.slice(frame[0] + 1, frame[1]);
    for (const l of inside) assert.match(l, /^ *(\d+(-\d+)?│ | *┆ )/, `a code line without its number: ${l}`);
    assert.ok(inside.some((l) => /^ *104│ __import__\('os'\)\.system\('id'\)$/.test(l)), 'the last line is inside the frame, numbered');
    assert.ok(inside.some((l) => /^ *2│ ───── end of code ─────$/.test(l)), 'the forged end is a numbered code line');
    assert.ok(!user.shown.at(-1).includes('\u3164'), 'blank-looking characters are made visible');
  }));

  test('hidden characters are shown for what they are', w(async () => {
    user.next = { action: 'decline' };
    await srv.python("access = 'user' # \u202e } \u2066if admin\u2069 \u2066\nprint('safe')\r__import__('os').system('id')\n");
    const msg = user.shown.at(-1);
    assert.match(msg, /⟦U\+202E RIGHT-TO-LEFT OVERRIDE⟧/);
    assert.match(msg, /print\('safe'\)⟦CR⟧__import__\('os'\)\.system\('id'\)/);
    assert.match(msg, /bidi control characters/);
    assert.match(msg, /carriage return without newline/);
    assert.ok(!/[\u202e\u2066\u2069\r]/.test(msg), 'the raw characters are not in the message');
  }));

  test('every call leaves exactly one well-formed audit record', w(async () => {
    const before = (await auditRecords(auditFile)).length;
    user.next = APPROVE;
    const ran = await srv.python('import sys; sys.exit(3)'); // approved, fails
    user.next = { action: 'decline' };
    await srv.python('print(2)'); // denied
    await srv.python(''); // invalid: never asks
    await srv.call('run_python', { code: 'x', approved: true }); // invalid: unknown argument
    const recs = (await auditRecords(auditFile)).slice(before);
    assert.equal(recs.length, 4, JSON.stringify(recs, null, 1));
    const [failed, denied, empty, approvedArg] = recs;
    assert.equal(failed.decision, 'approved');
    assert.equal(failed.outcome, 'ran');
    assert.equal(failed.exit_code, 3);
    assert.equal(failed.channel, 'elicitation');
    assert.match(failed.approver, /^elicitation:stdio:/);
    assert.equal(failed.client, denied.client);
    assert.equal(failed.code, 'import sys; sys.exit(3)');
    assert.match(failed.code_sha256, /^[0-9a-f]{64}$/);
    assert.equal(denied.decision, 'denied');
    assert.equal(denied.exit_code, null);
    assert.equal(empty.outcome, 'invalid_arguments');
    assert.equal(approvedArg.outcome, 'invalid_arguments');
    assert.match(approvedArg.error, /unknown argument "approved"/);
    for (const r of recs) {
      assert.equal(r.transport, 'stdio');
      assert.ok(r.id && r.time && r.tool === 'run_python', JSON.stringify(r));
    }
    // The result names its record by the line's hash, and the log's chain,
    // seals and head check out.
    const line = (await readFile(auditFile, 'utf8')).split('\n').find((l) => l.includes(`"id":"${failed.id}"`));
    assert.equal(ran.sc.audit_record, createHash('sha256').update(line).digest('hex'));
    const cfg = path.join(dir, 'verify.yaml');
    await writeFile(cfg, `state_dir: ${JSON.stringify(STATE_DIR)}\naudit: {path: ${JSON.stringify(auditFile)}}\n`);
    const v = await airlockCLI(['audit', 'verify', '--config', cfg]);
    assert.equal(v.code, 0, v.stdout + v.stderr);
    assert.match(v.stdout, /^ok: \d+ records/);
  }));

  test('a file written into a session is approved like code, and recorded', w(async () => {
    const created = await srv.call('session_create', {});
    assert.equal(created.isError, false, created.text);
    const id = created.sc.session_id;
    const before = (await auditRecords(auditFile)).length;
    // Denied: the human saw the path and the exact content; nothing is written.
    user.next = { action: 'decline' };
    const denied = await srv.call('write_file', { session_id: id, path: 'job.py', content: "import os\nos.system('id')\n" });
    assert.equal(denied.isError, true, denied.text);
    assert.match(denied.text, /^Not run:/);
    const shown = user.shown.at(-1);
    assert.match(shown, /write_file/);
    assert.match(shown, /# write_file job\.py \(26 bytes\)/);
    assert.match(shown, /os\.system\('id'\)/);
    assert.match(shown, new RegExp(`Session: ${id}`));
    // Approved: written, then a run of it is approved on its own.
    user.next = APPROVE;
    const ok = await srv.call('write_file', { session_id: id, path: 'job.py', content: "print('from the file')\n" });
    assert.equal(ok.isError, false, ok.text);
    const run = await srv.python('exec(open("job.py").read())', { session_id: id });
    assert.equal(run.sc.stdout, 'from the file\n', run.text);
    assert.equal(user.shown.at(-1).includes('exec(open("job.py").read())'), true);
    const recs = (await auditRecords(auditFile)).slice(before);
    assert.deepEqual(recs.map((r) => [r.tool, r.decision, r.outcome]), [
      ['write_file', 'denied', 'not_approved'], ['write_file', 'approved', 'ran'], ['run_python', 'approved', 'ran']]);
    for (const r of recs) assert.equal(r.session, id);
    assert.equal(recs[1].path, 'job.py');
    assert.equal(recs[1].code, "print('from the file')\n");
    assert.equal(recs[1].code_bytes, 23);
    await srv.call('session_close', { session_id: id });
  }));
});

describe('audit log that cannot be written', { timeout: 5 * 60_000 }, () => {
  let srv, dir;
  before(async () => {
    // A read-only bind mount: root ignores permissions, not a read-only mount.
    dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_roaudit_'));
    await execFileP('mount', ['--bind', dir, dir]);
    await execFileP('mount', ['-o', 'remount,bind,ro', dir]);
    srv = await startServer('ro-audit', [`audit: {path: ${JSON.stringify(path.join(dir, 'audit.jsonl'))}}`]);
  });
  after(async () => {
    await srv?.close();
    await execFileP('umount', [dir]).catch(() => {});
    await rm(dir, { recursive: true, force: true });
  });

  test('calls fail clearly instead of running unrecorded', async () => {
    const r = await srv.shell('echo ran > /dev/null; echo unrecorded');
    assert.equal(r.isError, true, r.text);
    assert.match(r.text, /audit log cannot be written/);
    assert.match(r.text, /audit\.path/);
    assert.equal(r.sc, undefined, 'nothing ran');
    await assertNoLeftovers({ instanceId: srv.instanceId });
  });
});

describe('approval through the console and `airlock approvals`', { timeout: 10 * 60_000 }, () => {
  let srv, dir, cfg, auditFile;
  before(async () => {
    let lines;
    ({ dir, lines, cfg, auditFile } = await consoleConfig('airlock_e2e_console_'));
    srv = await startServer('console', lines); // no elicitation: the console is the channel
  });
  after(async () => {
    await srv?.close();
    await rm(dir, { recursive: true, force: true });
  });

  const pendingIds = async () => {
    const r = await airlockCLI(['approvals', 'list', '--config', cfg]);
    return [...r.stdout.matchAll(/^=== ([0-9a-f]{32})$/gm)].map((m) => m[1]);
  };

  test('approve with the CLI: the call runs and returns its output', async () => {
    const call = srv.python("print('via-' + 'console')", {}, { timeoutMs: 90_000 });
    const ids = await waitFor(async () => { const l = await pendingIds(); return l.length ? l : null; }, 20_000);
    assert.ok(ids?.length === 1, 'one request waiting on the console');
    const list = await airlockCLI(['approvals', 'list', '--config', cfg]);
    assert.match(list.stdout, /print\('via-' \+ 'console'\)/);
    assert.match(list.stdout, /Client: stdio:/);
    const ok = await airlockCLI(['approvals', 'approve', ids[0], '--config', cfg]);
    assert.equal(ok.code, 0, ok.stderr);
    const r = await call;
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc.stdout, 'via-console\n');
    // A second decision is refused.
    const again = await airlockCLI(['approvals', 'approve', ids[0], '--config', cfg]);
    assert.notEqual(again.code, 0);
    assert.match(again.stderr, /already decided/);
  });

  test('deny with the CLI; the audit log tells the story', async () => {
    const call = srv.shell('echo denied-by-console', {}, { timeoutMs: 90_000 });
    const ids = await waitFor(async () => { const l = await pendingIds(); return l.length ? l : null; }, 20_000);
    const no = await airlockCLI(['approvals', 'deny', ids[0], '--config', cfg]);
    assert.equal(no.code, 0, no.stderr);
    const r = await call;
    assert.equal(r.isError, true);
    assert.match(r.text, /denied the request/);
    const tail = await airlockCLI(['audit', 'tail', '-n', '2', '--config', cfg]);
    assert.equal(tail.code, 0, tail.stderr);
    const lines = tail.stdout.trim().split('\n');
    assert.equal(lines.length, 2, tail.stdout);
    assert.match(lines[0], /run_python .*decision=approved by=console:approver via=console .*outcome=ran exit=0/);
    assert.match(lines[1], /run_shell .*decision=denied by=console:approver via=console .*outcome=not_approved/);
  });

  test('wrong token is refused', async () => {
    const bad = path.join(dir, 'bad-tokens');
    await writeFile(bad, 'mallory:not-the-right-token-at-all\n');
    const r = await airlockCLI(['approvals', 'list', '--config', cfg, '--token-file', bad]);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /HTTP 401/);
  });

  test('the run is not started while it waits', async () => {
    const call = srv.shell('echo slow-approval', {}, { timeoutMs: 90_000 });
    const ids = await waitFor(async () => { const l = await pendingIds(); return l.length ? l : null; }, 20_000);
    await sleep(500);
    await assertNoLeftovers({ instanceId: srv.instanceId });
    await airlockCLI(['approvals', 'deny', ids[0], '--config', cfg]);
    await call;
  });
});
