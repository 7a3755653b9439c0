// contextfold inspector: lists streams, shows a stream's context lanes, live-tails events.
// Every value from the journal is set with textContent (never innerHTML): item content is
// data, often from external actors, and must show as text.
"use strict";

(() => {
  const MAX_EVENTS = 200;
  const PREVIEW_CHARS = 600;
  const query = new URLSearchParams(location.search);
  const stream = query.get("stream");
  const namespace = query.get("namespace");
  // The token travels in the fragment (#token=...), which browsers never send to servers.
  const token = new URLSearchParams(location.hash.slice(1)).get("token");

  const $ = (id) => document.getElementById(id);

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function apiPath(path, extra) {
    const params = new URLSearchParams(extra || {});
    if (namespace) params.set("namespace", namespace);
    const qs = params.toString();
    return "v1/" + path + (qs ? "?" + qs : "");
  }

  function streamPath(suffix) {
    return "streams/" + encodeURIComponent(stream) + "/" + suffix;
  }

  async function getJSON(path, extra) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    const response = await fetch(apiPath(path, extra), { headers });
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      const error = body && body.error ? body.error : { type: "HTTP " + response.status, message: "" };
      throw new Error(error.type + ": " + error.message);
    }
    return body;
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }

  function setStatus(status, text) {
    const node = $("live-status");
    node.dataset.status = status;
    node.textContent = text;
  }

  // -- streams ---------------------------------------------------------------------------

  async function loadStreams() {
    const body = await getJSON("streams");
    const list = $("streams");
    list.replaceChildren();
    for (const info of body.streams) {
      const li = el("li", info.stream === stream ? "current" : "");
      const link = el("a", "", info.stream);
      const params = new URLSearchParams({ stream: info.stream });
      if (namespace) params.set("namespace", namespace);
      link.href = "?" + params.toString() + location.hash;
      li.append(link, el("span", "muted", "v" + info.version));
      list.append(li);
    }
    if (!body.streams.length) list.append(el("li", "muted", "no streams yet"));
  }

  // -- context lanes ---------------------------------------------------------------------

  function renderItem(item) {
    const li = el("li", "item");
    li.classList.add(item.published ? "published" : "pending");
    li.dataset.offset = item.offset;
    li.dataset.role = item.role;
    li.dataset.wireRole = item.wire_role;
    li.dataset.external = item.external ? "true" : "false";
    const meta = el("div", "item-meta");
    meta.append(el("code", "item-header", item.header));
    meta.append(el("span", "badge role", item.role));
    meta.append(el("span", "badge wire-role", "wire: " + item.wire_role));
    if (item.external) {
      li.classList.add("external");
      const who = item.actor.id ? item.actor.type + " " + item.actor.id : item.actor.type;
      meta.append(el("span", "badge external-actor", "external actor: " + who));
    }
    if (item.compaction) meta.append(el("span", "badge", "compaction summary"));
    meta.append(el("span", "badge", item.published ? "published" : "not yet sent"));
    li.append(meta, el("pre", "item-content", item.content));
    if (item.tool_calls && item.tool_calls.length) {
      li.append(el("pre", "payload", "tool calls: " + JSON.stringify(item.tool_calls, null, 2)));
    }
    return li;
  }

  function renderLane(id, items) {
    const lane = $(id);
    lane.replaceChildren(...items.map(renderItem));
    if (!items.length) lane.append(el("li", "muted", "empty"));
  }

  function renderSummary(context) {
    const rows = [
      ["version", context.version],
      ["published through", "@" + context.published_through],
      ["requests", context.request_offsets.map((n) => "@" + n).join(" ") || "none"],
      ["compacted through", context.compacted_through ? "@" + context.compacted_through : "never"],
    ];
    if (context.header) rows.push(["transport", context.header.transport + " / " + context.header.model]);
    const summary = $("summary");
    summary.replaceChildren();
    for (const [name, value] of rows) summary.append(el("dt", "", name), el("dd", "", value));
  }

  async function loadContext() {
    const context = await getJSON(streamPath("context"));
    renderSummary(context);
    renderLane("lane-system", context.system);
    renderLane("lane-history", context.history);
    document.body.dataset.state = "ready";
  }

  // -- live tail -------------------------------------------------------------------------

  function renderEvent(event) {
    const li = el("li");
    li.dataset.position = event.position;
    const line = el("div");
    line.append(el("code", "", "#" + event.position + " " + event.type));
    const who = event.meta.actor ? " by " + event.meta.actor : "";
    line.append(el("span", "muted", " " + event.meta.time + who));
    let preview = JSON.stringify(event.payload);
    if (preview.length > PREVIEW_CHARS) preview = preview.slice(0, PREVIEW_CHARS) + "…";
    li.append(line, el("pre", "payload", preview));
    return li;
  }

  let refreshTimer = null;
  function scheduleRefresh() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(() => {
      Promise.all([loadContext(), loadStreams()]).then(() => showError(""), (e) => showError(e.message));
    }, 150);
  }

  function tail() {
    const params = {};
    if (token) params.access_token = token;  // EventSource cannot send headers
    const source = new EventSource(apiPath(streamPath("tail"), params));
    const events = $("events");
    setStatus("connecting", "connecting…");
    source.onopen = () => setStatus("live", "live");
    source.onmessage = (message) => {
      events.prepend(renderEvent(JSON.parse(message.data)));
      while (events.children.length > MAX_EVENTS) events.lastElementChild.remove();
      scheduleRefresh();
    };
    source.addEventListener("reset", () => {
      events.replaceChildren();
      scheduleRefresh();
    });
    source.addEventListener("error", (message) => {
      if (message.data) {  // an error frame from the server: the tail ended
        const error = JSON.parse(message.data).error;
        showError(error.type + ": " + error.message);
        source.close();
        setStatus("error", "tail stopped");
      } else if (source.readyState === EventSource.CLOSED) {
        setStatus("error", "disconnected");
      } else {
        setStatus("connecting", "reconnecting…");  // the browser resumes via Last-Event-ID
      }
    });
  }

  async function main() {
    if (namespace) $("namespace").textContent = "namespace " + namespace;
    if (stream) {
      $("stream-title").textContent = stream;
      document.title = stream + " · contextfold inspector";
      tail();  // subscribe first, then read: nothing appended in between is missed
    }
    try {
      await (stream ? Promise.all([loadStreams(), loadContext()]) : loadStreams());
      if (!stream) document.body.dataset.state = "ready";
    } catch (error) {
      showError(error.message);
      document.body.dataset.state = "error";
    }
  }

  main();
})();
