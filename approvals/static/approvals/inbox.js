// The inbox: pending tool calls arrive over a WebSocket and are answered with a
// click or a key. Every endpoint comes from the page's data attributes; every
// piece of data is rendered with textContent, never as HTML.

const root = document.getElementById("inbox");
const cfg = {
  wsUrl: root.dataset.websocketUrl || "",
  confirmUrl: root.dataset.confirmUrl || "",
  pendingUrl: root.dataset.pendingUrl || "",
  rulesUrl: root.dataset.rulesUrl || "",
  revokeUrl: root.dataset.ruleRevokeUrl || "",
  revokePlaceholder: root.dataset.ruleIdPlaceholder || "",
  sessionId: root.dataset.sessionId || "",
  csrfToken: root.dataset.csrfToken || "",
  loginUrl: root.dataset.loginUrl || "",
  username: root.dataset.username || "",
};
// The browser's clock may differ from the server's; deadlines are the server's.
const skewMs = (Date.parse(root.dataset.serverTime) || Date.now()) - Date.now();
const serverNow = () => Date.now() + skewMs;

const $ = (sel, el = document) => el.querySelector(sel);
const pendingList = $("#pending-list");
const historyList = $("#history-list");
const cards = new Map(); // approval_id -> {el, item, busy}
const toolNames = new Map(); // approval_id -> tool name, for history lines
const waiting = new Map(); // approval_id -> resolve(result) for tool_confirm
const HISTORY_MAX = 12;
const REMOVE_AFTER_MS = 2500;
const WS_ANSWER_TIMEOUT_MS = 4000;
let socket = null;
let attempts = 0;
let retryAt = 0;
let retryTimer = 0;
let pollTimer = 0;
let signedOut = false;
let cardSeq = 0;

// -- connection ------------------------------------------------------------

function socketUrl() {
  const url = new URL(cfg.wsUrl || "/ws/approvals/", window.location.href);
  if (url.protocol === "http:") url.protocol = "ws:";
  if (url.protocol === "https:") url.protocol = "wss:";
  if (cfg.sessionId) url.searchParams.set("session_id", cfg.sessionId);
  return url.toString();
}

function setConn(state, text) {
  const conn = $("#conn");
  conn.dataset.state = state;
  $(".conn-text", conn).textContent = text;
  $(".conn-retry", conn).hidden = state !== "offline";
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

function signOut() {
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

// -- cards -----------------------------------------------------------------

function rememberName(item) {
  if (!item.approval_id) return;
  toolNames.set(item.approval_id, item.tool_name || "");
  if (toolNames.size > 500) toolNames.delete(toolNames.keys().next().value);
}

function reconcile(pending) {
  const ids = new Set();
  for (const item of pending) {
    if (!item || typeof item.approval_id !== "string") continue;
    ids.add(item.approval_id);
    rememberName(item);
    addCard(item);
  }
  for (const [id, card] of cards) {
    if (!ids.has(id) && !card.el.classList.contains("decided")) removeCard(id);
  }
}

function sessionHref(sessionId) {
  const url = new URL(window.location.href);
  url.search = "";
  url.hash = "";
  url.searchParams.set("session_id", sessionId);
  return url.toString();
}

function prettyArguments(args) {
  try {
    return JSON.stringify(args ?? {}, null, 2);
  } catch (err) {
    return String(args);
  }
}

function addCard(item) {
  if (!item.approval_id || cards.has(item.approval_id)) return;
  if (cfg.sessionId && item.session_id !== cfg.sessionId) return;
  const el = $("#card-template").content.firstElementChild.cloneNode(true);
  const titleId = `card-title-${++cardSeq}`;
  el.dataset.approvalId = item.approval_id;
  el.setAttribute("aria-labelledby", titleId);
  const title = $(".tool", el);
  title.id = titleId;
  title.textContent = item.tool_name || "(unnamed tool)";
  const session = $(".session", el);
  session.textContent = item.session_id || "(no session)";
  if (item.session_id) session.href = sessionHref(item.session_id);
  else session.removeAttribute("href");
  $(".args", el).textContent = prettyArguments(item.arguments);
  const card = { el, item, busy: false };
  cards.set(item.approval_id, card);
  insertInOrder(el, item.created_at);
  updateTimes(card);
  updateCount();
  announce(`${item.tool_name || "A tool"} is waiting for your answer.`);
}

function insertInOrder(el, createdAt) {
  const when = Date.parse(createdAt) || 0;
  for (const other of pendingList.children) {
    const otherCard = cards.get(other.dataset.approvalId);
    if (otherCard && (Date.parse(otherCard.item.created_at) || 0) > when) {
      pendingList.insertBefore(el, other);
      return;
    }
  }
  pendingList.append(el);
}

function removeCard(id) {
  const card = cards.get(id);
  if (!card) return;
  if (card.el.contains(document.activeElement)) focusNextOpen(card.el);
  cards.delete(id);
  card.el.remove();
  updateCount();
}

function focusNextOpen(el) {
  const open = [...pendingList.children].filter((li) => li !== el && !li.classList.contains("decided"));
  const after = open.find((li) => el.compareDocumentPosition(li) & Node.DOCUMENT_POSITION_FOLLOWING);
  const target = after || open[open.length - 1];
  (target || $("#pending-title")).focus();
}

function updateCount() {
  const open = [...cards.values()].filter((c) => !c.el.classList.contains("decided")).length;
  $("#pending-count").textContent = String(open);
  $("#empty").hidden = cards.size > 0;
  document.title = open ? `(${open}) Approvals` : "Approvals";
}

function announce(text) {
  const region = $("#announce");
  region.textContent = "";
  setTimeout(() => {
    region.textContent = text;
  }, 50);
}

// -- time ------------------------------------------------------------------

function duration(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, "0")} s`;
  const h = Math.floor(m / 60);
  return `${h} h ${String(m % 60).padStart(2, "0")} min`;
}

function ago(ms) {
  if (ms < 5000) return "just now";
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

function updateTimes(card) {
  const now = serverNow();
  const created = Date.parse(card.item.created_at);
  const expires = Date.parse(card.item.expires_at);
  $(".age", card.el).textContent = Number.isNaN(created) ? "—" : ago(now - created);
  const left = Number.isNaN(expires) ? NaN : expires - now;
  const countdown = $(".countdown", card.el);
  countdown.textContent = Number.isNaN(left) ? "—" : left > 0 ? duration(left) : "time is up";
  card.el.classList.toggle("urgent", left <= 60000);
}

function tick() {
  for (const card of cards.values()) {
    if (!card.el.classList.contains("decided")) updateTimes(card);
  }
  for (const time of historyList.querySelectorAll("time[datetime]")) {
    const when = Date.parse(time.getAttribute("datetime"));
    if (!Number.isNaN(when)) time.textContent = ago(serverNow() - when);
  }
  if (!socket && !signedOut && retryAt) showRetry();
}

// -- deciding --------------------------------------------------------------

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

async function decide(card, decision, extra = {}) {
  if (card.busy || card.el.classList.contains("decided")) return;
  card.busy = true;
  setBusy(card, true);
  const body = { approval_id: card.item.approval_id, decision, ...extra };
  if (card.item.session_id) body.session_id = card.item.session_id;
  let result = await sendOverSocket(body);
  if (result === null) result = await sendOverHttp(body);
  card.busy = false;
  if (result.resolved) {
    const status = decision === "allow" ? "allowed" : "denied";
    const via = result.type === "tool_confirm_result" ? "websocket" : "web";
    decided({ approval_id: body.approval_id, status, decided_via: via, decided_by: cfg.username, reason: extra.reason || "" });
    if (extra.remember) loadRules();
    return;
  }
  if (result.error === "not_found") {
    showOutcome(card, "This call is gone: it was decided or is not yours.");
    setTimeout(() => removeCard(body.approval_id), REMOVE_AFTER_MS);
  } else if (result.error === "already_decided") {
    showOutcome(card, "Someone else answered first.");
    setTimeout(() => removeCard(body.approval_id), REMOVE_AFTER_MS * 2);
  } else if (result.error === "authentication_required") {
    signOut();
    setBusy(card, false);
  } else {
    showOutcome(card, result.detail || "Could not send the answer. Try again.");
    setBusy(card, false);
  }
}

function setBusy(card, busy) {
  for (const button of card.el.querySelectorAll("button")) button.disabled = busy;
  card.el.classList.toggle("busy", busy);
}

function showOutcome(card, text) {
  const outcome = $(".outcome", card.el);
  outcome.textContent = text;
  outcome.hidden = false;
}

const STATUS_WORDS = {
  allowed: "Allowed",
  denied: "Denied",
  expired: "Expired",
  cancelled: "Cancelled",
  abandoned: "Abandoned",
};

function howDecided(msg) {
  const by = msg.decided_by === cfg.username && cfg.username ? "you" : msg.decided_by;
  if (msg.decided_via === "rule") return "by a rule";
  if (by) return `by ${by} via ${msg.decided_via}`;
  if (msg.status === "expired") return "nobody answered in time";
  if (msg.status === "cancelled") return "cancelled by the agent";
  if (msg.status === "abandoned") return "the agent stopped waiting";
  return msg.decided_via ? `via ${msg.decided_via}` : "";
}

function decided(msg) {
  if (!msg.approval_id) return;
  if (cfg.sessionId && msg.session_id && msg.session_id !== cfg.sessionId) return;
  addHistory(msg);
  const card = cards.get(msg.approval_id);
  if (!card || card.el.classList.contains("decided")) return;
  if (card.el.contains(document.activeElement)) focusNextOpen(card.el);
  card.el.classList.add("decided");
  card.el.dataset.status = msg.status;
  $(".actions", card.el).hidden = true;
  $(".reason-form", card.el).hidden = true;
  const badge = $(".badge.state", card.el);
  badge.textContent = STATUS_WORDS[msg.status] || msg.status;
  badge.className = `badge state status-${msg.status}`;
  const reason = msg.reason && msg.decided_via !== "rule" ? ` — “${msg.reason}”` : "";
  showOutcome(card, `${STATUS_WORDS[msg.status] || msg.status} ${howDecided(msg)}${reason}`);
  updateCount();
  announce(`${card.item.tool_name}: ${STATUS_WORDS[msg.status] || msg.status} ${howDecided(msg)}.`);
  setTimeout(() => removeCard(msg.approval_id), REMOVE_AFTER_MS);
}

function addHistory(msg) {
  for (const entry of historyList.children) {
    if (entry.dataset.approvalId === msg.approval_id) return;
  }
  const el = $("#history-template").content.firstElementChild.cloneNode(true);
  el.dataset.approvalId = msg.approval_id;
  el.dataset.status = msg.status;
  const badge = $(".badge", el);
  badge.textContent = STATUS_WORDS[msg.status] || msg.status;
  badge.classList.add(`status-${msg.status}`);
  const card = cards.get(msg.approval_id);
  $(".entry-tool", el).textContent = (card && card.item.tool_name) || toolNames.get(msg.approval_id) || "tool call";
  $(".entry-how", el).textContent = howDecided(msg);
  const time = $("time", el);
  time.setAttribute("datetime", new Date(serverNow()).toISOString());
  time.textContent = "just now";
  if (msg.reason && msg.decided_via !== "rule") {
    const q = document.createElement("q");
    q.className = "entry-reason";
    q.textContent = msg.reason;
    el.append(q);
  }
  historyList.prepend(el);
  while (historyList.children.length > HISTORY_MAX) historyList.lastElementChild.remove();
  $("#history-empty").hidden = true;
}

// -- reason form and keyboard ----------------------------------------------

function openReason(card) {
  const form = $(".reason-form", card.el);
  form.hidden = false;
  $(".actions", card.el).hidden = true;
  $("textarea", form).focus();
}

function closeReason(card) {
  $(".reason-form", card.el).hidden = true;
  $(".actions", card.el).hidden = false;
  $('[data-action="reason"]', card.el).focus();
}

function cardFor(el) {
  const li = el && el.closest ? el.closest(".card") : null;
  return li ? cards.get(li.dataset.approvalId) : null;
}

pendingList.addEventListener("click", (ev) => {
  const button = ev.target.closest("button[data-action]");
  const card = cardFor(button);
  if (!card) return;
  const action = button.dataset.action;
  if (action === "allow") decide(card, "allow");
  else if (action === "deny") decide(card, "deny");
  else if (action === "always") decide(card, "allow", { remember: "session" });
  else if (action === "reason") openReason(card);
  else if (action === "cancel-reason") closeReason(card);
});

pendingList.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const card = cardFor(ev.target);
  if (!card) return;
  const reason = $("textarea", ev.target).value.trim();
  if (!reason) return $("textarea", ev.target).focus();
  decide(card, "deny", { reason });
});

pendingList.addEventListener("keydown", (ev) => {
  const card = cardFor(ev.target);
  if (!card || ev.altKey || ev.ctrlKey || ev.metaKey) return;
  if (ev.target.matches("textarea, input")) {
    if (ev.key === "Escape") closeReason(card);
    return;
  }
  const key = ev.key.toLowerCase();
  if (key === "a") decide(card, "allow");
  else if (key === "d") decide(card, "deny");
  else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
    const sibling = ev.key === "ArrowDown" ? card.el.nextElementSibling : card.el.previousElementSibling;
    if (sibling) sibling.focus();
  } else return;
  ev.preventDefault();
});

// -- rules -----------------------------------------------------------------

function describeRule(rule) {
  const parts = [rule.session_id ? `in session ${rule.session_id}` : "in every session"];
  if (rule.arguments_match && Object.keys(rule.arguments_match).length) {
    parts.push(`when ${JSON.stringify(rule.arguments_match)}`);
  }
  if (rule.expires_at) parts.push(`until ${new Date(rule.expires_at).toLocaleString()}`);
  if (rule.note) parts.push(rule.note);
  return parts.join(" · ");
}

async function loadRules() {
  if (!cfg.rulesUrl) return;
  try {
    const resp = await fetch(cfg.rulesUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (resp.ok) renderRules((await resp.json()).rules || []);
  } catch (err) {
    // Shown again on the next successful load.
  }
}

function renderRules(rules) {
  const list = $("#rules-list");
  list.replaceChildren();
  for (const rule of rules) {
    const el = $("#rule-template").content.firstElementChild.cloneNode(true);
    el.dataset.ruleId = String(rule.id);
    const badge = $(".badge", el);
    badge.textContent = rule.decision === "deny" ? "Always deny" : "Always allow";
    badge.classList.add(rule.decision === "deny" ? "status-denied" : "status-allowed");
    $(".rule-tool", el).textContent = rule.tool_name || "*";
    $(".rule-scope", el).textContent = describeRule(rule);
    $("button", el).setAttribute("aria-label", `Revoke the rule for ${rule.tool_name || "every tool"}`);
    list.append(el);
  }
  $("#rules-empty").hidden = rules.length > 0;
}

$("#rules-list").addEventListener("click", async (ev) => {
  const button = ev.target.closest('button[data-action="revoke"]');
  if (!button || !cfg.revokeUrl) return;
  const id = button.closest(".rule").dataset.ruleId;
  button.disabled = true;
  try {
    const resp = await fetch(cfg.revokeUrl.replace(cfg.revokePlaceholder, encodeURIComponent(id)), {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": cfg.csrfToken, Accept: "application/json" },
    });
    if (resp.ok || resp.status === 404) announce("Rule revoked.");
  } catch (err) {
    button.disabled = false;
  }
  loadRules();
});

$(".conn-retry").addEventListener("click", () => {
  attempts = 0;
  connect();
});

updateCount();
setInterval(tick, 1000);
tick();
connect();
