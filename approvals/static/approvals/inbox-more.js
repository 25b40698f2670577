// What the socket leaves out: arguments cut short ("arguments_truncated") are
// loaded whole on request, and a snapshot's "more" count is shown under the list.
// Self-contained: it reads the pending list's URL from the page and touches only
// the card it is given and its own note.

const root = document.querySelector("#inbox");

function approvalUrl(id) {
  const base = (root && root.dataset.pendingUrl) || "";
  return new URL(`${base.replace(/\/$/, "")}/${encodeURIComponent(id)}`, window.location.href);
}

/** On a card whose arguments were cut short: the start of the text, and a button for the rest. */
export function offerFullArguments(el, item) {
  const args = el.querySelector(".args");
  args.textContent = `${typeof item.arguments === "string" ? item.arguments : ""}…`;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "btn btn-quiet btn-small";
  button.textContent = "Show all arguments";
  button.addEventListener("click", async () => {
    button.disabled = true;
    button.textContent = "Loading…";
    try {
      const response = await fetch(approvalUrl(item.approval_id), {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (!response.ok) throw new Error(String(response.status));
      const data = await response.json();
      item.arguments = data.arguments;
      delete item.arguments_truncated;
      args.textContent = JSON.stringify(data.arguments ?? {}, null, 2);
      button.remove();
    } catch (err) {
      button.disabled = false;
      button.textContent = "Could not load them: try again";
    }
  });
  args.after(button);
}

/** Under the list: how many pending calls the snapshot left out (none: no note). */
export function showMore(count) {
  let note = document.querySelector("#more-pending");
  const list = document.querySelector("#pending-list");
  if (!note && count > 0 && list) {
    note = document.createElement("p");
    note.id = "more-pending";
    note.className = "muted small";
    list.after(note);
  }
  if (!note) return;
  note.hidden = !(count > 0);
  note.textContent = count === 1 ? "1 more call not shown" : `${count} more calls not shown`;
}
