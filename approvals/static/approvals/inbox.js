// The inbox: pending tool calls arrive live and are answered with a click or a
// key. Every endpoint comes from the page's data attributes (rendered with
// {% url %}), so the app can be mounted under any prefix.

import { liveTick, loadRules, reconnectNow, revokeRule, sendDecision, signOut, startLive } from "./inbox-live.js";
import { readEdit } from "./inbox-edit.js";
import {
  $,
  REMOVE_AFTER_MS,
  announce,
  cardFor,
  cards,
  closeEdit,
  closeReason,
  configure,
  decided,
  openEdit,
  openReason,
  showEditError,
  removeCard,
  setBusy,
  showOutcome,
  tick,
  updateCount,
} from "./inbox-view.js";

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

async function decide(card, decision, extra = {}) {
  if (card.busy || card.el.classList.contains("decided")) return;
  card.busy = true;
  setBusy(card, true);
  const body = { approval_id: card.item.approval_id, decision, ...extra };
  if (card.item.session_id) body.session_id = card.item.session_id;
  const result = await sendDecision(body);
  card.busy = false;
  if (result.resolved) {
    const status = decision === "allow" ? "allowed" : "denied";
    const via = result.type === "tool_confirm_result" ? "websocket" : "web";
    const reason = extra.reason || "";
    const edited_arguments = extra.arguments || null;
    decided({ approval_id: body.approval_id, status, decided_via: via, decided_by: cfg.username, reason, edited_arguments });
    if (extra.remember) loadRules();
  } else if (result.error === "not_found") {
    showOutcome(card, "This call is gone: it was decided or is not yours.");
    setTimeout(() => removeCard(body.approval_id), REMOVE_AFTER_MS);
  } else if (result.error === "already_decided") {
    showOutcome(card, "Someone else answered first.");
    setTimeout(() => removeCard(body.approval_id), REMOVE_AFTER_MS * 2);
  } else if (extra.arguments && (result.error === "invalid_arguments" || result.error === "not_editable")) {
    showEditError(card, result.detail || "The server refused these arguments.");
    setBusy(card, false);
  } else {
    if (result.error === "authentication_required") signOut();
    showOutcome(card, result.detail || "Could not send the answer. Try again.");
    setBusy(card, false);
  }
}

const pendingList = $("#pending-list");

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
  else if (action === "edit") openEdit(card);
  else if (action === "cancel-edit") closeEdit(card);
});

// Check the edit as it is typed: JSON syntax here, the schema's basics here too;
// the server checks the full schema and has the last word.
pendingList.addEventListener("input", (ev) => {
  if (!ev.target.matches('.edit-form textarea')) return;
  const card = cardFor(ev.target);
  if (card) showEditError(card, readEdit(ev.target.value, card.item.arguments_schema).error || "");
});

function submitEdit(card, form) {
  const edit = readEdit($("textarea", form).value, card.item.arguments_schema);
  if (edit.error) {
    showEditError(card, edit.error);
    $("textarea", form).focus();
    return;
  }
  decide(card, "allow", { arguments: edit.value });
}

pendingList.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const card = cardFor(ev.target);
  if (!card) return;
  if (ev.target.classList.contains("edit-form")) return submitEdit(card, ev.target);
  const textarea = $("textarea", ev.target);
  const reason = textarea.value.trim();
  if (reason) decide(card, "deny", { reason });
  else textarea.focus();
});

pendingList.addEventListener("keydown", (ev) => {
  const card = cardFor(ev.target);
  if (!card || ev.altKey || ev.ctrlKey || ev.metaKey) return;
  if (ev.target.matches("textarea, input")) {
    if (ev.key === "Escape") {
      if (ev.target.closest(".edit-form")) closeEdit(card);
      else closeReason(card);
    }
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

$("#rules-list").addEventListener("click", async (ev) => {
  const button = ev.target.closest('button[data-action="revoke"]');
  if (!button) return;
  button.disabled = true;
  if (await revokeRule(button.closest(".rule").dataset.ruleId)) announce("Rule revoked.");
  else button.disabled = false;
});

$(".conn-retry").addEventListener("click", reconnectNow);

// Allow all / Deny all: every pending call shown, after one confirmation naming the count.
async function decideAll(decision) {
  const open = [...cards.values()].filter((c) => !c.el.classList.contains("decided") && !c.busy);
  if (!open.length) return;
  const verb = decision === "allow" ? "Allow" : "Deny";
  const calls = open.length === 1 ? "1 waiting tool call" : `${open.length} waiting tool calls`;
  if (!window.confirm(`${verb} all ${calls}?`)) return;
  await Promise.all(open.map((card) => decide(card, decision)));
  announce(`${verb === "Allow" ? "Allowed" : "Denied"} ${calls}.`);
}

$("#allow-all").addEventListener("click", () => decideAll("allow"));
$("#deny-all").addEventListener("click", () => decideAll("deny"));

configure(cfg, root.dataset.serverTime);
updateCount();
setInterval(() => {
  tick();
  liveTick();
}, 1000);
tick();
startLive(cfg);
