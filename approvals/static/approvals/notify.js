// Desktop notifications for the inbox: a "Notify me" button; once the browser
// allows it, a call that arrives while the tab is in the background raises a
// notification, and clicking it brings the window and the call's card forward.
// It watches the pending list for new cards, so it needs nothing from the
// inbox's other modules.

const KEY = "toolgate.notify";
const button = document.getElementById("notify-me");
const list = document.getElementById("pending-list");
const seen = new Set();

function supported() {
  return "Notification" in window;
}

function enabled() {
  return supported() && Notification.permission === "granted" && localStorage.getItem(KEY) === "on";
}

function show() {
  if (!button) return;
  button.hidden = !supported();
  const on = enabled();
  button.setAttribute("aria-pressed", on ? "true" : "false");
  button.title = !supported()
    ? ""
    : Notification.permission === "denied"
      ? "Notifications are blocked in this browser's site settings"
      : on
        ? "Desktop notifications are on; click to turn them off"
        : "Get a desktop notification when a call arrives while this tab is in the background";
}

async function toggle() {
  if (enabled()) {
    localStorage.setItem(KEY, "off");
    return show();
  }
  let permission = Notification.permission;
  if (permission === "default") permission = await Notification.requestPermission();
  if (permission === "granted") localStorage.setItem(KEY, "on");
  show();
}

function notify(card) {
  const id = card.dataset.approvalId;
  const tool = card.querySelector(".tool")?.textContent || "A tool call";
  const session = card.querySelector(".session")?.textContent || "";
  const args = (card.querySelector(".args")?.textContent || "").slice(0, 160);
  const note = new Notification(`${tool} is waiting for you`, {
    body: session ? `Session ${session}\n${args}` : args,
    tag: `toolgate-${id}`,
  });
  note.onclick = () => {
    window.focus();
    const target = list.querySelector(`.card[data-approval-id="${CSS.escape(id)}"]`);
    if (target) {
      target.scrollIntoView({ block: "center" });
      target.focus();
    }
    note.close();
  };
}

function onCards(records) {
  for (const record of records) {
    for (const node of record.addedNodes) {
      if (!(node instanceof HTMLElement) || !node.matches(".card[data-approval-id]")) continue;
      const id = node.dataset.approvalId;
      if (seen.has(id)) continue;
      seen.add(id);
      if (enabled() && document.visibilityState === "hidden") notify(node);
    }
  }
}

if (button && list) {
  button.addEventListener("click", toggle);
  new MutationObserver(onCards).observe(list, { childList: true });
  show();
}
