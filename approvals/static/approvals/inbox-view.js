// Rendering for the inbox: cards, history, rules and the connection badge.
// Every piece of data goes on the page with textContent, never as HTML.
import { offerFullArguments } from "./inbox-more.js";

import { prettyArguments, reveal } from "./inbox-edit.js";

export const $ = (sel, el = document) => el.querySelector(sel);
const pendingList = $("#pending-list");
const historyList = $("#history-list");
export const cards = new Map(); // approval_id -> {el, item, busy}
const toolNames = new Map(); // approval_id -> tool name, for history lines
const proposals = new Map(); // approval_id -> proposed arguments, for history lines
const HISTORY_MAX = 12;
export const REMOVE_AFTER_MS = 2500;
let cfg = { sessionId: "", username: "" };
let skewMs = 0;
let cardSeq = 0;

/** Remember who is looking and the server's clock (deadlines are the server's). */
export function configure(options, serverTime) {
  cfg = options;
  skewMs = (Date.parse(serverTime) || Date.now()) - Date.now();
}

const serverNow = () => Date.now() + skewMs;

export function setConn(state, text) {
  const conn = $("#conn");
  conn.dataset.state = state;
  $(".conn-text", conn).textContent = text;
  $(".conn-retry", conn).hidden = state !== "offline";
}

// -- cards ------------------------------------------------------------------

export function rememberName(item) {
  if (!item.approval_id) return;
  toolNames.set(item.approval_id, item.tool_name || "");
  proposals.set(item.approval_id, item.arguments);
  if (toolNames.size > 500) toolNames.delete(toolNames.keys().next().value);
  if (proposals.size > 500) proposals.delete(proposals.keys().next().value);
}

export function reconcile(pending) {
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

export function addCard(item) {
  if (!item.approval_id || cards.has(item.approval_id)) return;
  if (cfg.sessionId && item.session_id !== cfg.sessionId) return;
  const el = $("#card-template").content.firstElementChild.cloneNode(true);
  const titleId = `card-title-${++cardSeq}`;
  el.dataset.approvalId = item.approval_id;
  el.setAttribute("aria-labelledby", titleId);
  const title = $(".tool", el);
  title.id = titleId;
  title.textContent = reveal(item.tool_name || "(unnamed tool)");
  const session = $(".session", el);
  session.textContent = reveal(item.session_id || "(no session)");
  if (item.session_id) session.href = sessionHref(item.session_id);
  else session.removeAttribute("href");
  $(".args", el).textContent = prettyArguments(item.arguments);
  if (item.description) {
    const description = $(".description", el);
    description.textContent = reveal(item.description);
    description.hidden = false;
  }
  if (item.user && item.user !== cfg.username) {
    $(".owner", el).textContent = reveal(item.user);
    $(".owner-row", el).hidden = false;
  }
  if (item.agent) {
    // Gated over the agent API: the key's name says which agent asked.
    $(".agent", el).textContent = reveal(item.agent);
    $(".agent-row", el).hidden = false;
  }
  $('[data-action="edit"]', el).hidden = item.editable !== true;
  if (item.arguments_truncated) offerFullArguments(el, item);
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

export function removeCard(id) {
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

export function updateCount() {
  const open = [...cards.values()].filter((c) => !c.el.classList.contains("decided")).length;
  $("#pending-count").textContent = String(open);
  $("#bulk").hidden = open < 2;
  $("#empty").hidden = cards.size > 0;
  document.title = open ? `(${open}) Approvals` : "Approvals";
}

export function announce(text) {
  const region = $("#announce");
  region.textContent = "";
  setTimeout(() => {
    region.textContent = text;
  }, 50);
}

// -- time -------------------------------------------------------------------

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

export function tick() {
  for (const card of cards.values()) {
    if (!card.el.classList.contains("decided")) updateTimes(card);
  }
  for (const time of historyList.querySelectorAll("time[datetime]")) {
    const when = Date.parse(time.getAttribute("datetime"));
    if (!Number.isNaN(when)) time.textContent = ago(serverNow() - when);
  }
}

// -- outcomes --------------------------------------------------------------

export function setBusy(card, busy) {
  for (const button of card.el.querySelectorAll("button")) button.disabled = busy;
  card.el.classList.toggle("busy", busy);
}

export function showOutcome(card, text) {
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

export function decided(msg) {
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
  $(".edit-form", card.el).hidden = true;
  if (msg.status === "allowed" && msg.edited_arguments) {
    $(".args", card.el).textContent = prettyArguments(msg.edited_arguments);
    card.el.classList.add("edited");
  }
  const badge = $(".badge.state", card.el);
  badge.textContent = STATUS_WORDS[msg.status] || msg.status;
  badge.className = `badge state status-${msg.status}`;
  const reason = msg.reason && msg.decided_via !== "rule" ? ` — “${msg.reason}”` : "";
  const changed = msg.status === "allowed" && msg.edited_arguments ? " with changes" : "";
  showOutcome(card, `${STATUS_WORDS[msg.status] || msg.status}${changed} ${howDecided(msg)}${reason}`);
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
  $(".entry-tool", el).textContent = reveal((card && card.item.tool_name) || toolNames.get(msg.approval_id) || "tool call");
  $(".entry-how", el).textContent = howDecided(msg);
  const time = $("time", el);
  time.setAttribute("datetime", new Date(serverNow()).toISOString());
  time.textContent = "just now";
  if (msg.reason && msg.decided_via !== "rule") {
    const q = document.createElement("q");
    q.className = "entry-reason";
    q.textContent = reveal(msg.reason);
    el.append(q);
  }
  if (msg.status === "allowed") {
    // What the person approved: their edit if they made one, else the proposal.
    const args = msg.edited_arguments ?? (card ? card.item.arguments : proposals.get(msg.approval_id));
    if (args !== undefined) {
      const pre = document.createElement("pre");
      pre.className = "entry-args";
      pre.textContent = prettyArguments(args);
      if (msg.edited_arguments) {
        const note = document.createElement("span");
        note.className = "entry-edited muted";
        note.textContent = "edited";
        el.append(note);
      }
      el.append(pre);
    }
  }
  historyList.prepend(el);
  while (historyList.children.length > HISTORY_MAX) historyList.lastElementChild.remove();
  $("#history-empty").hidden = true;
}

// -- reason form and rules ------------------------------------------------

export function openReason(card) {
  const form = $(".reason-form", card.el);
  form.hidden = false;
  $(".actions", card.el).hidden = true;
  $("textarea", form).focus();
}

export function openEdit(card) {
  const form = $(".edit-form", card.el);
  const textarea = $("textarea", form);
  if (!textarea.value) textarea.value = JSON.stringify(card.item.arguments ?? {}, null, 2);
  showEditError(card, "");
  form.hidden = false;
  $(".actions", card.el).hidden = true;
  textarea.focus();
}

export function closeEdit(card) {
  $(".edit-form", card.el).hidden = true;
  $(".actions", card.el).hidden = false;
  $('[data-action="edit"]', card.el).focus();
}

export function showEditError(card, text) {
  const error = $(".edit-error", card.el);
  error.textContent = text;
  error.hidden = !text;
}

export function closeReason(card) {
  $(".reason-form", card.el).hidden = true;
  $(".actions", card.el).hidden = false;
  $('[data-action="reason"]', card.el).focus();
}

export function cardFor(el) {
  const li = el && el.closest ? el.closest(".card") : null;
  return li ? cards.get(li.dataset.approvalId) : null;
}

function describeRule(rule) {
  const parts = [rule.session_id ? `in session ${rule.session_id}` : "in every session"];
  if (rule.arguments_match && Object.keys(rule.arguments_match).length) {
    parts.push(`when ${JSON.stringify(rule.arguments_match)}`);
  }
  if (rule.expires_at) parts.push(`until ${new Date(rule.expires_at).toLocaleString()}`);
  if (rule.note) parts.push(rule.note);
  return parts.join(" · ");
}

export function renderRules(rules) {
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
