/* global window */
// End-to-end test of airlock's MCP Apps views in a real browser: the views
// come from the built airlock over MCP (resources/read), are hosted in a
// sandboxed iframe under the spec's default CSP by a minimal host page that
// speaks the apps protocol (postMessage JSON-RPC), and are fed a real
// approval request and a real run result. Debian's headless Chromium,
// driven by playwright-core. Screenshots go to tests/e2e/artifacts/.
import assert from 'node:assert/strict';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { E2E_DIR, assertNoLeftovers, launchChromium, startServer, waitFor } from './lib.mjs';

const ARTIFACTS = path.join(E2E_DIR, 'artifacts');
const APP_MIME = 'text/html;profile=mcp-app';
// What a host must apply when a view declares no CSP (MCP Apps 2026-01-26).
const DEFAULT_CSP = "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; media-src 'self' data:; connect-src 'none'";

/** The host page: one sandboxed iframe, and a log of what the view sent. */
function hostPage(html) {
  const doc = html.replace('<head>', `<head><meta http-equiv="Content-Security-Policy" content="${DEFAULT_CSP}">`);
  return `<!doctype html><html><body style="margin:0">
<iframe id="app" sandbox="allow-scripts" style="width:760px;height:400px;border:0"></iframe>
<script>
  const frame = document.getElementById('app');
  window.fromApp = [];
  window.toApp = (m) => frame.contentWindow.postMessage(m, '*');
  window.addEventListener('message', (e) => {
    if (e.source !== frame.contentWindow) return;
    const m = e.data;
    window.fromApp.push(m);
    if (m.method === 'ui/initialize') {
      window.toApp({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: '2026-01-26', hostInfo: { name: 'airlock-e2e-host', version: '0' },
        hostCapabilities: {}, hostContext: { theme: 'light', displayMode: 'inline' } } });
    }
    if (m.method === 'ui/notifications/size-changed' && m.params.height) frame.style.height = Math.min(m.params.height + 4, 1400) + 'px';
  });
  frame.srcdoc = ${JSON.stringify(doc).replace(/<\//g, '<\\/')};
</script></body></html>`;
}

describe('MCP Apps views in headless Chromium', { timeout: 10 * 60_000 }, () => {
  let srv, browser;
  let onElicit = async () => ({ action: 'accept', content: { approve: true } });

  before(async () => {
    srv = await startServer('apps', ['approval: {mode: always, timeout: 60s, console: {listen: ""}}'], {
      onElicit: (req) => onElicit(req),
      capabilities: { extensions: { 'io.modelcontextprotocol/ui': { mimeTypes: [APP_MIME], elicitation: {} } } },
    });
    await mkdir(ARTIFACTS, { recursive: true });
    browser = await launchChromium();
  });

  after(async () => {
    await browser?.close();
    await srv?.close();
  });

  /** Reads a view over MCP and opens it in a host page, initialized. */
  async function openView(uri) {
    const { contents } = await srv.client.readResource({ uri });
    assert.equal(contents.length, 1);
    assert.equal(contents[0].mimeType, APP_MIME);
    const page = await browser.newPage({ viewport: { width: 800, height: 900 } });
    const errors = [];
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.setContent(hostPage(contents[0].text));
    const ok = await waitFor(() => page.evaluate(() => window.fromApp.some((m) => m.method === 'ui/notifications/initialized')), 10_000, 50);
    assert.ok(ok, `the view never finished ui/initialize; errors: ${errors}`);
    return { page, errors, frame: page.frameLocator('#app') };
  }

  test('the server offers the views: the run tools link theirs, the capability names elicitation', async () => srv.wrap(async () => {
    const caps = srv.client.getServerCapabilities();
    assert.ok(caps.extensions?.['io.modelcontextprotocol/ui'], `capabilities: ${JSON.stringify(caps)}`);
    const { tools } = await srv.client.listTools();
    for (const name of ['run_python', 'run_shell']) {
      const t = tools.find((x) => x.name === name);
      assert.equal(t._meta?.ui?.resourceUri, 'ui://airlock/run.html', name);
    }
    const { resources } = await srv.client.listResources();
    assert.deepEqual(resources.map((r) => r.uri).sort(), ['ui://airlock/approval.html', 'ui://airlock/run.html']);
  })());

  test('approval view: shows the exact code with its warning; its answer runs the code', async () => srv.wrap(async () => {
    const { page, errors, frame } = await openView('ui://airlock/approval.html');
    let seen;
    const answered = new Promise((resolve) => {
      onElicit = async (req) => {
        seen = req.params;
        // The host hands the view the elicitation as it came, and returns its answer.
        await page.evaluate((params) => window.toApp({ jsonrpc: '2.0', id: 0, method: 'elicitation/create', params }), req.params);
        const reply = await waitFor(() => page.evaluate(() => window.fromApp.find((m) => m.id === 0 && !m.method)), 30_000, 50);
        resolve(reply);
        return reply.result;
      };
    });
    const code = "name = 'world' # \u202e reversed\nprint('hello from the ' + 'app')\n";
    const run = srv.python(code);
    const pre = frame.locator('pre.code');
    await pre.waitFor({ timeout: 30_000 });
    const shown = await pre.textContent();
    assert.match(shown, /print\('hello from the ' \+ 'app'\)/);
    assert.match(shown, /⟦U\+202E [^⟧]+⟧/, 'the hidden character is shown, not applied');
    const warnings = await frame.locator('ul.warnings').textContent();
    assert.match(warnings, /bidi control characters/);
    assert.match(await frame.locator('h1').textContent(), /Approve this run_python call\?/);
    assert.equal(seen._meta.ui.resourceUri, 'ui://airlock/approval.html');
    await page.screenshot({ path: path.join(ARTIFACTS, 'apps-approval.png'), fullPage: true });
    await frame.locator('button.approve').click();
    const reply = await answered;
    assert.deepEqual(reply.result, { action: 'accept', content: { approve: true } });
    const r = await run;
    assert.equal(r.isError, false, r.text);
    assert.equal(r.sc.stdout, 'hello from the app\n');
    assert.deepEqual(errors, []);
    await page.close();
  })());

  test('result view: output, the value shown, and a figure inline', async () => srv.wrap(async () => {
    onElicit = async () => ({ action: 'accept', content: { approve: true } });
    const { page, errors, frame } = await openView('ui://airlock/run.html');
    const code = [
      'import matplotlib.pyplot as plt, pandas as pd',
      'print("plotted", 3, "points")',
      'plt.plot([1, 2, 3], [2, 4, 1]); plt.title("airlock figure")',
      'pd.DataFrame({"x": [1, 2, 3], "y": [2, 4, 1]})',
    ].join('\n');
    await page.evaluate((args) => window.toApp({ jsonrpc: '2.0', method: 'ui/notifications/tool-input', params: { arguments: args } }), { code });
    const r = await srv.python(code);
    assert.equal(r.isError, false, r.text);
    assert.ok(r.res.content.some((c) => c.type === 'image'), 'the run returned a figure');
    await page.evaluate((res) => window.toApp({ jsonrpc: '2.0', method: 'ui/notifications/tool-result', params: res }), r.res);
    const img = frame.locator('img.figure');
    await img.waitFor({ timeout: 10_000 });
    const loaded = await waitFor(() => img.evaluate((el) => el.complete && el.naturalWidth > 0 && el.naturalWidth), 10_000, 50);
    assert.ok(loaded > 100, `figure naturalWidth ${loaded}`);
    assert.equal(await frame.locator('#stdout').textContent(), 'plotted 3 points\n');
    assert.match(await frame.locator('#display').textContent(), /x\s+y\n0\s+1\s+2/);
    assert.equal(await frame.locator('#status').textContent(), 'exit 0');
    await page.screenshot({ path: path.join(ARTIFACTS, 'apps-result.png'), fullPage: true });
    assert.deepEqual(errors, []);
    await page.close();
  })());

  test('nothing is left behind', async () => {
    await assertNoLeftovers({ instanceId: srv.instanceId });
  });
});
