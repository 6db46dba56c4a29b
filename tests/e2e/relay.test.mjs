// End-to-end test of the unprivileged relay: a root daemon serves its Unix
// socket; `airlock connect`, run as an ordinary user in group airlock, is the
// stdio MCP server the official TypeScript SDK client talks to. A user
// outside the group is refused.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFile, mkdtemp, rm, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

import { AIRLOCK_BIN, auditRecords, callWith, startDaemon } from './lib.mjs';

const run = promisify(execFile);
const INSIDER = 'airlock-e2e-in';
const OUTSIDER = 'airlock-e2e-out';

/** Makes a system user if it is missing; returns its uid. */
async function ensureUser(name, groups = []) {
  try {
    await run('id', ['-u', name]);
  } catch {
    await run('useradd', ['--system', '--no-create-home', '--shell', '/usr/sbin/nologin', name]);
  }
  if (groups.length) await run('usermod', ['-a', '-G', groups.join(','), name]);
  return Number((await run('id', ['-u', name])).stdout.trim());
}

describe('airlock connect: an unprivileged stdio client through the daemon socket', { timeout: 10 * 60_000 }, () => {
  let d, binDir, bin, insiderUid;
  const clients = [];

  /** An SDK client whose stdio server is `airlock connect` run as user. */
  const connectAs = async (user) => {
    const transport = new StdioClientTransport({
      command: 'runuser',
      args: ['-u', user, '--', bin, 'connect', '--socket', d.socket],
      env: { PATH: process.env.PATH },
      cwd: '/',
      stderr: 'pipe',
    });
    let stderr = '';
    transport.stderr?.on('data', (c) => { stderr += c.toString(); });
    const client = new Client({ name: 'airlock-e2e-relay', version: '0.0.0' });
    clients.push(client);
    try {
      await client.connect(transport, { timeout: 60_000 });
    } catch (err) {
      err.message += `\nrelay stderr: ${stderr}`;
      throw err;
    }
    return client;
  };

  before(async () => {
    await run('getent', ['group', 'airlock']).catch(() => {
      throw new Error('group airlock is missing: scripts/install-deps.sh creates it');
    });
    insiderUid = await ensureUser(INSIDER, ['airlock']);
    await ensureUser(OUTSIDER);
    // The users must be able to run the binary: not from a root-only clone.
    binDir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_bin_'));
    await run('chmod', ['755', binDir]);
    bin = path.join(binDir, 'airlock');
    await copyFile(AIRLOCK_BIN, bin);
    await run('chmod', ['755', bin]);
    d = await startDaemon('relay', {}, { transports: 'http' });
  });

  after(async () => {
    for (const c of clients) await c.close().catch(() => {});
    await d?.stop();
    if (binDir) await rm(binDir, { recursive: true, force: true });
  });

  test('the socket is 0660, group airlock', async () => {
    const st = await stat(d.socket);
    assert.equal(st.mode & 0o777, 0o660);
    const gid = Number((await run('getent', ['group', 'airlock'])).stdout.split(':')[2]);
    assert.equal(st.gid, gid);
    assert.equal(st.uid, 0);
  });

  test('a member of group airlock runs code through the relay, named by its uid', async () => {
    const c = await connectAs(INSIDER);
    const { tools } = await c.listTools();
    assert.ok(tools.some((t) => t.name === 'run_python'));
    const r = await callWith(c, 'run_python', { code: 'import os; print("relayed", os.getuid())' });
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc.stdout, 'relayed 1000\n', 'the code runs as the sandbox user, whoever asked');
    const rec = (await auditRecords(d.auditFile)).find((x) => x.id === r.sc.run_id);
    assert.equal(rec?.client, `uid:${insiderUid}(${INSIDER})`);
    assert.equal(rec?.transport, 'unix');
    const mine = await callWith(c, 'list_runs', {});
    assert.ok(mine.sc.runs.some((x) => x.run_id === r.sc.run_id));
  });

  test('a user outside the group is refused', async () => {
    await assert.rejects(connectAs(OUTSIDER), /permission denied[\s\S]*server\.socket_group/);
  });
});
