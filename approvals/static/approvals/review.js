// The page for one call: answer it, and follow its state live. The state
// comes over the inbox's WebSocket (narrowed to the call's session); while the
// socket is down, GET tool-approvals every few seconds. Any sign that the call
// is no longer waiting reloads the page, which then shows the outcome.

import { readEdit, reveal } from "./inbox-edit.js";

const root = document.getElementById("review");
const cfg = root.dataset;
const $ = (sel) => document.querySelector(sel);
let socket = null;
let attempts = 0;
let pollTimer = 0;
let reloading = false;

function setConn(state, text) {
  const conn = $("#conn");
  conn.dataset.state = state;
  conn.querySelector(".conn-text").textContent = text;
}

function secondsLeft() {
  return (Date.parse(cfg.expiresAt) - Date.now()) / 1000;
}

function pending() {
  return cfg.status === "pending" && !reloading;
}

function showOutcome(text) {
  $("#outcome").textContent = text;
}

function setBusy(busy) {
  const buttons = "#review-actions button, #reason-form button, #edit-form button";
  for (const b of document.querySelectorAll(buttons)) b.disabled = busy;
}

// The call is no longer waiting: show how it ended (a fresh render of this page).
function gone() {
  if (!pending()) return;
  if (secondsLeft() <= 1) {
    cfg.status = "expired";
    for (const el of document.querySelectorAll("#review-actions, #reason-form, #edit-form")) el.hidden = true;
    showOutcome("Nobody answered in time: the call expired.");
    return;
  }
  reloading = true;
  window.location.reload();
}

async function decide(decision, reason = "", args = null) {
  if (!pending()) return;
  setBusy(true);
  const body = { approval_id: cfg.approvalId, decision };
  if (cfg.sessionId) body.session_id = cfg.sessionId;
  if (reason) body.reason = reason;
  if (args) body.arguments = args;
  let data = {};
  let ok = false;
  try {
    const resp = await fetch(cfg.confirmUrl, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": cfg.csrfToken, Accept: "application/json" },
      body: JSON.stringify(body),
    });
    data = await resp.json().catch(() => ({}));
    ok = resp.ok;
  } catch (err) {
    data = { detail: "Could not reach the server. Try again." };
  }
  if (ok || data.error === "already_decided" || data.error === "not_found") {
    if (data.error === "already_decided") showOutcome("Someone else answered first.");
    reloading = true;
    window.location.reload();
    return;
  }
  if (args && (data.error === "invalid_arguments" || data.error === "invalid_field")) {
    showEditError(data.detail || "The server refused these arguments.");
  } else {
    showOutcome(data.detail || "Could not send the answer. Try again.");
  }
  setBusy(false);
}

// -- editing before allowing --------------------------------------------------

const editForm = $("#edit-form");

function schema() {
  try {
    return cfg.argumentsSchema ? JSON.parse(cfg.argumentsSchema) : null;
  } catch (err) {
    return null;
  }
}

function showEditError(text) {
  const el = editForm && editForm.querySelector(".edit-error");
  if (!el) return;
  el.textContent = text;
  el.hidden = !text;
}

if (editForm) {
  const area = editForm.querySelector("textarea");
  area.addEventListener("input", () => showEditError(readEdit(area.value, schema()).error || ""));
  editForm.addEventListener("click", (ev) => {
    if (ev.target.closest('button[data-action="cancel-edit"]')) editForm.hidden = true;
  });
  editForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const edit = readEdit(area.value, schema());
    if (edit.error) return showEditError(edit.error);
    decide("allow", "", edit.value);
  });
}

// Invisible and direction-changing characters are shown, never obeyed.
for (const el of document.querySelectorAll("#review-title, .review-description, pre.args")) {
  el.textContent = reveal(el.textContent);
}

function socketUrl() {
  const url = new URL(cfg.websocketUrl || "/ws/approvals/", window.location.href);
  if (url.protocol === "http:") url.protocol = "ws:";
  if (url.protocol === "https:") url.protocol = "wss:";
  if (cfg.sessionId) url.searchParams.set("session_id", cfg.sessionId);
  return url.toString();
}

function onMessage(msg) {
  if (msg.type === "snapshot") {
    const ids = new Set((msg.pending || []).map((item) => item.approval_id));
    if (!ids.has(cfg.approvalId)) gone();
  } else if (msg.type === "tool_decision" && msg.approval_id === cfg.approvalId) {
    gone();
  }
}

function connect() {
  if (socket || !pending()) return;
  setConn("connecting", attempts ? "Reconnecting…" : "Connecting…");
  const ws = new WebSocket(socketUrl());
  socket = ws;
  ws.addEventListener("open", () => {
    attempts = 0;
    stopPolling();
    setConn("live", "Live");
  });
  ws.addEventListener("message", (ev) => {
    try {
      onMessage(JSON.parse(ev.data));
    } catch (err) {
      // Not ours to read.
    }
  });
  ws.addEventListener("close", (ev) => {
    socket = null;
    if (ev.code === 4401) return setConn("signed-out", "Signed out");
    setConn("offline", "Offline — retrying…");
    startPolling();
    const delay = Math.min(15000, 500 * 2 ** attempts) * (0.8 + Math.random() * 0.4);
    attempts += 1;
    setTimeout(connect, delay);
  });
}

function startPolling() {
  if (pollTimer || !cfg.pendingUrl) return;
  pollTimer = setInterval(poll, 4000);
}

function stopPolling() {
  clearInterval(pollTimer);
  pollTimer = 0;
}

async function poll() {
  const url = new URL(cfg.pendingUrl, window.location.href);
  if (cfg.sessionId) url.searchParams.set("session_id", cfg.sessionId);
  try {
    const resp = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (resp.ok) onMessage({ type: "snapshot", pending: (await resp.json()).pending || [] });
  } catch (err) {
    // The server is away too; the next tick tries again.
  }
}

function tick() {
  const el = $("#countdown");
  if (!el || !pending()) return;
  const left = Math.max(0, Math.round(secondsLeft()));
  el.textContent = left >= 120 ? `${Math.round(left / 60)} min` : `${left} s`;
  if (left <= 0) gone();
}

const actions = $("#review-actions");
const form = $("#reason-form");
if (actions && form) {
  actions.addEventListener("click", (ev) => {
    const button = ev.target.closest("button[data-action]");
    if (!button) return;
    const action = button.dataset.action;
    if (action === "allow") decide("allow");
    else if (action === "deny") decide("deny");
    else if (action === "reason") {
      form.hidden = false;
      form.querySelector("textarea").focus();
    } else if (action === "edit" && editForm) {
      editForm.hidden = false;
      editForm.querySelector("textarea").focus();
    }
  });
  form.addEventListener("click", (ev) => {
    if (ev.target.closest('button[data-action="cancel-reason"]')) form.hidden = true;
  });
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const reason = form.querySelector("textarea").value.trim();
    if (reason) decide("deny", reason);
  });
}

if (pending()) {
  connect();
  tick();
  setInterval(tick, 1000);
} else {
  setConn("live", "Decided");
}
