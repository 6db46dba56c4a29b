// airlock approval console. Everything from the server is inserted with
// textContent, never as HTML: the code under review is data, not markup.
'use strict';

const tokenKey = 'airlock-approver-token';
let token = sessionStorage.getItem(tokenKey) || '';

// A token may arrive in the fragment (never sent to any server): keep it
// for this tab and take it out of the address bar and history.
if (location.hash.startsWith('#token=')) {
  token = decodeURIComponent(location.hash.slice('#token='.length));
  sessionStorage.setItem(tokenKey, token);
  history.replaceState(null, '', location.pathname);
}

const $ = (sel, root = document) => root.querySelector(sel);
const shown = new Map(); // id -> article element

function setStatus(text) { $('#status').textContent = text; }

async function api(method, path) {
  const res = await fetch(path, {
    method,
    headers: { Authorization: 'Bearer ' + token, 'Content-Type': 'application/json' },
    cache: 'no-store',
  });
  if (res.status === 401) {
    $('#login').hidden = false;
    throw new Error('approver token missing or wrong');
  }
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function renderRequest(p) {
  const el = $('#request-tpl').content.firstElementChild.cloneNode(true);
  el.dataset.id = p.id;
  $('.tool', el).textContent = p.tool;
  $('.client', el).textContent = p.client + (p.transport ? ' (' + p.transport + ')' : '');
  $('.network', el).textContent = p.network === 'allowlist'
    ? 'allow-list: ' + (p.allow_domains.length ? p.allow_domains.join(', ') : '(no domains)')
    : 'none (loopback only)';
  $('.limits', el).textContent = p.limits;
  // Names only: a secret's value never leaves the server.
  $('.secrets', el).textContent = (p.secrets || []).length ? p.secrets.join(', ') + ' (placeholders in the sandbox)' : 'none';
  $('.size', el).textContent = p.lines + ' lines, ' + p.code_bytes + ' bytes, sha256 ' + p.code_sha256;
  $('.expires', el).textContent = new Date(p.expires).toLocaleTimeString();
  if (p.grants.length) {
    const g = $('.grants', el);
    g.hidden = false;
    g.textContent = '⚠ Asks for domains outside the operator\'s allow-list, granted for this call only if you approve: ' + p.grants.join(', ');
  }
  if (p.warnings.length) {
    const w = $('.warnings', el);
    w.hidden = false;
    w.textContent = '⚠ Made visible: ' + p.warnings.join('; ');
  }
  // Numbered: every line of code starts with its number, so nothing in
  // the code can pass for the end of the code or for the page's own text.
  $('pre.code', el).textContent = p.numbered;
  // What is approved, stated again where the approver decides.
  $('.decide-summary', el).textContent = 'exactly ' + p.lines + ' lines, ' + p.code_bytes + ' bytes, sha256 ' + p.code_sha256.slice(0, 16) + '…';
  const decide = async (verdict) => {
    for (const b of el.querySelectorAll('button')) b.disabled = true;
    try {
      await api('POST', '/api/requests/' + encodeURIComponent(p.id) + '/' + verdict);
      $('.result', el).textContent = verdict === 'approve' ? 'approved' : 'denied';
    } catch (e) {
      $('.result', el).textContent = 'refused: ' + e.message;
    }
  };
  $('button.approve', el).addEventListener('click', () => decide('approve'));
  $('button.deny', el).addEventListener('click', () => decide('deny'));
  return el;
}

function renderRecent(list) {
  const body = $('#recent tbody');
  body.replaceChildren();
  for (const f of list) {
    const tr = document.createElement('tr');
    tr.dataset.id = f.id;
    const out = [f.stdout, f.stderr, f.error].filter(Boolean).join('\n');
    const cells = [new Date(f.at).toLocaleTimeString(), f.tool, f.client,
      f.decision + (f.approver ? ' by ' + f.approver : ''), f.outcome,
      f.exit_code === undefined || f.exit_code === null ? '' : String(f.exit_code)];
    for (const c of cells) {
      const td = document.createElement('td');
      td.textContent = c;
      tr.appendChild(td);
    }
    const td = document.createElement('td');
    td.className = 'output';
    const pre = document.createElement('pre');
    pre.textContent = out;
    td.appendChild(pre);
    tr.appendChild(td);
    body.appendChild(tr);
  }
}

async function refresh() {
  if (!token) {
    $('#login').hidden = false;
    setStatus('no token');
    return;
  }
  try {
    const data = await api('GET', '/api/requests');
    const ids = new Set(data.pending.map((p) => p.id));
    for (const [id, el] of shown) {
      if (!ids.has(id)) { el.remove(); shown.delete(id); }
    }
    for (const p of data.pending) {
      if (!shown.has(p.id)) {
        const el = renderRequest(p);
        shown.set(p.id, el);
        $('#pending').appendChild(el);
      }
    }
    $('#none-pending').hidden = data.pending.length > 0;
    renderRecent(data.recent);
    // Another replica's requests may be missing: say so rather than show a short list as whole.
    setStatus((data.partial ? 'other replicas unreachable, their requests may be missing: ' + data.partial + '; ' : '') + 'updated ' + new Date().toLocaleTimeString());
  } catch (e) {
    setStatus('error: ' + e.message);
  }
}

$('#save-token').addEventListener('click', () => {
  token = $('#token').value.trim();
  sessionStorage.setItem(tokenKey, token);
  $('#token').value = '';
  $('#login').hidden = true;
  refresh();
});

refresh();
setInterval(refresh, 1000);
