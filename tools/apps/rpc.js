"use strict";
// Shared by airlock's views, put in place of their rpc.js marker when they
// are served: JSON-RPC with the host over postMessage (MCP Apps
// 2026-01-26). The views insert every value as text, never as markup.
const host = window.parent;
let nextId = 1;
const waiting = new Map();
function request(method, params) {
  const id = nextId++;
  host.postMessage({ jsonrpc: "2.0", id, method, params }, "*");
  return new Promise((resolve, reject) => waiting.set(id, { resolve, reject }));
}
function notify(method, params) { host.postMessage({ jsonrpc: "2.0", method, params }, "*"); }
function reply(id, result) { host.postMessage({ jsonrpc: "2.0", id, result }, "*"); }
function fail(id, code, message) { host.postMessage({ jsonrpc: "2.0", id, error: { code, message } }, "*"); }
const $ = (id) => document.getElementById(id);
// start connects the view: handlers take the host's requests and
// notifications by method, as handler(params, id).
function start(name, appCapabilities, handlers) {
  window.addEventListener("message", (e) => {
    if (e.source !== host) return;
    const m = e.data;
    if (!m || m.jsonrpc !== "2.0") return;
    if (m.method === undefined && m.id !== undefined) { // a response; an id may be 0
      const w = waiting.get(m.id);
      if (w) { waiting.delete(m.id); m.error ? w.reject(m.error) : w.resolve(m.result); }
      return;
    }
    if (m.method === "ui/resource-teardown" || m.method === "ping") return reply(m.id, {});
    const handle = handlers[m.method];
    if (handle) handle(m.params || {}, m.id);
    else if (m.id !== undefined) fail(m.id, -32601, "not handled: " + m.method);
  });
  new ResizeObserver(() => notify("ui/notifications/size-changed", { height: document.documentElement.scrollHeight })).observe(document.body);
  request("ui/initialize", { appInfo: { name, version: "1" }, appCapabilities, protocolVersion: "2026-01-26" })
    .then(() => notify("ui/notifications/initialized", {}));
}
