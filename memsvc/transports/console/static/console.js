// The memsvc console: one page over the Connect API of this origin (JSON mapping).
// No framework and no build step: change this file, reload the page.

const TOKEN_KEY = "memsvc-console-token";
const REFRESH_MS = 2000;
const PAGE_SIZE = 25;
const CHART_POINTS = 40;

const $ = (id) => document.getElementById(id);

// ---- the API -------------------------------------------------------------------------
class ApiError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

async function call(method, body = {}) {
  const headers = {
    "Content-Type": "application/json",
    "Connect-Protocol-Version": "1",
    "Connect-Timeout-Ms": "60000",
  };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  let reply;
  try {
    reply = await fetch("/memsvc.v1.MemoryService/" + method, {
      method: "POST", headers, body: JSON.stringify(body), credentials: "omit",
    });
  } catch (error) {
    throw new ApiError("unavailable", "the server did not answer (" + error.message + ")");
  }
  const text = await reply.text();
  const data = text ? JSON.parse(text) : {};
  if (!reply.ok) throw new ApiError(data.code || "unknown", data.message || reply.statusText);
  return data;
}

// ---- state ---------------------------------------------------------------------------
const state = {
  caller: null,          // {role, conversationPrefixes, authenticated}; null = not known yet
  listsAll: false,       // GetIndexStatus without ids answers (admin or prefix-limited)
  named: [],             // conversations opened by id (tokens that must name them)
  conversations: [],
  page: 0,
  open: null,            // the conversation shown
  selected: new Set(),   // its turns picked for deletion
  last: null,            // the previous figures, for rates
  series: {throughput: [], lag: [], search: []},
  reindexTotal: 0,
  timer: null,
};

const role = () => (state.caller ? state.caller.role : "");
const isAdmin = () => role() === "admin";
const isWriter = () => role() === "admin" || role() === "writer";

function notice(text) {
  $("notice").textContent = text;
  $("notice").hidden = !text;
}

function showError(error) {
  const box = $("error");
  if (!error) { box.hidden = true; box.textContent = ""; return; }
  box.textContent = error instanceof ApiError ? error.code + ": " + error.message : String(error);
  box.hidden = false;
}

async function guarded(work) {
  try {
    showError(null);
    await work();
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") {
      signOut("The token was refused: " + error.message);
      return;
    }
    showError(error);
  }
}

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// A timestamp as written ("2026-02-02T10:15:30+08:00"), shown as date and time, each
// kept on one line: a narrow column breaks between them, never inside the date.
function when(timestamp) {
  const out = el("span", null, {class: "when"});
  if (!timestamp) return out;
  const [date, time] = timestamp.split("T");
  out.append(el("span", date));
  if (time) out.append(" ", el("span", time));
  return out;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.append(cell); else td.textContent = cell ?? "";
    tr.append(td);
  }
  return tr;
}

function setRoles() {
  document.body.dataset.role = role() || "unknown";
  $("who-role").textContent = state.caller
    ? role() + (state.caller.conversationPrefixes?.length
      ? " · conversations " + state.caller.conversationPrefixes.join(", ") + "…" : "")
      + (state.caller.authenticated ? "" : " · no authentication")
    : "token accepted";
}

// ---- sign-in -------------------------------------------------------------------------
async function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    const status = await call("GetIndexStatus", {});
    state.listsAll = true;
    state.caller = status.caller;
    takeStatus(status);
  } catch (error) {
    if (error instanceof ApiError && error.code === "permission_denied") {
      // A token not limited to prefixes and below admin names its conversations.
      state.listsAll = false;
      state.caller = null;
    } else {
      sessionStorage.removeItem(TOKEN_KEY);
      throw error;
    }
  }
  $("token").value = "";
  $("sign-in").hidden = true;
  $("nav").hidden = false;
  $("who").hidden = false;
  setRoles();
  show("overview");
  state.timer = setInterval(() => guarded(refresh), REFRESH_MS);
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(state.timer);
  Object.assign(state, {caller: null, named: [], open: null, last: null, reindexTotal: 0});
  state.series = {throughput: [], lag: [], search: []};
  for (const id of ["overview", "conversations", "search", "nav", "who"]) $(id).hidden = true;
  $("conversation").hidden = true;
  $("sign-in").hidden = false;
  $("token").value = "";
  showError(message || null);
}

function show(screen) {
  notice("");
  for (const id of ["overview", "conversations", "search"]) $(id).hidden = id !== screen;
  for (const b of document.querySelectorAll("nav button")) {
    b.classList.toggle("current", b.dataset.screen === screen);
  }
  $("list-area").hidden = !state.listsAll;
  $("overview-note").hidden = state.listsAll || state.named.length > 0;
}

// ---- overview ------------------------------------------------------------------------
function statusRequest() {
  // the server's first page (1,000, by id) within the prefix typed: the totals cover all
  if (!state.listsAll) return {conversationIds: state.named};
  const prefix = $("filter-prefix").value.trim();
  return prefix ? {conversationPrefix: prefix} : {};
}

async function refresh() {
  if (!state.listsAll && state.named.length === 0) return;
  const status = await call("GetIndexStatus", statusRequest());
  state.caller = status.caller;
  setRoles();
  takeStatus(status);
  if (state.open) await loadConversation(state.open, false);
}

function dl(target, pairs) {
  target.replaceChildren();
  for (const [k, v] of pairs) {
    target.append(el("dt", k));
    const dd = el("dd", v);
    if (v === "up") dd.className = "up";
    if (v === "down" || v === "full") dd.className = "down";
    target.append(dd);
  }
}

function takeStatus(status) {
  const server = status.server || {};
  // the fallback model serves, or the store is rebuilt for a new model: say what that
  // means where nobody can miss it
  const move = server.modelMove;
  const label = server.modelFallback ? "Model fallback: " : move ? "Model move: " : "";
  $("model-warning").hidden = !server.modelNotice;
  $("model-warning").textContent = server.modelNotice ? label + server.modelNotice : "";
  const rebuilt = move ? [["Rebuilt for the model",
    `${(move.conversations || 0) - (move.left || 0)} of ${move.conversations || 0} conversations`]] : [];
  dl($("server"), [
    ["Model", server.model + (server.modelFallback ? " (bundled fallback)" : "")],
    ...rebuilt,
    ["Runtime", server.embedBackend], ["Dimension", server.dim],
    ["Event log", server.logBackend], ["Version", server.version],
  ]);
  const health = status.health || {};
  dl($("health"), [
    ["Vector store", health.storeUp ? "up" : "down"],
    ["Embedder", health.embedderUp ? "up" : "down"],
    ["Event log", health.logUp ? "up" : "down"],
    ["Disk", health.diskFull ? "full" : "up"],
  ]);
  dl($("totals"), [
    ["Conversations", status.totalConversations || 0],
    ["Backlog (turns)", status.totalBacklog || 0],
    ["Pending", status.pending || 0], ["Indexing", status.indexing || 0],
    ["Failed", status.failed || 0], ["Worker", status.paused ? "paused" : "running"],
  ]);
  $("worker-state").textContent = status.paused ? "paused" : "running";
  $("pause").disabled = !!status.paused;
  $("resume").disabled = !status.paused;
  takeFigures(status.figures);
  state.conversations = status.conversations || [];
  state.more = !!status.nextPageToken;
  if (state.reindexTotal) {
    // what the server still has to rebuild, over every conversation (not only this page's):
    // a reindex of the version searched queues the conversations (pending, indexing),
    // a version change marks them reindexing
    const queued = Number(status.pending || 0) + Number(status.indexing || 0);
    const left = Math.min(state.reindexTotal,
      Math.max(queued, state.conversations.filter((c) => c.reindexing).length));
    const done = Math.max(0, state.reindexTotal - left);
    $("reindex-progress").value = done / state.reindexTotal;
    $("reindex-text").textContent = done + " of " + state.reindexTotal + " rebuilt";
    if (left === 0) state.reindexTotal = 0;
  }
  renderList();
}

// Rates between two readings of the server's running totals.
function takeFigures(f) {
  if (!f) return;
  const now = {
    t: Number(f.uptimeS || 0), written: Number(f.chunksWritten || 0),
    lagCount: Number(f.indexLagCount || 0), lagSum: Number(f.indexLagSumS || 0),
    bounds: (f.searchLatencyBoundsS || []).map(Number),
    counts: (f.searchLatencyCounts || []).map(Number),
  };
  const last = state.last;
  state.last = now;
  if (!last || now.t <= last.t) return;
  const dt = now.t - last.t;
  push("throughput", (now.written - last.written) / dt);
  const lagN = now.lagCount - last.lagCount;
  push("lag", lagN > 0 ? (now.lagSum - last.lagSum) / lagN : null);
  push("search", windowP50(last, now));
  draw("chart-throughput", state.series.throughput, (v) => v.toFixed(1));
  draw("chart-lag", state.series.lag, (v) => v.toFixed(2));
  draw("chart-search", state.series.search, (v) => v.toFixed(1));
}

// The median of the searches between two readings, from the histogram's bucket counts
// (linear within the bucket that holds it), in ms; null when there were none.
function windowP50(last, now) {
  const counts = now.counts.map((c, i) => c - (last.counts[i] || 0));
  const total = counts.length ? counts[counts.length - 1] : 0;
  if (total <= 0) return null;
  const half = total / 2;
  let below = 0;
  let lower = 0;
  for (let i = 0; i < counts.length; i++) {
    if (counts[i] >= half) {
      const inBucket = counts[i] - below;
      const share = inBucket > 0 ? (half - below) / inBucket : 1;
      return (lower + share * (now.bounds[i] - lower)) * 1000;
    }
    below = counts[i];
    lower = now.bounds[i];
  }
  return lower * 1000;
}

function push(name, value) {
  const series = state.series[name];
  series.push(value);
  if (series.length > CHART_POINTS) series.shift();
}

const SVG = "http://www.w3.org/2000/svg";

// A sparkline with its axes: the scale's top and 0 at the left, the time span below. Values
// are clamped to the plot (a counter reset would draw below it, across the caption).
function draw(id, series, format) {
  const figure = $(id);
  figure.querySelector("svg")?.remove();
  figure.querySelector(".value")?.remove();
  const width = 240, height = 74, left = 34, right = 236, top = 6, bottom = 58;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("role", "img");
  const known = series.filter((v) => v !== null);
  const scale = Math.max(...known, 1e-9);
  const y = (v) => bottom - (Math.min(Math.max(v, 0), scale) / scale) * (bottom - top);
  // the newest reading at "now": a short series ends at the right, not the left
  const x = (i) => left + ((CHART_POINTS - series.length + i) / (CHART_POINTS - 1)) * (right - left);
  const points = series
    .map((v, i) => (v === null ? null : `${x(i)},${y(v)}`))
    .filter((p) => p !== null);
  const axis = document.createElementNS(SVG, "polyline");
  axis.setAttribute("class", "axis");
  axis.setAttribute("points", `${left},${top} ${left},${bottom} ${right},${bottom}`);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("class", "line");
  line.setAttribute("points", points.join(" "));
  const minutes = Math.round((CHART_POINTS * REFRESH_MS) / 60000);
  svg.append(axis, line,
    label(left - 3, top + 6, known.length ? format(scale) : "", "end"),
    label(left - 3, bottom, "0", "end"),
    label(left, height - 2, `−${minutes} min`, "start"),
    label(right, height - 2, "now", "end"));
  const latest = known.length ? format(known[known.length - 1]) : "–";
  svg.setAttribute("aria-label", figure.querySelector("figcaption").textContent + ": " + latest);
  figure.append(svg, el("span", latest, {class: "value"}));
}

function label(x, y, text, anchor) {
  const node = document.createElementNS(SVG, "text");
  node.setAttribute("x", x);
  node.setAttribute("y", y);
  node.setAttribute("text-anchor", anchor);
  node.textContent = text;
  return node;
}

// ---- conversations -------------------------------------------------------------------
function filtered() {
  const prefix = $("filter-prefix").value.trim();
  const since = $("filter-since").value;
  return state.conversations
    .filter((c) => c.conversationId.startsWith(prefix))
    .filter((c) => !since || (c.lastTimestamp && c.lastTimestamp.slice(0, 10) >= since))
    .sort((a, b) => (b.lastTimestamp || "").localeCompare(a.lastTimestamp || ""));
}

function renderList() {
  const items = filtered();
  const pages = Math.max(1, Math.ceil(items.length / PAGE_SIZE));
  state.page = Math.min(state.page, pages - 1);
  const body = $("conversation-list").querySelector("tbody");
  body.replaceChildren();
  for (const c of items.slice(state.page * PAGE_SIZE, (state.page + 1) * PAGE_SIZE)) {
    const link = el("a", c.conversationId, {href: "#"});
    link.addEventListener("click", (e) => {
      e.preventDefault();
      guarded(() => openConversation(c.conversationId));
    });
    // the JSON mapping leaves out zeros: a missing turn id is turn 0
    const indexed = Number(c.lastIndexedTurn || 0);  // -1: nothing indexed yet
    body.append(row([link, Number(c.lastAppendedTurn || 0) + 1, indexed < 0 ? "—" : indexed,
      c.backlog || 0, c.state, when(c.lastTimestamp)]));
  }
  $("page-text").textContent = `page ${state.page + 1} of ${pages} · ${items.length} conversations`
    + (state.more ? " (the first by id: type a prefix to narrow)" : "");
  $("page-prev").disabled = state.page === 0;
  $("page-next").disabled = state.page >= pages - 1;
}

async function openConversation(id) {
  if (!state.listsAll && !state.named.includes(id)) {
    const status = await call("GetIndexStatus", {conversationIds: [id]});
    state.named.push(id);
    state.caller = status.caller;
    setRoles();
    takeStatus(status);
  }
  state.open = id;
  state.selected.clear();
  $("delete-confirm").hidden = true;
  $("purge-confirm").value = "";
  $("purge").disabled = true;
  show("conversations");
  await loadConversation(id, true);
}

async function pages(method, request, key) {
  const out = [];
  let token = "";
  do {
    const reply = await call(method, {...request, pageToken: token});
    out.push(...(reply[key] || []));
    token = reply.nextPageToken || "";
  } while (token);
  return out;
}

async function loadConversation(id, scroll) {
  const [status, events, chunks] = await Promise.all([
    call("GetIndexStatus", {conversationIds: [id]}),
    pages("ExportEvents", {conversationId: id, pageSize: 500}, "events"),
    pages("ListChunks", {conversationId: id, pageSize: 1000,
      includeDeleted: isAdmin() && $("show-deleted").checked}, "chunks"),
  ]);
  if (state.open !== id) return;
  const s = (status.conversations || [])[0] || {lastIndexedTurn: -1, lastAppendedTurn: -1};
  // the list's row was read at the last poll: take this newer reading, so the two agree
  const listed = state.conversations.findIndex((c) => c.conversationId === id);
  if (listed >= 0 && status.conversations?.length) {
    state.conversations[listed] = s;
    renderList();
  }
  const indexed = Number(s.lastIndexedTurn || 0);
  const lastTurn = Number(s.lastAppendedTurn || 0);
  $("conversation").hidden = false;
  $("conversation-title").textContent = id;
  $("conversation-status").textContent =
    `${s.state} · turns 0–${lastTurn} · `
    + (indexed < 0 ? "nothing indexed yet" : `indexed through ${indexed}`)
    + ` · backlog ${s.backlog || 0}`
    + ` · version ${s.chunkVersion}` + (s.reindexing ? " · reindexing" : "")
    + (s.lastError ? " · last error: " + s.lastError : "");
  renderTurns(events, indexed, lastTurn, chunks);
  renderChunks(chunks);
  if (scroll) $("conversation").scrollIntoView();
}

function renderTurns(events, indexed, lastTurn, chunks) {
  const body = $("turns").querySelector("tbody");
  body.replaceChildren();
  // Rows for the turns the log holds, and one row per run of ids between them (deleted
  // turns, or a gap a restore left): never one row per id, which ids up to 2^53 forbid.
  const live = events.map((e) => [Number(e.turnId || 0), e]).sort((a, b) => a[0] - b[0]);
  const deleted = chunks.filter((c) => c.metadata.deleted).map((c) => {
    const range = c.metadata.turnRange || {};
    return [Number(range.start || 0), Number(range.end || 0), c.text];
  });
  const missing = (from, to) => {
    const over = deleted.find(([start, end]) => start <= to && end >= from);
    const tr = row(["", from === to ? from : `${from}–${to}`, "", "",
      over ? over[2] : "(deleted)", "deleted"]);
    tr.dataset.turn = String(from);
    tr.className = "deleted";
    tr.firstChild.className = "writer-only";
    body.append(tr);
  };
  let next = 0;
  for (const [t, e] of live) {
    if (t > next) missing(next, t - 1);
    const pick = el("input", null, {type: "checkbox", "aria-label": "select turn " + t});
    pick.checked = state.selected.has(t);
    pick.addEventListener("change", () => {
      if (pick.checked) state.selected.add(t); else state.selected.delete(t);
      $("delete-turns").disabled = state.selected.size === 0;
    });
    const tr = row([pick, t, e.speaker, when(e.timestamp), e.text,
      t > indexed ? "not yet searchable" : "searchable"]);
    tr.dataset.turn = String(t);
    tr.firstChild.className = "writer-only";
    body.append(tr);
    next = t + 1;
  }
  if (lastTurn >= next) missing(next, lastTurn);
  $("delete-turns").disabled = state.selected.size === 0;
}

function renderChunks(chunks) {
  const body = $("chunks").querySelector("tbody");
  body.replaceChildren();
  for (const c of chunks) {
    const m = c.metadata;
    const range = m.turnRange || {};
    const tr = row([c.chunkId, `${range.start || 0}–${range.end || 0}`, m.chunkVersion,
      `${(m.partIndex || 0) + 1}/${m.partCount || 1}`, m.intentTag || "",
      m.deleted ? "deleted" : "stored", c.text]);
    if (m.deleted) tr.className = "deleted";
    body.append(tr);
  }
}

async function exportConversation() {
  const id = state.open;
  const events = await pages("ExportEvents", {conversationId: id, pageSize: 500}, "events");
  // the lines `memsvc export` writes, so `memsvc append` takes the file back
  const lines = events.map((e) => JSON.stringify({
    conversation_id: e.conversationId, turn_id: Number(e.turnId || 0), speaker: e.speaker,
    text: e.text, timestamp: e.timestamp, participants: e.participants || [],
    speaker_name: e.speakerName || "",
    ...(e.payload ? {payload: e.payload} : {}),
  }) + "\n").join("");
  const link = el("a", null, {download: id.replace(/[^\w.-]+/g, "_") + ".jsonl"});
  link.href = URL.createObjectURL(new Blob([lines], {type: "application/x-ndjson"}));
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

function turnRanges(turns) {
  const sorted = [...turns].sort((a, b) => a - b);
  const ranges = [];
  for (const t of sorted) {
    const last = ranges[ranges.length - 1];
    if (last && last.end === t - 1) last.end = t; else ranges.push({start: t, end: t});
  }
  return ranges;
}

async function deleteSelected() {
  const id = state.open;
  const turns = state.selected.size;
  for (const range of turnRanges(state.selected)) {
    await call("LogicalDeleteBySource", {conversationId: id, turnRange: range});
  }
  notice(`${turns} turn${turns === 1 ? "" : "s"} deleted from ${id}`);
  state.selected.clear();
  $("delete-confirm").hidden = true;
  await loadConversation(id, false);
}

// ---- search --------------------------------------------------------------------------
function searchRequest() {
  const filters = {};
  const ids = $("q-conversations").value.split(",").map((s) => s.trim()).filter(Boolean);
  if (ids.length) filters.conversationIds = ids;
  const speakers = [...document.querySelectorAll("input[name=speaker]:checked")]
    .map((i) => i.value);
  if (speakers.length) filters.speakers = speakers;
  const from = $("q-from").value.trim(), to = $("q-to").value.trim();
  if (from || to) filters.timestampRange = {start: from, end: to};
  return {
    queryText: $("q").value, mode: $("mode").value, topK: Number($("top-k").value) || 0,
    filters, explain: true,
  };
}

// The text as nodes, with the words the server matched (explanation.matchedTerms: the
// text's own words, lower-cased, and Chinese pieces) marked.
function highlighted(text, terms) {
  const out = document.createElement("p");
  out.className = "hit-text";
  const latin = new Set(terms.filter((t) => !/\p{Script=Han}/u.test(t)));
  const cjk = terms.filter((t) => /\p{Script=Han}/u.test(t));
  const escaped = cjk.map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  // a Chinese piece, else a word of other letters or digits, else one Chinese character
  const word = "(?:(?!\\p{Script=Han})[\\p{L}\\p{N}])+";
  const pattern = new RegExp([...escaped, word, "\\p{Script=Han}"].join("|"), "gu");
  let at = 0;
  for (const match of text.matchAll(pattern)) {
    const word = match[0];
    const hit = cjk.includes(word) || latin.has(word.toLowerCase());
    if (!hit) continue;
    out.append(text.slice(at, match.index), el("mark", word));
    at = match.index + word.length;
  }
  out.append(text.slice(at));
  return out;
}

function hitItem(hit) {
  const why = hit.explanation || {};
  const m = hit.metadata || {};
  const range = m.turnRange || {};
  const item = document.createElement("li");
  const head = el("div", null, {class: "hit-head"});
  head.append(
    el("strong", Number(hit.score || 0).toFixed(3)),
    el("span", ` ${m.conversationId} · turns ${range.start || 0}–${range.end || 0}`
      + ` · ${m.intentTag || ""}`),
  );
  const table = el("table", null, {class: "why"});
  table.append(
    row(["dense", why.denseRank ? "#" + why.denseRank : "–",
      why.denseRank ? "cosine " + Number(why.denseScore).toFixed(3) : "not a candidate"]),
    row(["keyword", why.keywordRank ? "#" + why.keywordRank : "–",
      why.keywordRank ? "BM25 " + Number(why.keywordScore).toFixed(3) : "not a candidate"]),
    row(["fused", "", Number(why.fusedScore || 0).toFixed(3)]),
  );
  item.append(head, table, highlighted(hit.text || "", why.matchedTerms || []));
  return item;
}

async function search() {
  const reply = await call("EmbedDb", searchRequest());
  const hits = reply.hits || [];
  $("search-summary").textContent =
    `${hits.length} hits · ${reply.mode.replace("SEARCH_MODE_", "").toLowerCase()}`;
  $("hits").replaceChildren(...hits.map(hitItem));
  const standing = reply.standing || [];
  $("standing-area").hidden = standing.length === 0;
  $("standing").replaceChildren(...standing.map(hitItem));
}

// A turn after the conversation's last, numbered and stamped by the server; sent with an
// idempotency key, so a click whose answer was lost cannot store it twice.
async function addTurn() {
  const text = $("add-text").value.trim();
  if (!text || !state.open) return;
  const reply = await call("AppendEvents", {
    events: [{conversationId: state.open, speaker: $("add-speaker").value, text}],
    assignTurnIds: true,
    idempotencyKey: crypto.randomUUID(),
  });
  if ((reply.errors || []).length) throw new Error(reply.errors[0].message);
  $("add-text").value = "";
  notice(`Turn ${(reply.turnIds || [])[0]} added to ${state.open}; searchable within seconds.`);
  await loadConversation(state.open, false);
}

// ---- wiring --------------------------------------------------------------------------
function on(id, event, work) {
  $(id).addEventListener(event, (e) => {
    if (event === "submit") e.preventDefault();
    guarded(() => work(e));
  });
}

document.addEventListener("DOMContentLoaded", () => {
  on("sign-in-form", "submit", () => signIn($("token").value.trim()));
  $("sign-out").addEventListener("click", () => signOut());
  for (const b of document.querySelectorAll("nav button")) {
    b.addEventListener("click", () => show(b.dataset.screen));
  }
  on("open-form", "submit", () => openConversation($("open-id").value.trim()));
  for (const id of ["filter-prefix", "filter-since"]) {
    $(id).addEventListener("input", () => { state.page = 0; renderList(); });
  }
  $("page-prev").addEventListener("click", () => { state.page--; renderList(); });
  $("page-next").addEventListener("click", () => { state.page++; renderList(); });
  on("export", "click", exportConversation);
  on("add-form", "submit", addTurn);
  on("show-deleted", "change", () => loadConversation(state.open, false));
  on("conversation-reindex", "click", async () => {
    await call("Reindex", {conversationIds: [state.open]});
    await loadConversation(state.open, false);
  });
  $("delete-turns").addEventListener("click", () => {
    const turns = [...state.selected].sort((a, b) => a - b);
    $("delete-question").textContent =
      `Delete turn${turns.length > 1 ? "s" : ""} ${turns.join(", ")} of ${state.open}?`;
    $("delete-confirm").hidden = false;
  });
  on("delete-yes", "click", deleteSelected);
  $("delete-no").addEventListener("click", () => { $("delete-confirm").hidden = true; });
  $("purge-confirm").addEventListener("input", () => {
    $("purge").disabled = $("purge-confirm").value !== state.open;
  });
  on("purge", "click", async () => {
    const reply = await call("PurgeDeleted", {conversationId: state.open});
    $("purge-confirm").value = "";
    $("purge").disabled = true;
    notice(`${reply.eventsPurged || 0} turns and ${reply.chunksPurged || 0} chunks purged`);
    await loadConversation(state.open, false);
  });
  on("pause", "click", async () => {
    await call("SetIndexingPaused", {paused: true});
    await refresh();
  });
  on("resume", "click", async () => {
    await call("SetIndexingPaused", {paused: false});
    await refresh();
  });
  on("reindex-all", "click", async () => {
    const reply = await call("Reindex", {all: true});
    state.reindexTotal = Number(reply.queued || 0);
    $("reindex").hidden = false;
    $("reindex-progress").value = 0;
    $("reindex-text").textContent = `0 of ${state.reindexTotal} rebuilt`;
    await refresh();
  });
  on("search-form", "submit", search);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token !== null) guarded(() => signIn(token));
});
