// contextfold inspector: a trace view of a journal's streams. Views: the trace (turns as
// nested spans with latency, tokens, cost, verify status and prompt-cache share, budget
// gauges per lane), one request (exact body, chat view, diff, header, prefix, manifest),
// the context as of any offset, event search with paging, and the transcript with live
// deltas. Every value from the journal is set with textContent (never as markup): item
// content is data, often from external actors, and must show as text.
"use strict";

(() => {
  const MAX_EVENTS = 200;
  const PREVIEW_CHARS = 600;
  const TURNS_PER_PAGE = 20;
  const STREAMS_PER_PAGE = 100;
  const MAX_STREAMS_PAGE = 1000;  // the API's most streams in one page
  const query = new URLSearchParams(location.search);
  const stream = query.get("stream");
  const namespace = query.get("namespace");
  const view = stream ? query.get("view") || "trace" : "";
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
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(extra || {})) {
      if (value !== undefined && value !== null && value !== "") params.set(name, value);
    }
    if (namespace) params.set("namespace", namespace);
    const qs = params.toString();
    return "v1/" + path + (qs ? "?" + qs : "");
  }

  function streamPath(suffix) {
    return "streams/" + encodeURIComponent(stream) + "/" + suffix;
  }

  // A link to another view of the inspector (same stream, namespace and token).
  function pageLink(params) {
    const next = new URLSearchParams();
    if (stream) next.set("stream", stream);
    if (namespace) next.set("namespace", namespace);
    if (query.get("filter")) next.set("filter", query.get("filter"));
    for (const [name, value] of Object.entries(params)) {
      if (value !== undefined && value !== null && value !== "") next.set(name, value);
    }
    return "?" + next.toString() + location.hash;
  }

  function link(text, params, className) {
    const a = el("a", className || "", text);
    a.href = pageLink(params);
    return a;
  }

  // Live connections close when the page goes (browsers allow six per server: a page kept
  // in the back-forward cache would hold its own), and a page shown again reloads.
  const sources = [];
  function openSource(path, extra) {
    const source = new EventSource(apiPath(path, extra));
    sources.push(source);
    return source;
  }
  addEventListener("pagehide", () => { for (const source of sources) source.close(); });
  addEventListener("pageshow", (event) => { if (event.persisted) location.reload(); });

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

  // -- formatting ------------------------------------------------------------------------

  function ms(value) {
    if (value === null || value === undefined) return "–";
    return value >= 1000 ? (value / 1000).toFixed(2) + " s" : Math.round(value) + " ms";
  }

  function pct(value) {
    return value === null || value === undefined ? "–" : (value * 100).toFixed(1) + "%";
  }

  function dollars(value) {
    return value === null || value === undefined ? "–" : "$" + value.toFixed(4);
  }

  function tokens(usage) {
    if (!usage) return "no usage";
    const cached = usage.cached_input_tokens === null ? "?" : usage.cached_input_tokens;
    return "in " + usage.input_tokens + " · cached " + cached + " · out " + usage.output_tokens;
  }

  function badge(text, kind) {
    return el("span", "badge" + (kind ? " " + kind : ""), text);
  }

  // Long text: the first lines visible, the rest behind a <details> (collapsed).
  function collapsible(text, className) {
    const value = text === null || text === undefined ? "" : String(text);
    if (value.length <= PREVIEW_CHARS) return el("pre", className || "payload", value);
    const box = el("details", "long");
    box.append(el("summary", "", value.slice(0, 160).replace(/\s+/g, " ") + "… (" + value.length + " chars)"));
    box.append(el("pre", className || "payload", value));
    return box;
  }

  function time(value) {
    return value ? new Date(value).getTime() : null;
  }

  // -- streams ---------------------------------------------------------------------------

  // The sidebar lists a page of streams at a time (the API's next cursor loads the next),
  // filtered by a name prefix typed above it. Listings run one after the other, so a live
  // refresh cannot undo a page just loaded; one asked before a newer filter is skipped.
  let streamsNext = null;
  let streamsShown = STREAMS_PER_PAGE;  // how many the pages loaded so far hold, at most
  let streamsAsked = 0;
  let streamsQueue = Promise.resolve();

  // first: the first page; more: the next page; again: the pages shown, anew (a refresh).
  function loadStreams(mode) {
    const asked = mode === "first" ? ++streamsAsked : streamsAsked;
    const run = streamsQueue.then(() => (asked === streamsAsked ? listStreams(mode) : null));
    streamsQueue = run.catch(() => null);
    return run;
  }

  async function listStreams(mode) {
    const prefix = $("streams-filter").value;
    const more = mode === "more";
    const limit = mode === "again" ? Math.min(streamsShown, MAX_STREAMS_PAGE) : STREAMS_PER_PAGE;
    const body = await getJSON("streams", { prefix: prefix, limit: limit, after: more ? streamsNext : null });
    streamsShown = more ? streamsShown + STREAMS_PER_PAGE : limit;
    const list = $("streams");
    if (!more) list.replaceChildren();
    for (const info of body.streams) {
      const li = el("li", info.stream === stream ? "current" : "");
      const a = el("a", "", info.stream);
      const params = new URLSearchParams({ stream: info.stream });
      if (namespace) params.set("namespace", namespace);
      if (prefix) params.set("filter", prefix);
      a.href = "?" + params.toString() + location.hash;
      li.append(a, el("span", "muted", "v" + info.version));
      list.append(li);
    }
    streamsNext = body.next;
    $("streams-more").hidden = body.next === null;
    if (!list.children.length) {
      list.append(el("li", "muted", prefix ? "no stream starts with " + JSON.stringify(prefix) : "no streams yet"));
    }
  }

  function setupStreams() {
    $("streams-filter").value = query.get("filter") || "";
    let typing = null;
    const reload = () => loadStreams("first").then(() => showError(""), (error) => showError(error.message));
    $("streams-form").addEventListener("submit", (event) => {
      event.preventDefault();
      clearTimeout(typing);
      reload();
    });
    $("streams-filter").addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(reload, 250);
    });
    $("streams-more").addEventListener("click", () => {
      loadStreams("more").catch((error) => showError(error.message));
    });
  }

  // -- trace view ------------------------------------------------------------------------

  let turnsStart = null;  // null: the newest page

  function card(label, value, note) {
    const box = el("div", "card");
    box.append(el("div", "card-label", label), el("div", "card-value", value));
    if (note) box.append(el("div", "muted", note));
    return box;
  }

  function renderStats(stats, priced) {
    const t = stats.tokens;
    const verify = Object.entries(stats.verify).filter(([, n]) => n).map(([k, n]) => n + " " + k);
    $("stats").replaceChildren(
      card("requests", String(stats.requests), stats.turns + " turns · " + stats.tool_calls + " tool calls"),
      card("tokens", t.input + " in / " + t.output + " out", "cached " + t.cached_input + " · cache writes " + t.cache_write),
      card("prompt cache", pct(stats.cache.prefix_share) + " of bytes",
        stats.cache.cached_share === null ? "no cached tokens reported" : "provider cached " + pct(stats.cache.cached_share) + " of input"),
      card("cost", priced && stats.cost !== null ? dollars(stats.cost) : "unknown",
        stats.unpriced_models && stats.unpriced_models.length ? "no price known for " + stats.unpriced_models.join(", ") : ""),
      card("verify", verify.join(", ") || "no requests", stats.verify.drift ? "rebuild drift!" : "rebuilds byte for byte"),
      card("compactions", String(stats.compactions),
        [stats.model, (stats.frameworks || []).join(", ")].filter(Boolean).join(" · ")),
    );
    renderGauges(stats);
  }

  function gauge(label, value, total, note) {
    const row = el("div", "gauge");
    row.dataset.lane = label;
    const bar = el("div", "gauge-bar");
    const fill = el("div", "gauge-fill");
    const share = total ? Math.min(value / total, 1) : 0;
    fill.style.width = (share * 100).toFixed(2) + "%";
    if (share > 0.8) fill.classList.add("hot");
    bar.append(fill);
    row.append(el("span", "gauge-label", label), bar, el("span", "gauge-note", note));
    return row;
  }

  function renderGauges(stats) {
    const size = stats.context_window;
    const of = (n) => pct(size ? n / size : null);
    $("budget-note").textContent = size ? "(window " + size + " tokens; lanes approximate: JSON length / 4)" : "";
    const rows = stats.lanes.map((lane) =>
      gauge(lane.lane, lane.tokens, size, lane.tokens + " tokens · " + lane.items + " items · " + of(lane.tokens)),
    );
    if (stats.latest_input_tokens !== null) {
      rows.push(gauge("latest request", stats.latest_input_tokens, size,
        stats.latest_input_tokens + " input tokens reported · " + of(stats.latest_input_tokens)));
    }
    $("gauges").replaceChildren(...rows);
  }

  // One row of a turn's waterfall: a label and a bar placed on the turn's time axis.
  function spanRow(axis, level, kind, label, start, end, extra) {
    const li = el("li", "span span-" + kind);
    li.dataset.kind = kind;
    li.dataset.level = String(level);
    const head = el("div", "span-head");
    head.style.paddingLeft = (level * 1.2) + "rem";
    if (label instanceof Node) head.append(label); else head.append(el("span", "span-label", label));
    for (const node of extra || []) head.append(node);
    const track = el("div", "span-track");
    const bar = el("div", "span-bar");
    const from = time(start);
    const to = time(end) ?? from;
    if (from !== null && axis.length > 0) {
      bar.style.left = (((from - axis.start) / axis.length) * 100).toFixed(2) + "%";
      bar.style.width = Math.max(((to - from) / axis.length) * 100, 0.4).toFixed(2) + "%";
    } else if (from !== null) {
      bar.style.left = "0%";
      bar.style.width = "100%";
    }
    track.append(bar);
    li.append(head, track);
    return li;
  }

  function renderTool(axis, call) {
    const extra = [badge(ms(call.latency_ms))];
    if (call.is_error) extra.push(badge(call.not_rerun ? "not run again" : "error", "bad"));
    const row = spanRow(axis, 2, "tool", "tool " + call.name + "(" + call.arguments + ")",
      call.started_at || call.finished_at, call.finished_at, extra);
    row.dataset.callId = call.call_id;
    if (call.output !== null) {
      const result = el("div", "span-body");
      result.style.paddingLeft = "3.6rem";
      result.append(el("span", "muted", "result @" + call.result_position + " (" + call.output_chars + " chars)"));
      result.append(collapsible(call.output));
      row.append(result);
    }
    return row;
  }

  function renderRequest(axis, request) {
    const rows = [];
    const name = link("request @" + request.offset, { view: "request", offset: request.offset }, "request-link");
    const extra = [
      ...(request.framework ? [badge(request.framework, "framework")] : []),
      badge(request.model || "?"),
      badge(ms(request.latency_ms)),
      badge(tokens(request.usage), "tokens"),
      badge("verify " + request.verify, request.verify === "ok" ? "good" : "bad"),
    ];
    if (request.prefix_share !== null) extra.push(badge("prefix " + pct(request.prefix_share), "cache"));
    if (request.cost !== null) extra.push(badge(dollars(request.cost)));
    if (request.sends > 1) extra.push(badge("sent " + request.sends + "×", "bad"));
    if (request.interrupted) extra.push(badge("interrupted: " + request.interrupted, "bad"));
    const row = spanRow(axis, 0, "request", name, request.requested_at, request.answered_at || request.sent_at, extra);
    row.dataset.offset = request.offset;
    row.dataset.verify = request.verify;
    rows.push(row);
    if (request.answered_at) {
      const what = (request.streamed ? "streamed response" : "response") + " @" + request.response_position;
      const answer = spanRow(axis, 1, "response", what, request.sent_at || request.requested_at, request.answered_at,
        [badge(request.finish_reason || "?"), badge(request.text_chars + " chars")]);
      if (request.text) {
        const body = el("div", "span-body");
        body.style.paddingLeft = "2.4rem";
        body.append(collapsible(request.text));
        answer.append(body);
      }
      rows.push(answer);
    }
    for (const call of request.tool_calls) rows.push(renderTool(axis, call));
    return rows;
  }

  function renderItemRow(axis, item) {
    const who = item.actor ? " · " + item.actor : "";
    const kind = item.kind === "trigger" ? "trigger" : item.kind;
    const replaced = item.through !== null ? "history through @" + item.through
      : item.summarized + (item.summarized === 1 ? " message" : " messages");
    const label = item.kind === "compaction"
      ? "compaction @" + item.position + " replaces " + replaced
      : kind + " @" + item.position + " " + (item.role || "") + who;
    const row = spanRow(axis, item.kind === "trigger" ? 0 : 1, kind, label, item.time, item.time,
      item.chars ? [badge(item.chars + " chars")] : []);
    row.dataset.position = item.position;
    if (item.text) {
      const body = el("div", "span-body");
      body.style.paddingLeft = "2.4rem";
      body.append(collapsible(item.text));
      row.append(body);
    }
    return row;
  }

  function renderTurn(turn) {
    const li = el("li", "turn");
    li.dataset.index = turn.index;
    const axis = { start: time(turn.start_time), length: time(turn.end_time) - time(turn.start_time) };
    const head = el("div", "turn-head");
    const requests = turn.requests.length;
    head.append(el("strong", "", "Turn " + (turn.index + 1)));
    head.append(el("span", "muted", " " + new Date(turn.start_time).toLocaleTimeString() + " · " + ms(turn.duration_ms) +
      " · " + requests + (requests === 1 ? " request" : " requests")));
    if (turn.cost !== null) head.append(badge(dollars(turn.cost)));
    if (!requests) head.append(badge("waiting for the agent", "pending"));
    li.append(head);
    // Journal order: triggers and items by position, each request where it was made.
    const entries = [
      ...turn.items.map((item) => ({ at: item.position, rows: () => [renderItemRow(axis, item)] })),
      ...turn.requests.map((request) => ({ at: request.offset, rows: () => renderRequest(axis, request) })),
    ].sort((a, b) => a.at - b.at);
    const spans = el("ol", "spans");
    for (const entry of entries) spans.append(...entry.rows());
    li.append(spans);
    return li;
  }

  async function loadTrace() {
    const params = { limit: TURNS_PER_PAGE };
    if (turnsStart !== null) params.start = turnsStart;
    const body = await getJSON(streamPath("trace"), params);
    renderStats(body.stats, body.priced);
    const last = body.start + body.turns.length;
    $("turns-note").textContent = body.total_turns
      ? "(" + (body.start + 1) + "–" + last + " of " + body.total_turns + ")" : "(none yet)";
    $("turns").replaceChildren(...body.turns.map(renderTurn));
    $("turns-earlier").disabled = body.start === 0;
    $("turns-later").disabled = last >= body.total_turns;
    $("turns-earlier").onclick = () => { turnsStart = Math.max(body.start - TURNS_PER_PAGE, 0); refresh(); };
    $("turns-later").onclick = () => {
      turnsStart = last + TURNS_PER_PAGE >= body.total_turns ? null : last;
      refresh();
    };
  }

  // -- request view ----------------------------------------------------------------------

  function messagesOf(body) {
    const list = [];
    if (body && body.system !== undefined) list.push({ role: "system", content: body.system });
    if (body && body.instructions !== undefined) list.push({ role: "system", content: body.instructions });
    for (const m of (body && (body.messages || body.input)) || []) list.push(m);
    return list;
  }

  function textOf(content) {
    if (content === null || content === undefined) return "";
    if (typeof content === "string") return content;
    if (!Array.isArray(content)) return JSON.stringify(content, null, 2);
    return content.map((part) => {
      if (typeof part === "string") return part;
      if (part.type === "tool_use") return "→ " + part.name + "(" + JSON.stringify(part.input) + ")";
      if (part.type === "tool_result") return textOf(part.content);
      if (part.text !== undefined) return part.text;
      if (part.output !== undefined) return textOf(part.output);
      return JSON.stringify(part);
    }).join("\n");
  }

  function renderMessage(message, same) {
    const li = el("li", "chat-message" + (same ? " cached" : ""));
    const role = message.role || message.type || "?";
    li.dataset.role = role;
    const meta = el("div", "item-meta");
    meta.append(el("strong", "", role));
    meta.append(badge(same ? "same as previous request" : "new since previous request", same ? "cache" : "fresh"));
    li.append(meta);
    let text = textOf(message.content);
    if (message.type === "function_call") text = "→ " + message.name + "(" + message.arguments + ")";
    if (message.type === "function_call_output") text = textOf(message.output);
    li.append(collapsible(text, "item-content"));
    if (message.tool_calls) {
      const calls = message.tool_calls.map((c) => "→ " + c.function.name + "(" + c.function.arguments + ")");
      li.append(el("pre", "payload", calls.join("\n")));
    }
    return li;
  }

  // A framework's message in its readable form (role, text, tool calls, the call answered).
  function renderReadable(message, same) {
    const li = renderMessage({ role: message.role, content: message.text || "" }, same);
    const calls = (message.tool_calls || []).map((c) => "→ " + c.name + "(" + c.arguments + ")");
    if (message.tool_call_id) calls.push("← result of " + message.tool_call_id);
    if (calls.length) li.append(el("pre", "payload", calls.join("\n")));
    return li;
  }

  function fact(list, name, value) {
    const dd = el("dd");
    if (value instanceof Node) dd.append(value); else dd.textContent = value;
    list.append(el("dt", "", name), dd);
  }

  async function loadRequest() {
    const offset = query.get("offset");
    const page = await getJSON(streamPath("trace/" + encodeURIComponent(offset)));
    const trace = page.trace || {};
    document.title = stream + " @" + offset + " · contextfold inspector";
    $("stream-title").textContent = stream + " · request @" + offset;
    $("request-back").href = pageLink({ view: "trace" });
    $("request-context").href = pageLink({ view: "context", at: offset });
    const facts = $("request-facts");
    facts.replaceChildren();
    fact(facts, "sha256", el("code", "sha", page.sha256));
    fact(facts, "size", page.size + " bytes, " + page.transport);
    const verify = el("span", "", trace.verify || "unknown");
    verify.id = "request-verify";
    verify.className = "badge " + (trace.verify === "ok" ? "good" : "bad");
    fact(facts, "verify", verify);
    if (trace.verify && trace.verify !== "ok") {
      fact(facts, "recorded", (trace.recorded_sha256 || []).join(", ") || "never sent");
      fact(facts, "rebuilt", trace.rebuilt_sha256 || trace.rebuild_error || "–");
    }
    fact(facts, "model", page.header.model);
    fact(facts, "reason", trace.reason || "–");
    fact(facts, "latency", ms(trace.latency_ms) + (trace.sent_at ? " (sent " + trace.sent_at + ")" : ""));
    fact(facts, "tokens", tokens(trace.usage));
    fact(facts, "cost", trace.cost === null || trace.cost === undefined ? "unknown" : dollars(trace.cost));
    fact(facts, "finish", trace.finish_reason || "–");

    const cache = $("request-cache");
    const diff = page.diff;
    cache.replaceChildren();
    if (diff) {
      const share = el("p", "cache-share");
      share.id = "request-prefix-share";
      share.append(el("strong", "", pct(diff.share)));
      share.append(document.createTextNode(" of this body (" + diff.prefix_bytes + " of " + page.size +
        " bytes) is an exact prefix of "));
      share.append(link("request @" + diff.previous_offset, { view: "request", offset: diff.previous_offset }));
      share.append(document.createTextNode(": what a provider's prompt cache can reuse."));
      cache.append(share);
    } else {
      cache.append(el("p", "muted", "The first request: no previous request to share a prefix with."));
    }
    if (trace.usage && trace.usage.cached_input_tokens !== null) {
      cache.append(el("p", "", "The provider reported " + trace.usage.cached_input_tokens + " of " +
        trace.usage.input_tokens + " input tokens read from its cache."));
    }

    const diffBox = $("request-diff");
    diffBox.replaceChildren();
    if (diff) {
      diffBox.append(el("p", "muted", diff.prefix_bytes + " bytes the same at the start, " + diff.suffix_bytes +
        " at the end" + (diff.cut ? " (long sides cut)" : "") + "; between them:"));
      const removed = el("pre", "diff-removed", diff.removed || "(nothing)");
      const added = el("pre", "diff-added", diff.added || "(nothing)");
      diffBox.append(el("div", "diff-label", "previous request had"), removed, el("div", "diff-label", "this request has"), added);
    } else {
      diffBox.append(el("p", "muted", "nothing to compare"));
    }

    let body = null;
    let previous = null;
    try { body = JSON.parse(page.body); } catch (error) { body = null; }
    try { previous = page.previous_body ? JSON.parse(page.previous_body) : null; } catch (error) { previous = null; }
    const chat = $("request-chat");
    chat.replaceChildren();
    if (page.framework) {  // a framework's request: its messages as recorded, by digest
      const before = page.previous_messages;
      let same = previous !== null;
      page.messages.forEach((message, index) => {
        same = same && index < before.length && before[index] === message.sha256;
        chat.append(renderReadable(message, same));
      });
    } else {
      const messages = messagesOf(body);
      const before = messagesOf(previous);
      let same = previous !== null;
      messages.forEach((message, index) => {
        same = same && index < before.length && JSON.stringify(before[index]) === JSON.stringify(message);
        chat.append(renderMessage(message, same));
      });
    }
    $("request-header").textContent = JSON.stringify(page.header, null, 2);
    const prefix = $("request-prefix");
    prefix.replaceChildren(...page.session_prefix.map((m) => {
      const li = el("li", "item");
      li.append(el("div", "item-meta", m.role), collapsible(m.content, "item-content"));
      return li;
    }));
    if (!page.session_prefix.length) prefix.append(el("li", "muted", "no session prefix"));
    $("request-manifest").textContent = trace.manifest ? JSON.stringify(trace.manifest, null, 2) : "no manifest recorded";
    $("request-size").textContent = String(page.size);
    $("request-raw").textContent = page.body;
  }

  // -- context view ----------------------------------------------------------------------

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

  function renderSummary(context, at) {
    const requests = context.request_offsets.map((n) => "@" + n).join(" ") || "none";
    const rows = [
      [at ? "as of" : "version", at ? "@" + at + " (folded through it)" : context.version],
      ["published through", "@" + context.published_through],
      ["requests", requests],
      ["compacted through", context.compacted_through ? "@" + context.compacted_through : "never"],
    ];
    if (context.header) rows.push(["transport", context.header.transport + " / " + context.header.model]);
    const summary = $("summary");
    summary.replaceChildren();
    for (const [name, value] of rows) summary.append(el("dt", "", name), el("dd", "", value));
  }

  async function loadContext() {
    const at = query.get("at");
    $("context-at").value = at || "";
    const context = await getJSON(streamPath(at ? "context/" + encodeURIComponent(at) : "context"));
    renderSummary(context, at);
    renderLane("lane-system", context.system);
    renderLane("lane-history", context.history);
  }

  // -- events view -----------------------------------------------------------------------

  function renderEvent(event) {
    const li = el("li");
    li.dataset.position = event.position;
    li.dataset.type = event.type;
    const line = el("div");
    line.append(el("code", "", "#" + event.position + " " + event.type));
    const who = event.meta.actor ? " by " + event.meta.actor : "";
    line.append(el("span", "muted", " " + event.meta.time + who));
    li.append(line, collapsible(JSON.stringify(event.readable ?? event.payload, null, 1)));
    return li;
  }

  let searchCursor = null;

  function searchParams() {
    return { q: $("search-q").value, type: $("search-type").value, actor: $("search-actor").value };
  }

  async function loadResults(more) {
    const params = { ...searchParams(), limit: 100 };
    if (more && searchCursor) params.after = searchCursor;
    const page = await getJSON(streamPath("search"), params);
    const results = $("results");
    if (!more) results.replaceChildren();
    results.append(...page.events.map(renderEvent));
    searchCursor = page.cursor;
    $("results-more").hidden = !page.more;
    const shown = results.children.length;
    $("results-note").textContent = shown + " event(s)" + (page.more ? ", more follow" : ", to the end of the stream");
  }

  function setupSearch() {
    for (const name of ["q", "type", "actor"]) $("search-" + name).value = query.get(name) || "";
    $("search-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const params = new URLSearchParams(location.search);
      for (const [name, value] of Object.entries(searchParams())) {
        if (value) params.set(name, value); else params.delete(name);
      }
      history.replaceState(null, "", "?" + params.toString() + location.hash);
      loadResults(false).then(() => showError(""), (error) => showError(error.message));
    });
    $("results-more").addEventListener("click", () => {
      loadResults(true).catch((error) => showError(error.message));
    });
  }

  // -- transcript view -------------------------------------------------------------------

  const session = query.get("session");
  let messagesCursor = null;

  function partText(part) {
    switch (part.kind) {
      case "text": case "reasoning": return part.text;
      case "tool": return part.tool + "(" + JSON.stringify(part.input) + ") " + part.state +
        (part.output ? "\n" + part.output : "") + (part.error ? "\n" + part.error : "");
      case "step-start": return "step started " + part.time;
      case "step-finish": return "step finished: " + part.reason + " · " + tokens(part.usage) +
        (part.cost ? " · " + dollars(part.cost) : "");
      case "compaction": return part.auto ? "automatic compaction" : "compaction requested";
      case "file": return part.filename || part.url;
      default: return JSON.stringify(part);
    }
  }

  function renderPart(part) {
    const li = el("li", "part part-" + part.kind);
    li.id = "part-" + part.id;
    li.dataset.kind = part.kind;
    li.append(badge(part.kind), collapsible(partText(part), "item-content part-text"));
    return li;
  }

  function renderMessageRow(message) {
    const li = el("li", "message message-" + message.role);
    li.id = "message-" + message.id;
    const meta = el("div", "item-meta");
    meta.append(el("strong", "", message.role));
    if (message.model) meta.append(badge(message.model));
    if (message.summary) meta.append(badge("summary"));
    meta.append(badge(message.completed ? (message.finish || "done") : "streaming…", message.completed ? "" : "pending"));
    if (message.error) meta.append(badge(message.error, "bad"));
    meta.append(el("span", "muted", message.created));
    li.append(meta, el("ol", "parts"));
    return li;
  }

  function upsertMessage(message) {
    const existing = $("message-" + message.id);
    const fresh = renderMessageRow(message);
    if (existing) {
      fresh.replaceChild(existing.querySelector(".parts"), fresh.querySelector(".parts"));
      existing.replaceWith(fresh);
    } else {
      $("messages").append(fresh);
    }
    return fresh;
  }

  function upsertPart(part) {
    let message = $("message-" + part.message_id);
    if (!message) message = upsertMessage({ id: part.message_id, role: "?", created: "", completed: null });
    const existing = $("part-" + part.id);
    const fresh = renderPart(part);
    if (existing) existing.replaceWith(fresh); else message.querySelector(".parts").append(fresh);
  }

  function applyDelta(event) {
    let node = $("part-" + event.part_id);
    if (!node) {
      upsertPart({ id: event.part_id, message_id: event.message_id, kind: event.part_kind, text: "" });
      node = $("part-" + event.part_id);
    }
    node.classList.add("streaming");
    const text = node.querySelector(".part-text");
    text.textContent += event.delta;
  }

  async function loadSessions() {
    const body = await getJSON("sessions");
    const list = $("sessions");
    list.replaceChildren();
    const mine = body.sessions.filter((s) => s.id === stream || s.id.startsWith(stream + "/"));
    for (const info of mine.length ? mine : body.sessions) {
      const li = el("li", info.id === session ? "current" : "");
      li.append(link(info.id, { view: "transcript", session: info.id }), el("span", "muted", " " + info.updated));
      list.append(li);
    }
    if (!body.transcript) list.append(el("li", "muted", "this server has no transcript store"));
    else if (!body.sessions.length) list.append(el("li", "muted", "no transcript sessions yet"));
    return body;
  }

  async function loadMessages(more) {
    const params = { limit: 50 };
    if (more && messagesCursor) params.after = messagesCursor;
    const page = await getJSON("sessions/" + encodeURIComponent(session) + "/transcript", params);
    for (const entry of page.messages) {
      upsertMessage(entry.message);
      for (const part of entry.parts) upsertPart(part);
    }
    messagesCursor = page.cursor;
    $("messages-more").hidden = !page.more;
  }

  function liveTranscript() {
    const params = {};
    if (token) params.access_token = token;
    const source = openSource("sessions/" + encodeURIComponent(session) + "/live", params);
    source.onopen = () => { document.body.dataset.transcriptLive = "open"; };
    source.onmessage = (message) => {
      const event = JSON.parse(message.data);
      if (event.type === "message-updated") upsertMessage(event.message);
      else if (event.type === "part-updated") upsertPart(event.part);
      else if (event.type === "part-delta") applyDelta(event);
    };
    source.addEventListener("error", (message) => {
      if (message.data) {  // the server ended it (the subscriber fell behind): read again
        source.close();
        showError("transcript live updates stopped: reload the page");
      }
    });
  }

  async function loadTranscript() {
    const body = await loadSessions();
    $("session-title").textContent = session ? "Session " + session : "Choose a session";
    $("messages-more").onclick = () => loadMessages(true).catch((error) => showError(error.message));
    if (!session || !body.transcript) return;
    if (body.live) liveTranscript();  // subscribe first, then read the rows
    await loadMessages(false);
  }

  // -- live tail of the stream -----------------------------------------------------------

  const loaders = { trace: loadTrace, context: loadContext, request: loadRequest, events: () => loadResults(false), transcript: loadTranscript };
  const refreshed = { trace: true, context: true };  // views redrawn when the stream changes

  let refreshTimer = null;
  function refresh() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(() => {
      Promise.all([loaders[view](), loadStreams("again")]).then(() => showError(""), (e) => showError(e.message));
    }, 150);
  }

  function tail() {
    const params = {};
    if (token) params.access_token = token;  // EventSource cannot send headers
    const source = openSource(streamPath("tail"), params);
    const events = $("events");
    setStatus("connecting", "connecting…");
    source.onopen = () => setStatus("live", "live");
    source.onmessage = (message) => {
      events.prepend(renderEvent(JSON.parse(message.data)));
      while (events.children.length > MAX_EVENTS) events.lastElementChild.remove();
      if (refreshed[view]) refresh();
    };
    source.addEventListener("reset", () => {
      events.replaceChildren();
      if (refreshed[view]) refresh();
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

  function showView() {
    document.body.dataset.view = view;
    for (const section of document.querySelectorAll("section.view")) {
      section.hidden = section.id !== "view-" + view;
    }
    const tabs = $("tabs");
    tabs.hidden = false;
    for (const a of tabs.querySelectorAll("a")) {
      a.href = pageLink({ view: a.dataset.view });
      a.classList.toggle("current", a.dataset.view === view || (view === "request" && a.dataset.view === "trace"));
    }
    $("tail").hidden = false;
    $("tail-box").open = view === "events";
  }

  async function main() {
    if (namespace) $("namespace").textContent = "namespace " + namespace;
    setupStreams();
    if (stream) {
      $("stream-title").textContent = stream;
      document.title = stream + " · contextfold inspector";
      if (!loaders[view]) {
        showError("unknown view " + JSON.stringify(view) + ": use trace, context, events, transcript or request");
        document.body.dataset.state = "error";
        return;
      }
      showView();
      if (view === "events") setupSearch();
      $("context-form").addEventListener("submit", (event) => {
        event.preventDefault();
        location.href = pageLink({ view: "context", at: $("context-at").value });
      });
      tail();  // subscribe first, then read: nothing appended in between is missed
    }
    try {
      await (stream ? Promise.all([loadStreams("first"), loaders[view]()]) : loadStreams("first"));
      document.body.dataset.state = "ready";
    } catch (error) {
      showError(error.message);
      document.body.dataset.state = "error";
    }
  }

  main();
})();
