// The inbox's link to the server: a WebSocket with a snapshot on every
// (re)connect, reconnection with backoff, and plain HTTP while the socket is down.

import { $, addCard, decided, reconcile, rememberName, renderRules, setConn } from "./inbox-view.js";
import { showMore } from "./inbox-more.js";

const WS_ANSWER_TIMEOUT_MS = 4000;
const waiting = new Map(); // approval_id -> settle(result) for tool_confirm
let cfg = {};
let socket = null;
let attempts = 0;
let retryAt = 0;
let retryTimer = 0;
let pollTimer = 0;
let signedOut = false;

/** Connect with the page's settings and keep connected. */
export function startLive(options) {
  cfg = options;
  connect();
}

/** Skip the wait and try the socket again now. */
export function reconnectNow() {
  attempts = 0;
  connect();
}

/** Once a second: keep the "retrying in N s" text current. */
export function liveTick() {
  if (!socket && !signedOut && retryAt) showRetry();
}

/** Send a decision over the socket, or over HTTP when the socket cannot answer. */
export async function sendDecision(body) {
  const result = await sendOverSocket(body);
  return result === null ? sendOverHttp(body) : result;
}

function socketUrl() {
  const url = new URL(cfg.wsUrl || "/ws/approvals/", window.location.href);
  if (url.protocol === "http:") url.protocol = "ws:";
  if (url.protocol === "https:") url.protocol = "wss:";
  if (cfg.sessionId) url.searchParams.set("session_id", cfg.sessionId);
  return url.toString();
}

function connect() {
  clearTimeout(retryTimer);
  if (socket || signedOut) return;
  setConn("connecting", attempts ? "Reconnecting…" : "Connecting…");
  let ws;
  try {
    ws = new WebSocket(socketUrl());
  } catch (err) {
    scheduleReconnect();
    return;
  }
  socket = ws;
  ws.addEventListener("open", () => {
    attempts = 0;
    stopPolling();
    setConn("live", "Live");
  });
  ws.addEventListener("message", (ev) => {
    let msg;
    try {
      msg = JSON.parse(ev.data);
    } catch (err) {
      return;
    }
    if (msg && typeof msg === "object") handleMessage(msg);
  });
  ws.addEventListener("close", (ev) => {
    if (socket !== ws) return;
    socket = null;
    for (const settle of waiting.values()) settle(null);
    waiting.clear();
    if (ev.code === 4401) {
      signOut();
      return;
    }
    scheduleReconnect();
  });
}

function scheduleReconnect() {
  const base = Math.min(15000, 500 * 2 ** attempts);
  const delay = Math.round(base * (0.8 + Math.random() * 0.4));
  attempts += 1;
  retryAt = Date.now() + delay;
  retryTimer = setTimeout(connect, delay);
  showRetry();
  startPolling();
}

function showRetry() {
  const secs = Math.max(0, Math.ceil((retryAt - Date.now()) / 1000));
  setConn("offline", secs ? `Offline — retrying in ${secs} s` : "Offline — retrying…");
}

export function signOut() {
  signedOut = true;
  stopPolling();
  setConn("signed-out", "Signed out");
  const conn = $("#conn");
  if (cfg.loginUrl && !$("a", conn)) {
    const link = document.createElement("a");
    const next = new URL(cfg.loginUrl, window.location.href);
    next.searchParams.set("next", window.location.pathname + window.location.search);
    link.href = next.toString();
    link.textContent = "Sign in again";
    conn.append(" ", link);
  }
}

// While the socket is down the HTTP list keeps the page honest.
function startPolling() {
  if (pollTimer || !cfg.pendingUrl) return;
  pollTimer = setInterval(pollPending, 4000);
  pollPending();
}

function stopPolling() {
  clearInterval(pollTimer);
  pollTimer = 0;
}

async function pollPending() {
  const url = new URL(cfg.pendingUrl, window.location.href);
  if (cfg.sessionId) url.searchParams.set("session_id", cfg.sessionId);
  try {
    const resp = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (resp.status === 401) return signOut();
    const data = resp.ok ? await resp.json() : null;
    // A socket that opened meanwhile has sent a fresher snapshot.
    if (data && !(socket && socket.readyState === WebSocket.OPEN)) reconcile(data.pending || []);
  } catch (err) {
    // The server is away too; the next tick tries again.
  }
}

function handleMessage(msg) {
  switch (msg.type) {
    case "snapshot":
      reconcile(Array.isArray(msg.pending) ? msg.pending : []);
      showMore(Number(msg.more) || 0);
      loadRules();
      break;
    case "tool_start":
      rememberName(msg);
      if (msg.awaiting_confirmation !== false) addCard(msg);
      break;
    case "tool_decision":
      decided(msg);
      break;
    case "tool_confirm_result": {
      const settle = waiting.get(msg.approval_id);
      if (settle) settle(msg);
      break;
    }
    default:
      break;
  }
}

// -- deciding and rules -----------------------------------------------------

function sendOverSocket(body) {
  return new Promise((resolve) => {
    if (!socket || socket.readyState !== WebSocket.OPEN) return resolve(null);
    const timer = setTimeout(() => finish(null), WS_ANSWER_TIMEOUT_MS);
    function finish(result) {
      clearTimeout(timer);
      waiting.delete(body.approval_id);
      resolve(result);
    }
    waiting.set(body.approval_id, finish);
    try {
      socket.send(JSON.stringify({ type: "tool_confirm", ...body }));
    } catch (err) {
      finish(null);
    }
  });
}

async function sendOverHttp(body) {
  if (!cfg.confirmUrl) return { resolved: false, error: "unavailable" };
  try {
    const resp = await fetch(cfg.confirmUrl, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": cfg.csrfToken, Accept: "application/json" },
      body: JSON.stringify(body),
    });
    const data = await resp.json().catch(() => ({}));
    if (resp.ok) return { resolved: true, ...data };
    return { resolved: false, error: data.error || `http_${resp.status}`, detail: data.detail };
  } catch (err) {
    return { resolved: false, error: "network" };
  }
}

export async function loadRules() {
  if (!cfg.rulesUrl) return;
  try {
    const resp = await fetch(cfg.rulesUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (resp.ok) renderRules((await resp.json()).rules || []);
  } catch (err) {
    // Shown again on the next successful load.
  }
}

/** Revoke one of the user's rules, then show the list again. */
export async function revokeRule(id) {
  if (!cfg.revokeUrl) return false;
  let ok = false;
  try {
    const url = cfg.revokeUrl.replace(cfg.revokePlaceholder, encodeURIComponent(id));
    const resp = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": cfg.csrfToken, Accept: "application/json" },
    });
    ok = resp.ok || resp.status === 404;
  } catch (err) {
    ok = false;
  }
  loadRules();
  return ok;
}
