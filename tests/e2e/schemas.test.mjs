// The Inspector's schema check: every tool's input and output schema is
// portable (no "type" lists, which clients that map schemas onto a
// single-type dialect reject), as `mcp-inspector --cli --method tools/list
// --strict` (Inspector 2.12) judges it against the built binary.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { AIRLOCK_BIN, BOOT_TIMEOUT_MS, E2E_DIR, STATE_DIR } from './lib.mjs';

const INSPECTOR = path.join(E2E_DIR, 'node_modules', '.bin', 'mcp-inspector');

test('tools/list passes the Inspector --strict schema check with no errors or warnings', { timeout: BOOT_TIMEOUT_MS + 60_000 }, async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_schemas_'));
  try {
    const config = path.join(dir, 'config.yaml');
    // No pool: listing tools needs no sandbox.
    await writeFile(config, `state_dir: ${JSON.stringify(STATE_DIR)}\nlog: {level: warn}\npool: {size: 0}\n`);
    const { code, stdout, stderr } = await new Promise((resolve) => {
      execFile(INSPECTOR, ['--cli', '--method', 'tools/list', '--strict', '--', AIRLOCK_BIN, 'serve', '--transport', 'stdio', '--config', config],
        { timeout: BOOT_TIMEOUT_MS, maxBuffer: 16 << 20 }, (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr }));
    });
    // What the Inspector says; airlock's own log lines start with time=.
    const said = stderr.split('\n').filter((l) => l.trim() && !l.startsWith('time=')).join('\n');
    assert.equal(code, 0, `inspector exited ${code}:\n${stderr}`);
    assert.doesNotMatch(said, /Warning|Error|warnings across/, `the strict check found problems:\n${said}`);
    const names = JSON.parse(stdout).tools.map((t) => t.name).sort();
    assert.deepEqual(names, ['cancel_run', 'list_files', 'list_runs', 'read_file', 'run_python', 'run_shell',
      'session_close', 'session_create', 'session_fork', 'session_list', 'session_pause', 'write_file']);
    const run = JSON.parse(stdout).tools.find((t) => t.name === 'run_python');
    assert.equal(run.outputSchema.properties.attempts.type, 'array', 'the output schema lists were checked');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
