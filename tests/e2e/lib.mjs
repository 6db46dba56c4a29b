// Shared helpers of the end-to-end suite: start the built airlock binary over
// stdio with the official MCP TypeScript SDK client, call its tools, and look
// at the embedded containerd with ctr.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { CallToolResultSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const execFileP = promisify(execFile);

export const E2E_DIR = path.dirname(fileURLToPath(import.meta.url));
export const AIRLOCK_BIN = process.env.AIRLOCK_BIN || path.resolve(E2E_DIR, '../../bin/airlock');
export const STATE_DIR = process.env.AIRLOCK_E2E_STATE_DIR || '/var/lib/airlock';
export const CTR = process.env.AIRLOCK_E2E_CTR || '/usr/local/bin/ctr';
export const NAMESPACE = 'airlock';
export const SOCK = path.join(STATE_DIR, 'containerd', 'containerd.sock');
// First start may build or import the sandbox image: be generous.
export const BOOT_TIMEOUT_MS = Number(process.env.AIRLOCK_E2E_BOOT_TIMEOUT_MS || 600_000);
const VERBOSE = process.env.AIRLOCK_E2E_VERBOSE === '1';

// The limits every test server runs with (see writeConfig).
export const LIMITS = { workspace_mb: 8, tmp_mb: 8, memory_mb: 256, stdout_bytes: 65536 };

/** The marker airlock appends to output cut at n bytes. */
export const marker = (n) => `[airlock: output truncated at ${n} bytes; the rest was dropped]`;

const STDERR_KEEP = 512 * 1024;

/**
 * A running airlock server and an SDK client connected to it over stdio.
 */
export class Server {
  /**
   * opts.onElicit(request): when set, the client declares the elicitation
   * capability and answers the server's elicitation/create with it.
   * opts.env: extra environment for the server process.
   * opts.client2: connect with the 2026-07-28 generation client
   * (@modelcontextprotocol/client) instead, this being its ClientOptions,
   * e.g. { versionNegotiation: { mode: 'auto' } }; see start.
   */
  constructor(label, extraConfig = [], opts = {}) {
    this.label = label;
    this.extraConfig = extraConfig;
    this.opts = opts;
    this.canary = 'canary-' + randomBytes(16).toString('hex');
    this.stderr = '';
    this.runIds = new Set();
  }

  async start() {
    // opts.stateDir: another deployment's state (default STATE_DIR).
    // No "airlock-" in this name: the suite greps for that prefix.
    this.dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_'));
    this.configPath = path.join(this.dir, 'config.yaml');
    await writeFile(this.configPath, [
      `state_dir: ${JSON.stringify(this.opts.stateDir ?? STATE_DIR)}`,
      'log: {level: info}',
      `limits: {workspace_mb: ${LIMITS.workspace_mb}, tmp_mb: ${LIMITS.tmp_mb}, memory_mb: ${LIMITS.memory_mb}, stdout_bytes: ${LIMITS.stdout_bytes}}`,
      ...this.extraConfig,
      '',
    ].join('\n'));
    // opts.client2: the 2.x client (its ClientOptions), which negotiating
    // first probes server/discover on a disposable sibling process; every
    // message it sends is kept in this.sent, every one it receives in
    // this.received.
    const gen2 = Boolean(this.opts.client2);
    const C = gen2 ? (await import('@modelcontextprotocol/client')).Client : Client;
    const T = gen2 ? (await import('@modelcontextprotocol/client/stdio')).StdioClientTransport : StdioClientTransport;
    this.transport = new T({
      command: AIRLOCK_BIN,
      args: ['serve', '--transport', 'stdio', '--config', this.configPath],
      env: { PATH: process.env.PATH, AIRLOCK_E2E_CANARY: this.canary, ...(this.opts.env ?? {}) },
      stderr: 'pipe',
    });
    this.transport.stderr.on('data', (chunk) => {
      const s = chunk.toString();
      if (VERBOSE) process.stderr.write(`[${this.label}] ${s}`);
      this.stderr += s;
      if (this.stderr.length > STDERR_KEEP) this.stderr = this.stderr.slice(-STDERR_KEEP);
    });
    if (gen2) {
      this.sent = [];
      this.received = [];
      const send = this.transport.send.bind(this.transport);
      this.transport.send = (message, options) => {
        this.sent.push(message);
        return send(message, options);
      };
    }
    // opts.capabilities: more client capabilities (extensions, say).
    const capabilities = { ...(this.opts.onElicit ? { elicitation: { form: {} } } : {}), ...(this.opts.capabilities ?? {}) };
    this.client = gen2
      ? new C({ name: 'airlock-e2e-client2', version: '0.0.0' }, { ...this.opts.client2, capabilities })
      : new C({ name: 'airlock-e2e', version: '0.0.0' }, { capabilities });
    if (this.opts.onElicit) {
      this.client.setRequestHandler(gen2 ? 'elicitation/create' : ElicitRequestSchema, (req) => this.opts.onElicit(req));
    }
    try {
      await this.client.connect(this.transport, { timeout: BOOT_TIMEOUT_MS });
      // A 2026-07-28 connect made its one round trip with the sibling: wait
      // for this process to answer too (and so to have written its lock).
      if (gen2 && this.client.getProtocolEra() === 'modern') await this.client.discover({ timeout: BOOT_TIMEOUT_MS });
    } catch (err) {
      throw this.annotate(err, 'connect (initialize) failed');
    }
    if (gen2) {
      const onmessage = this.transport.onmessage;
      this.transport.onmessage = (message, extra) => {
        this.received.push(message);
        onmessage?.(message, extra);
      };
    }
    // StdioClientTransport's ChildProcess (a private field in 1.32.2 and
    // 2.x), used only to end stdin by hand and to see how the process exited.
    this.child = this.transport._process;
    this.pid = this.transport.pid;
    this.exited = new Promise((resolve) => {
      if (!this.child) return resolve({ code: null, signal: null, unknown: true });
      if (this.child.exitCode !== null || this.child.signalCode !== null) {
        return resolve({ code: this.child.exitCode, signal: this.child.signalCode });
      }
      this.child.once('exit', (code, signal) => resolve({ code, signal }));
    });
    this.instanceId = await findInstanceId(this.pid, this.opts.stateDir);
    return this;
  }

  /** Calls a tool with raw arguments (no client-side input validation). */
  async call(name, args, { timeoutMs = 120_000 } = {}) {
    if (this.opts.client2) return this.call2(name, args, { timeout: timeoutMs });
    const t0 = performance.now();
    let res;
    try {
      res = await this.client.callTool({ name, arguments: args }, CallToolResultSchema, { timeout: timeoutMs });
    } catch (err) {
      throw this.annotate(err, `callTool ${name} ${JSON.stringify(args).slice(0, 200)} threw`);
    }
    const ms = performance.now() - t0;
    const sc = res.structuredContent;
    if (sc && sc.run_id) this.runIds.add(sc.run_id);
    const text = res.content?.find((c) => c.type === 'text')?.text ?? '';
    return { res, sc, text, ms, isError: res.isError === true };
  }

  /** call() with the 2.x client; opts are its RequestOptions (timeout, signal, onprogress). */
  async call2(name, args, opts = {}) {
    let r;
    try {
      r = await callWith2(this.client, name, args, opts);
    } catch (err) {
      throw this.annotate(err, `callTool (2.x client) ${name} ${JSON.stringify(args).slice(0, 200)} threw`);
    }
    if (r.sc && r.sc.run_id) this.runIds.add(r.sc.run_id);
    return r;
  }

  python(code, extra = {}, opts) { return this.call('run_python', { code, ...extra }, opts); }
  shell(command, extra = {}, opts) { return this.call('run_shell', { command, ...extra }, opts); }

  /** VmRSS of the airlock process in KiB, or null when it is gone. */
  async rssKiB() {
    try {
      const s = await readFile(`/proc/${this.pid}/status`, 'utf8');
      const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(s);
      return m ? Number(m[1]) : null;
    } catch {
      return null;
    }
  }

  alive() {
    try {
      process.kill(this.pid, 0);
      return true;
    } catch {
      return false;
    }
  }

  /** Adds the tail of the server's stderr to an error. */
  annotate(err, what) {
    const e = err instanceof Error ? err : new Error(String(err));
    e.message = `${what ? what + ': ' : ''}${e.message}\n${this.stderrTail()}`;
    return e;
  }

  stderrTail(n = 6000) {
    return `----- airlock server "${this.label}" (pid ${this.pid}, instance ${this.instanceId}) stderr, last ${n} chars -----\n` +
      this.stderr.slice(-n) + '\n----- end of server stderr -----';
  }

  /**
   * Wraps a test body: on failure the server's stderr tail is added to the
   * error, so a red run shows what the server said.
   */
  wrap(fn) {
    return wrapping(this, fn);
  }

  /**
   * Waits for the process to exit and then for its guardian to finish
   * removing what the instance made; resolves to whether both happened
   * within ms.
   */
  async cleanedUp(ms = 30_000) {
    return cleanedUp(this.exited, this.instanceId, ms);
  }

  async close() {
    try {
      await this.client?.close();
      await this.cleanedUp();
    } finally {
      if (this.dir) await rm(this.dir, { recursive: true, force: true });
    }
  }
}

/**
 * The pids of the guardians (`airlock guard --instance ID`) of instanceId
 * that are still running.
 */
export async function guardianPids(instanceId) {
  if (!instanceId) return [];
  const out = [];
  for (const d of await readdir('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    let args;
    try {
      args = (await readFile(`/proc/${d}/cmdline`, 'utf8')).split('\0');
    } catch {
      continue;
    }
    const i = args.indexOf('--instance');
    if (args.includes('guard') && i >= 0 && args[i + 1] === instanceId) out.push(Number(d));
  }
  return out;
}

/** Waits for exited, then for instanceId's guardian to be gone, within ms. */
async function cleanedUp(exited, instanceId, ms) {
  const t0 = performance.now();
  let timer;
  const exit = await Promise.race([exited, new Promise((r) => { timer = setTimeout(() => r(null), ms); })]);
  clearTimeout(timer);
  if (!exit) return false;
  const left = Math.max(0, ms - (performance.now() - t0));
  return Boolean(await waitFor(async () => (await guardianPids(instanceId)).length === 0, left, 50));
}

/**
 * What of instanceId is left on the host: containers labelled with it (in
 * the state_dir's containerd, which must be running), network namespaces,
 * namespace records and IP allocations under stateDir, sandbox cgroups
 * named after ids, and mounts naming the instance or one of ids.
 */
export async function instanceLeftovers(instanceId, ids = [], stateDir = STATE_DIR) {
  const containers = await ctr('containers', 'ls', '-q', `labels."airlock.instance"==${instanceId}`);
  const prefix = `airlock-${instanceId}-`;
  const list = async (dir) => {
    try {
      return await readdir(dir);
    } catch {
      return [];
    }
  };
  const netns = (await list('/run/netns')).filter((n) => n.startsWith(prefix));
  const records = (await list(path.join(stateDir, 'netns'))).filter((n) => n.startsWith(prefix));
  const ips = [];
  for (const net of await list(path.join(stateDir, 'ipam'))) {
    for (const f of await list(path.join(stateDir, 'ipam', net))) {
      try {
        if ((await readFile(path.join(stateDir, 'ipam', net, f), 'utf8')).includes(prefix)) ips.push(`${net}/${f}`);
      } catch {
        // removed as we looked
      }
    }
  }
  const cgroups = [];
  const walk = async (dir, depth) => {
    for (const e of await list(dir)) {
      if (ids.includes(e)) cgroups.push(path.join(dir, e));
      else if (depth > 0 && !e.includes('.')) await walk(path.join(dir, e), depth - 1);
    }
  };
  // cgroup v2 has one tree; v1 one per controller.
  await walk('/sys/fs/cgroup/airlock', 2);
  for (const c of await list('/sys/fs/cgroup')) await walk(path.join('/sys/fs/cgroup', c, 'airlock'), 2);
  const mounts = (await readFile('/proc/mounts', 'utf8')).split('\n')
    .filter((l) => l.includes(prefix) || ids.some((id) => l.includes(id)));
  return { containers, netns, records, ips, cgroups, mounts };
}

/** A test body whose failure carries what owner (a Server or Daemon) logged. */
function wrapping(owner, fn) {
  const body = async (t) => {
    try {
      await fn(t);
    } catch (err) {
      throw owner.annotate(err);
    }
  };
  // Awaited (or returned from an async test) rather than called, the body
  // runs all the same: a wrapped body that never ran would pass unseen.
  body.then = (resolve, reject) => body().then(resolve, reject);
  return body;
}

/** Starts a server; extraConfig lines are appended to its config.yaml. */
export async function startServer(label, extraConfig = [], opts = {}) {
  return new Server(label, extraConfig, opts).start();
}

/** Runs the airlock CLI; resolves to { code, stdout, stderr }. */
export function airlockCLI(args, { timeoutMs = 60_000 } = {}) {
  return new Promise((resolve) => {
    execFile(AIRLOCK_BIN, args, { timeout: timeoutMs, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr });
    });
  });
}

/** A TCP port that was free a moment ago, on 127.0.0.1. */
export async function freePort() {
  const net = await import('node:net');
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/**
 * The settings of a server whose approvals go to its console (on a free
 * loopback port) with its audit log in a new directory, written also to
 * a cli.yaml there for `airlock approvals`. Resolves to { dir, lines, cfg,
 * auditFile }; remove dir when done.
 */
export async function consoleConfig(prefix) {
  const dir = await mkdtemp(path.join(os.tmpdir(), prefix));
  const auditFile = path.join(dir, 'audit.jsonl');
  const port = await freePort();
  const lines = [
    `approval: {mode: always, timeout: 60s, console: {listen: "127.0.0.1:${port}", token_file: ${JSON.stringify(path.join(dir, 'tokens'))}}}`,
    `audit: {path: ${JSON.stringify(auditFile)}}`,
  ];
  // The CLI reads the same settings the server does.
  const cfg = path.join(dir, 'cli.yaml');
  await writeFile(cfg, lines.join('\n') + '\n');
  return { dir, lines, cfg, auditFile };
}

/**
 * Reads the call records of a JSON Lines audit log (not its genesis and
 * seal lines); every line must be whole.
 */
export async function auditRecords(file) {
  let text;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if (err.code === 'ENOENT') return [];
    throw err;
  }
  if (text && !text.endsWith('\n')) throw new Error(`${file} ends in a partial record`);
  return text.split('\n').filter(Boolean).map((l) => JSON.parse(l)).filter((r) => !r.kind);
}

/** Finds the instance whose lock file under state_dir/instances holds pid. */
async function findInstanceId(pid, stateDir = STATE_DIR) {
  const dir = path.join(stateDir, 'instances');
  let names = [];
  try {
    names = await readdir(dir);
  } catch {
    return null;
  }
  for (const n of names) {
    if (!n.endsWith('.lock')) continue;
    try {
      const s = (await readFile(path.join(dir, n), 'utf8')).trim();
      if (Number(s) === pid) return n.slice(0, -'.lock'.length);
    } catch {
      // raced with a removal
    }
  }
  return null;
}

/** Runs ctr against the embedded containerd; returns stdout lines. */
export async function ctr(...args) {
  const { stdout } = await execFileP(CTR, ['-a', SOCK, '-n', NAMESPACE, ...args], { timeout: 30_000, maxBuffer: 16 << 20 });
  return stdout.split('\n').map((l) => l.trim()).filter(Boolean);
}

/**
 * What of airlock's is left in containerd and in the mount table.
 * filter (optional): a containerd filter for containers, e.g. by label.
 */
export async function leftovers({ containerFilter } = {}) {
  const containers = await ctr('containers', 'ls', '-q', ...(containerFilter ? [containerFilter] : []));
  const tasks = await ctr('tasks', 'ls', '-q');
  // `snapshots ls` prints a header "KEY PARENT KIND"; keep the keys.
  const snapshots = (await ctr('snapshots', 'ls')).slice(1).map((l) => l.split(/\s+/)[0]);
  const mounts = (await readFile('/proc/mounts', 'utf8')).split('\n').filter(Boolean);
  return { containers, tasks, snapshots, mounts };
}

/** The labels of a container, or null when it is gone. */
async function containerLabels(id) {
  try {
    const info = JSON.parse((await ctr('containers', 'info', id)).join('\n'));
    return info.Labels ?? {};
  } catch {
    return null;
  }
}

/** Whether an airlock instance is alive: its lock file names a live pid. */
async function instanceAlive(id) {
  try {
    const pid = Number((await readFile(path.join(STATE_DIR, 'instances', id + '.lock'), 'utf8')).trim());
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

const isEmpty = (r) => Object.values(r).every((v) => v.length === 0);

/**
 * The sandboxes of an instance that are serving or left over: all its
 * containers but the warm ones idle in its pool. With waitMs, waits that
 * long for the list to empty (sandboxes are destroyed just after their call
 * answers).
 */
export async function busySandboxes(instanceId, waitMs = 0) {
  const list = async () => {
    const out = [];
    for (const id of await ctr('containers', 'ls', '-q', `labels."airlock.instance"==${instanceId}`)) {
      const labels = await containerLabels(id);
      if (labels && !['idle', 'warming'].includes(labels['airlock.pool'])) out.push(id);
    }
    return out;
  };
  let ids = await list();
  if (ids.length && waitMs > 0) await waitFor(async () => (ids = await list()).length === 0, waitMs, 100);
  return ids;
}

/**
 * What airlock left behind: containers, tasks and snapshots named
 * airlock-*, and mount lines naming one. The sandboxes of *other* live
 * airlock processes sharing this containerd (a developer running airlock by
 * hand) are not leftovers and are excused; a dead instance's are not.
 * Returns { all, own }: own is what belongs to instanceId or to runIds.
 */
export async function audit({ instanceId = null, runIds = [] } = {}) {
  const lo = await leftovers();
  const names = lo.containers.filter((c) => c.startsWith('airlock-'));
  const owner = {};
  const excused = [];
  for (const id of names) {
    const labels = await containerLabels(id);
    owner[id] = labels?.['airlock.instance'] ?? null;
    // A warm sandbox waiting (or warming) in a live instance's pool is not a leftover.
    if (['idle', 'warming'].includes(labels?.['airlock.pool']) && owner[id] && (await instanceAlive(owner[id]))) excused.push(id);
  }
  for (const id of names) {
    if (owner[id] && owner[id] !== instanceId && (await instanceAlive(owner[id]))) excused.push(id);
  }
  const mineIds = new Set([...runIds].map((r) => 'airlock-' + r));
  for (const id of names) if (instanceId && owner[id] === instanceId) mineIds.add(id);
  const strip = (l) => l.split(STATE_DIR).join('');
  const pick = (list) => list.filter((n) => n.startsWith('airlock-') && !excused.includes(n));
  const all = {
    containers: pick(lo.containers),
    tasks: pick(lo.tasks),
    snapshots: pick(lo.snapshots),
    mounts: await ownedMounts(lo.mounts, instanceId, excused),
  };
  const ownOf = (list) => list.filter((n) => [...mineIds].some((m) => n.includes(m)));
  const own = {
    containers: ownOf(all.containers),
    tasks: ownOf(all.tasks),
    snapshots: ownOf(all.snapshots),
    mounts: ownOf(all.mounts),
  };
  return { all, own, excused };
}

/**
 * The mount lines that are airlock leftovers of this state_dir: sandbox
 * rootfs mounts under STATE_DIR (not of an excused container), and network
 * namespaces /run/netns/airlock-INSTANCE-RUN of instanceId or of an
 * instance that is no longer alive. Another airlock on the host (another
 * state_dir, or a live instance of this one) is never a leftover.
 */
async function ownedMounts(lines, instanceId, excused) {
  const out = [];
  for (const l of lines) {
    const dir = l.split(' ')[1] ?? '';
    const ns = /^\/run\/netns\/airlock-([0-9a-f]{12})-/.exec(dir);
    if (ns) {
      if (ns[1] === instanceId || !(await instanceAlive(ns[1]))) out.push(l);
      continue;
    }
    if (dir.startsWith(STATE_DIR + '/') && dir.includes('/airlock-') && !excused.some((e) => l.includes(e))) out.push(l);
  }
  return out;
}

/**
 * Asserts nothing is left behind. A sandbox is destroyed just after its
 * call answers, so its own leftovers must clear within ownMs; unexplained
 * ones within graceMs (another process's sandbox may be half-made in a
 * sample). Warm sandboxes idle in a live instance's pool are not leftovers.
 */
export async function assertNoLeftovers(ctx, graceMs = 5000, ownMs = 3000) {
  const first = await audit(ctx);
  let last = first;
  if (!isEmpty(first.all)) {
    await waitFor(async () => isEmpty((last = await audit(ctx)).all), graceMs, 250);
  }
  let own = first;
  if (!isEmpty(first.own)) {
    await waitFor(async () => isEmpty((own = await audit(ctx)).own), ownMs, 100);
  }
  if (!isEmpty(own.own) || !isEmpty(last.all)) {
    throw new Error(`leftovers: own after ${ownMs} ms: ${JSON.stringify(own.own)}; ` +
      `unexplained after ${graceMs} ms: ${JSON.stringify(last.all)}; excused (pools, live other instances): ${JSON.stringify(last.excused)}`);
  }
}

export function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

/** Polls fn until it returns a truthy value or ms passes; returns the last value. */
export async function waitFor(fn, ms, every = 200) {
  const end = performance.now() + ms;
  let v;
  for (;;) {
    v = await fn();
    if (v || performance.now() > end) return v;
    await sleep(every);
  }
}

/** This host's own non-loopback IPv4 addresses (they all end on this machine). */
export async function hostIPv4s() {
  const out = new Set();
  for (const addrs of Object.values(os.networkInterfaces())) {
    for (const a of addrs ?? []) {
      if (a.family === 'IPv4' && !a.internal && !a.address.startsWith('127.')) out.add(a.address);
    }
  }
  return [...out];
}

/**
 * A daemon: `airlock serve --transport http,sse` as a child process with its
 * own config, TCP port and Unix socket, for the hosted-mode tests.
 */
export class Daemon {
  /**
   * config: sections merged over the defaults below, e.g.
   * { limits: { concurrency: 4 }, server: { shutdown_grace: '2s' } }.
   */
  constructor(label, config = {}, { transports = 'http,sse', listenHost = '127.0.0.1' } = {}) {
    this.label = label;
    this.config = config;
    this.transports = transports;
    this.listenHost = listenHost;
    this.stderr = '';
  }

  async start() {
    this.dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_daemon_'));
    await execFileP('chmod', ['755', this.dir]); // the relay's unprivileged user must reach the socket
    this.port = await freePort();
    this.url = `http://127.0.0.1:${this.port}`;
    this.socket = path.join(this.dir, 'airlock.sock');
    this.tokenFile = path.join(this.dir, 'client.tokens');
    this.auditFile = path.join(this.dir, 'audit.jsonl');
    this.configPath = path.join(this.dir, 'config.yaml');
    const base = {
      state_dir: STATE_DIR,
      log: { level: 'info' },
      limits: { ...LIMITS },
      server: { listen: `${this.listenHost}:${this.port}`, socket: this.socket, progress_interval: '100ms' },
      auth: { token_file: this.tokenFile },
      audit: { path: this.auditFile },
    };
    for (const [k, v] of Object.entries(this.config)) base[k] = { ...(base[k] ?? {}), ...v };
    // JSON is YAML.
    await writeFile(this.configPath, JSON.stringify(base, null, 1) + '\n');
    const { spawn } = await import('node:child_process');
    this.proc = spawn(AIRLOCK_BIN, ['serve', '--transport', this.transports, '--config', this.configPath],
      { stdio: ['ignore', 'ignore', 'pipe'], env: { PATH: process.env.PATH } });
    this.exited = new Promise((resolve) => this.proc.once('exit', (code, signal) => resolve({ code, signal })));
    this.proc.stderr.on('data', (c) => {
      const s = c.toString();
      if (VERBOSE) process.stderr.write(`[${this.label}] ${s}`);
      this.stderr += s;
      if (this.stderr.length > STDERR_KEEP) this.stderr = this.stderr.slice(-STDERR_KEEP);
    });
    const t0 = performance.now();
    let exit = null;
    this.exited.then((e) => { exit = e; });
    for (;;) {
      if (exit) throw new Error(`daemon ${this.label} exited during start: ${JSON.stringify(exit)}\n${this.stderr.slice(-4000)}`);
      try {
        const r = await fetch(`${this.url}/readyz`);
        if (r.status === 200) break;
      } catch {
        // not listening yet
      }
      if (performance.now() - t0 > BOOT_TIMEOUT_MS) throw new Error(`daemon ${this.label} not ready\n${this.stderr.slice(-4000)}`);
      await sleep(100);
    }
    this.instanceId = await findInstanceId(this.proc.pid);
    return this;
  }

  /** Adds a token for name with `airlock token add`; returns the secret. */
  async addToken(name) {
    const r = await airlockCLI(['token', 'add', name, '--config', this.configPath]);
    if (r.code !== 0) throw new Error(`token add ${name}: ${r.stderr}`);
    return r.stdout.trim();
  }

  /**
   * An SDK client over streamable HTTP ('http') or legacy SSE ('sse');
   * sessionId reconnects to an HTTP session without a new initialize.
   */
  async client(kind, token, { name = 'airlock-e2e-hosted', sessionId } = {}) {
    const { StreamableHTTPClientTransport } = await import('@modelcontextprotocol/sdk/client/streamableHttp.js');
    const { SSEClientTransport } = await import('@modelcontextprotocol/sdk/client/sse.js');
    const authFetch = (url, init = {}) => {
      const headers = new Headers(init.headers);
      if (token) headers.set('Authorization', `Bearer ${token}`);
      return fetch(url, { ...init, headers });
    };
    const transport = kind === 'sse'
      ? new SSEClientTransport(new URL(`${this.url}/sse`), { fetch: authFetch, eventSourceInit: { fetch: authFetch } })
      : new StreamableHTTPClientTransport(new URL(`${this.url}/mcp`), { fetch: authFetch, sessionId });
    const client = new Client({ name, version: '0.0.0' });
    await client.connect(transport, { timeout: 60_000 });
    return client;
  }

  /**
   * A 2026-07-28 generation client (@modelcontextprotocol/client) over
   * streamable HTTP with token as bearer. options: its ClientOptions (e.g.
   * { versionNegotiation: { mode: 'auto' } }); onElicit answers input
   * requests; onRequest(url, init) sees every HTTP request it makes.
   */
  async client2(token, { name = 'airlock-e2e-client2', options = {}, onElicit, onRequest } = {}) {
    const { Client: Client2, StreamableHTTPClientTransport: StreamableHTTPClientTransport2 } = await import('@modelcontextprotocol/client');
    const authFetch = (url, init = {}) => {
      const headers = new Headers(init.headers);
      if (token) headers.set('Authorization', `Bearer ${token}`);
      onRequest?.(url, { ...init, headers });
      return fetch(url, { ...init, headers });
    };
    const transport = new StreamableHTTPClientTransport2(new URL(`${this.url}/mcp`), { fetch: authFetch });
    const capabilities = onElicit ? { elicitation: { form: {} } } : {};
    const client = new Client2({ name, version: '0.0.0' }, { ...options, capabilities });
    if (onElicit) client.setRequestHandler('elicitation/create', (req) => onElicit(req));
    await client.connect(transport, { timeout: 60_000 });
    return client;
  }

  annotate(err) {
    const e = err instanceof Error ? err : new Error(String(err));
    e.message += `\n----- daemon "${this.label}" stderr (last 6000) -----\n${this.stderr.slice(-6000)}\n-----`;
    return e;
  }

  /** Wraps a test body: a failure carries the daemon's stderr tail. */
  wrap(fn) {
    return wrapping(this, fn);
  }

  /** SIGTERM and wait for the exit. */
  async stop(signal = 'SIGTERM') {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill(signal);
    const e = await this.exited;
    if (this.dir) await rm(this.dir, { recursive: true, force: true });
    return e;
  }
}

export async function startDaemon(label, config = {}, opts = {}) {
  return new Daemon(label, config, opts).start();
}

/** Calls a tool with an SDK client; resolves to { res, sc, text, isError, ms }. */
export async function callWith(client, name, args, opts = {}) {
  const t0 = performance.now();
  const res = await client.callTool({ name, arguments: args }, CallToolResultSchema, { timeout: 120_000, ...opts });
  const text = res.content?.filter((c) => c.type === 'text').map((c) => c.text).join('') ?? '';
  return { res, sc: res.structuredContent, text, isError: res.isError === true, ms: performance.now() - t0 };
}

/**
 * callWith for a 2.x client (@modelcontextprotocol/client), whose callTool
 * takes no result schema; opts are its RequestOptions.
 */
export async function callWith2(client, name, args, opts = {}) {
  const t0 = performance.now();
  const res = await client.callTool({ name, arguments: args }, { timeout: 120_000, ...opts });
  const text = res.content?.filter((c) => c.type === 'text').map((c) => c.text).join('') ?? '';
  return { res, sc: res.structuredContent, text, isError: res.isError === true, ms: performance.now() - t0 };
}

/** Whether containerd still has the sandbox of run id (cold or warm). */
export async function sandboxExists(runId) {
  const ids = await ctr('containers', 'ls', '-q', `labels."airlock.run"==${runId}`);
  return ids.length > 0;
}

/** The samples of a Prometheus text page, keyed by name{labels} as written. */
export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return out;
}

/**
 * A stdio airlock spoken to in raw JSON-RPC lines, for what an SDK would
 * not send: a retry carrying someone else's approval, a 100 MB message.
 */
export class RawStdio {
  constructor(label, extraConfig = []) {
    this.label = label;
    this.extraConfig = extraConfig;
    this.stderr = '';
    this.pending = new Map();
    this.nextId = 1;
    this.buf = '';
  }

  async start() {
    const { spawn } = await import('node:child_process');
    this.dir = await mkdtemp(path.join(os.tmpdir(), 'airlock_e2e_raw_'));
    this.configPath = path.join(this.dir, 'config.yaml');
    await writeFile(this.configPath, [`state_dir: ${JSON.stringify(STATE_DIR)}`, 'log: {level: info}', ...this.extraConfig, ''].join('\n'));
    this.proc = spawn(AIRLOCK_BIN, ['serve', '--transport', 'stdio', '--config', this.configPath], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.exited = new Promise((resolve) => this.proc.once('exit', (code, signal) => resolve({ code, signal })));
    this.proc.stderr.on('data', (c) => {
      if (VERBOSE) process.stderr.write(`[${this.label}] ${c}`);
      this.stderr += c.toString();
      if (this.stderr.length > STDERR_KEEP) this.stderr = this.stderr.slice(-STDERR_KEEP);
    });
    this.proc.stdout.on('data', (c) => {
      this.buf += c.toString();
      let i;
      while ((i = this.buf.indexOf('\n')) >= 0) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        if (!line.trim()) continue;
        const msg = JSON.parse(line);
        const waiter = this.pending.get(JSON.stringify(msg.id ?? null));
        if (waiter) {
          this.pending.delete(JSON.stringify(msg.id ?? null));
          waiter(msg);
        }
      }
    });
    const init = await this.request('initialize', {
      protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'airlock-e2e-raw', version: '0' },
    }, { timeoutMs: BOOT_TIMEOUT_MS });
    if (init.error) throw new Error(`initialize: ${JSON.stringify(init.error)}`);
    this.notify('notifications/initialized', {});
    this.instanceId = await findInstanceId(this.proc.pid);
    return this;
  }

  /** Resolves to the response carrying id (the next id when not given). */
  response(id, timeoutMs = 120_000) {
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(this.annotate(new Error(`no response to id ${id} in ${timeoutMs} ms`))), timeoutMs);
      this.pending.set(JSON.stringify(id), (m) => { clearTimeout(t); resolve(m); });
    });
  }

  request(method, params, { id = this.nextId++, timeoutMs } = {}) {
    const p = this.response(id, timeoutMs);
    this.proc.stdin.write(JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n');
    return p;
  }

  notify(method, params) {
    this.proc.stdin.write(JSON.stringify({ jsonrpc: '2.0', method, params }) + '\n');
  }

  /** Writes raw bytes, waiting for the pipe to drain. */
  async write(data) {
    if (!this.proc.stdin.write(data)) await new Promise((r) => this.proc.stdin.once('drain', r));
  }

  annotate(err) {
    err.message += `\n----- ${this.label} stderr (tail) -----\n${this.stderr.slice(-4000)}`;
    return err;
  }

  async close() {
    this.proc?.stdin.end();
    const t = setTimeout(() => this.proc?.kill('SIGKILL'), 20_000);
    await this.exited;
    clearTimeout(t);
    await cleanedUp(this.exited, this.instanceId, 30_000);
    if (this.dir) await rm(this.dir, { recursive: true, force: true });
  }
}

/** The test cluster's admin kubeconfig (scripts/cluster.sh writes it). */
export const KUBECONFIG = process.env.AIRLOCK_KUBECONFIG || '/var/lib/airlock-k8s/admin.conf';
const KUBECTL = process.env.AIRLOCK_KUBECTL || '/usr/local/lib/airlock/k8s/bin/kubectl';

/** kubectl against the test cluster (scripts/cluster.sh); resolves to its stdout. */
export async function kubectl(...args) {
  const { stdout } = await promisify(execFile)(KUBECTL, ['--kubeconfig', KUBECONFIG, ...args], { timeout: 240_000, maxBuffer: 16 << 20 });
  return stdout;
}

/** Whether the test cluster is up; under CI=true its absence is a failure. */
export async function clusterUp() {
  try {
    await kubectl('get', 'runtimeclass', 'gvisor');
    return true;
  } catch (err) {
    if (process.env.CI === 'true') throw new Error(`no test cluster under CI=true (scripts/cluster.sh up): ${err.message}`);
    return false;
  }
}

/** Debian's Chromium for the browser tests; a missing one is a failure, not a skip. */
export const CHROMIUM = process.env.AIRLOCK_E2E_CHROMIUM || '/usr/bin/chromium';

/** Launches headless Chromium on a closed network: no background fetches, no component updates. */
export async function launchChromium() {
  const { existsSync } = await import('node:fs');
  if (!existsSync(CHROMIUM)) {
    throw new Error(`${CHROMIUM} not found: run scripts/install-test-deps.sh (Debian package chromium)`);
  }
  const { chromium } = await import('playwright-core');
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
}
