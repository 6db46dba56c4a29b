// End-to-end test of the approval console in a real browser: Debian's
// headless Chromium, driven by playwright-core, loads the console, sees the
// pending code (with its hidden characters made visible), clicks approve,
// and sees the run's result. Screenshots go to tests/e2e/artifacts/.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { E2E_DIR, freePort, launchChromium, startServer } from './lib.mjs';

const ARTIFACTS = path.join(E2E_DIR, 'artifacts');

describe('approval console in headless Chromium', { timeout: 10 * 60_000 }, () => {
  let srv, dir, port, browser;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_browser_'));
    port = await freePort();
    srv = await startServer('browser', [
      `approval: {mode: always, timeout: 120s, console: {listen: "127.0.0.1:${port}", token_file: ${JSON.stringify(path.join(dir, 'tokens'))}}}`,
      `audit: {path: ${JSON.stringify(path.join(dir, 'audit.jsonl'))}}`,
    ]);
    await mkdir(ARTIFACTS, { recursive: true });
    browser = await launchChromium();
  });

  after(async () => {
    await browser?.close();
    await srv?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test('load the page, see the pending code, approve, see the result', async (t) => srv.wrap(async () => {
    const call = srv.python("name = 'world' # \u202e reversed\nprint('hello from the ' + 'console')\n", {}, { timeoutMs: 120_000 });
    const token = (await readFile(path.join(dir, 'tokens'), 'utf8')).trim().split(':')[1];
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${port}/#token=${token}`);
    // The token left the address bar as soon as the page read it.
    assert.equal(new URL(page.url()).hash, '');

    const code = page.locator('article.request pre.code');
    await code.waitFor({ timeout: 30_000 });
    const shown = await code.textContent();
    assert.match(shown, /print\('hello from the ' \+ 'console'\)/);
    assert.match(shown, /⟦U\+202E RIGHT-TO-LEFT OVERRIDE⟧/, 'the bidi override is made visible');
    // Every line is numbered; the count and hash stand by the buttons.
    assert.match(shown, /^1│ name = 'world'/m);
    assert.match(shown, /^2│ print\('hello from the '/m);
    assert.match(await page.locator('article.request .decide-summary').textContent(), /exactly 2 lines, \d+ bytes, sha256 [0-9a-f]{16}/);
    assert.match(await page.locator('article.request .warnings').textContent(), /bidi control characters/);
    assert.match(await page.locator('article.request .client').textContent(), /stdio:/);
    await page.screenshot({ path: path.join(ARTIFACTS, 'console-pending.png'), fullPage: true });

    await page.locator('article.request button.approve').click();
    const r = await call;
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc.stdout, 'hello from the console\n');

    // The approver sees what came of it.
    const row = page.locator('#recent tbody tr').first();
    await row.locator('td.output pre', { hasText: 'hello from the console' }).waitFor({ timeout: 10_000 });
    const rowText = await row.textContent();
    assert.match(rowText, /approved by console:approver/);
    assert.match(rowText, /ran/);
    assert.equal(await page.locator('article.request').count(), 0, 'the request left the pending list');
    await page.screenshot({ path: path.join(ARTIFACTS, 'console-approved.png'), fullPage: true });
  })(t));
});
