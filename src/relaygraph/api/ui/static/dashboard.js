// relaygraph audit dashboard: the small script layer over server-rendered pages.
//
// - the task list refreshes its rows while tasks run;
// - a task page follows the task's event stream and swaps in the parts that changed
//   (rendered by the server, the same templates as the first load), keeping open details,
//   the selected edge and focus in place;
// - edges of the handoff graph are selectable by click or keyboard;
// - decision and cancel forms post in place and show the server's error in the form;
// - a Copy button puts its trace id on the clipboard.
"use strict";

(() => {
  const REFRESH_HEADERS = { "X-Relaygraph-Refresh": "1", Accept: "application/json" };
  const EVENT_TYPES = [
    "run_started", "route", "agent_started", "tool_call", "tool_result", "handoff",
    "agent_finished", "violation", "approval", "interrupted", "final", "run_finished",
    "run_suspended", "model_call", "usage", "cancel_requested",
  ];
  const FINISHED = new Set(["succeeded", "degraded", "failed", "cancelled"]);

  function say(text) {
    const banner = document.getElementById("banner");
    if (!banner) return;
    banner.textContent = text || "";
    banner.hidden = !text;
  }

  class SignedOut extends Error {}

  function toSignIn() {
    const next = location.pathname + location.search;
    location.assign("/ui/login?expired=1&next=" + encodeURIComponent(next));
  }

  async function getJSON(url) {
    const response = await fetch(url, { headers: REFRESH_HEADERS, credentials: "same-origin" });
    if (response.status === 401) {
      toSignIn();
      throw new SignedOut();
    }
    if (!response.ok) throw new Error("HTTP " + response.status);
    return response.json();
  }

  // Replace an element's content, keeping what the reader had open, selected or focused.
  function replaceKeepingState(element, html) {
    const open = new Set(
      [...element.querySelectorAll("details[data-key][open]")].map((d) => d.dataset.key),
    );
    const closed = new Set(
      [...element.querySelectorAll("details[data-key]:not([open])")].map((d) => d.dataset.key),
    );
    const focused = document.activeElement;
    const focusKey = focused && element.contains(focused) ? focusKeyOf(focused) : null;
    element.innerHTML = html;
    for (const details of element.querySelectorAll("details[data-key]")) {
      if (open.has(details.dataset.key)) details.open = true;
      else if (closed.has(details.dataset.key)) details.open = false;
    }
    if (focusKey) {
      const again = element.querySelector(focusKey);
      if (again) again.focus({ preventScroll: true });
    }
  }

  function focusKeyOf(element) {
    if (element.dataset.edge) return `[data-edge="${element.dataset.edge}"]`;
    if (element.id) return "#" + CSS.escape(element.id);
    const href = element.getAttribute("href");
    return href ? `a[href="${CSS.escape(href)}"]` : null;
  }

  // --- the task list ---------------------------------------------------------------------

  function followTaskList() {
    const rows = document.getElementById("task-rows");
    if (!rows) return;
    const every = Number(rows.dataset.refreshMs) || 3000;
    let last = null;
    async function tick() {
      if (rows.dataset.live !== "1") return;
      if (!document.hidden) {
        try {
          const data = await getJSON(rows.dataset.refreshUrl);
          if (data.html !== last) {
            last = data.html;
            replaceKeepingState(rows, data.html);
          }
          rows.dataset.live = data.live ? "1" : "0";
          say("");
        } catch (error) {
          if (error instanceof SignedOut) return;
          say("Could not refresh the task list; trying again.");
        }
      }
      setTimeout(tick, every);
    }
    setTimeout(tick, every);
  }

  // --- the task page ---------------------------------------------------------------------

  let refreshTask = () => {};

  function followTask() {
    const root = document.querySelector("[data-task-id]");
    if (!root) return;
    const id = root.dataset.taskId;
    const shown = new Map();
    let finished = root.dataset.finished === "1";
    let source = null;
    let busy = false;
    let again = false;
    let timer = null;

    async function refresh() {
      if (busy) {
        again = true;
        return;
      }
      busy = true;
      try {
        const data = await getJSON(`/ui/tasks/${encodeURIComponent(id)}?fragment=1`);
        for (const [name, html] of Object.entries(data.sections)) {
          const section = document.getElementById("section-" + name);
          if (!section || shown.get(name) === html) continue;
          // Never wipe out what someone is typing into a decision form.
          if (name === "approvals" && section.querySelector("form.dirty")) continue;
          shown.set(name, html);
          replaceKeepingState(section, html);
          if (name === "graph") selectEdge(selected);
        }
        root.dataset.lastEvent = data.last_event_seq;
        finished = data.finished;
        if (finished && source) {
          source.close();
          source = null;
        }
        say("");
      } catch (error) {
        if (!(error instanceof SignedOut)) say("Lost contact with the server; trying again.");
      } finally {
        busy = false;
        if (again) {
          again = false;
          soon();
        }
      }
    }

    function soon() {
      clearTimeout(timer);
      timer = setTimeout(refresh, 150);
    }
    refreshTask = soon;

    function follow() {
      if (finished || !window.EventSource) return;
      const after = encodeURIComponent(root.dataset.lastEvent || "0");
      source = new EventSource(`/ui/tasks/${encodeURIComponent(id)}/events?after=${after}`);
      for (const type of EVENT_TYPES) source.addEventListener(type, onEvent);
      source.onerror = () => {
        // The stream ends when the task does; a refresh tells whether it has.
        soon();
      };
    }

    function onEvent(event) {
      if (event.type === "run_finished") {
        try {
          if (FINISHED.has(JSON.parse(event.data).status) && source) {
            source.close();
            source = null;
          }
        } catch (_) {
          /* A malformed event still triggers the refresh below. */
        }
      }
      soon();
    }

    follow();
  }

  // --- the handoff graph -----------------------------------------------------------------

  let selected = null;

  function selectEdge(number) {
    selected = number;
    for (const edge of document.querySelectorAll(".edge[data-edge]")) {
      const on = edge.dataset.edge === number;
      edge.classList.toggle("selected", on);
      edge.setAttribute("aria-pressed", on ? "true" : "false");
    }
    for (const detail of document.querySelectorAll("[data-edge-detail]")) {
      detail.hidden = detail.dataset.edgeDetail !== number;
    }
    const hint = document.querySelector("[data-edge-hint]");
    if (hint) hint.hidden = Boolean(number && document.querySelector(`[data-edge-detail="${number}"]`));
  }

  document.addEventListener("click", (event) => {
    const edge = event.target.closest && event.target.closest(".edge[data-edge]");
    if (edge) selectEdge(edge.dataset.edge);
  });

  document.addEventListener("keydown", (event) => {
    const edge = event.target.closest && event.target.closest(".edge[data-edge]");
    if (edge && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      selectEdge(edge.dataset.edge);
    }
  });

  // --- copying a trace id ---------------------------------------------------------------

  async function copy(button) {
    const text = button.dataset.copy;
    try {
      // The clipboard needs a secure context (HTTPS, or the loopback address).
      await navigator.clipboard.writeText(text);
      button.textContent = "Copied";
    } catch (_) {
      // No clipboard here: select the id beside the button so that Ctrl+C copies it.
      const shown = button.previousElementSibling;
      if (shown) window.getSelection().selectAllChildren(shown);
      button.textContent = "Selected";
    }
    setTimeout(() => (button.textContent = "Copy"), 1500);
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest && event.target.closest("button[data-copy]");
    if (button) copy(button);
  });

  // --- forms that post in place ----------------------------------------------------------

  document.addEventListener("input", (event) => {
    const form = event.target.closest && event.target.closest("form.decision-form");
    if (form) form.classList.add("dirty");
  });

  document.addEventListener("submit", async (event) => {
    const form = event.target;
    if (!form.matches("form[data-async]")) return;
    event.preventDefault();
    const error = form.querySelector(".form-error");
    const buttons = [...form.querySelectorAll("button")];
    if (error) error.textContent = "";
    for (const field of form.querySelectorAll("[aria-invalid]")) field.removeAttribute("aria-invalid");
    buttons.forEach((b) => (b.disabled = true));
    try {
      const response = await fetch(form.action, {
        method: "POST",
        body: new URLSearchParams(new FormData(form)),
        headers: { Accept: "application/json" },
        credentials: "same-origin",
      });
      if (response.status === 401) return toSignIn();
      if (response.ok) {
        // Decided: what was typed into this approval's other forms no longer matters.
        const scope = form.closest("[data-approval]") || form;
        for (const each of scope.querySelectorAll("form")) each.classList.remove("dirty");
        form.classList.remove("dirty");
        refreshTask();
        return;
      }
      const body = await response.json().catch(() => null);
      const problem = body && body.error ? body.error : {};
      if (error) error.textContent = problem.message || `The server answered ${response.status}.`;
      const field = problem.field && form.querySelector(`[name="${CSS.escape(problem.field)}"]`);
      if (field) {
        field.setAttribute("aria-invalid", "true");
        field.focus();
      }
    } catch (_) {
      if (error) error.textContent = "Could not reach the server; try again.";
    } finally {
      buttons.forEach((b) => (b.disabled = false));
    }
  });

  document.addEventListener("DOMContentLoaded", () => {
    followTaskList();
    followTask();
  });
})();
