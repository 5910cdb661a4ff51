// sapo-async explorer: draws the page the path names from the JSON API (/api/...), and
// follows the live stream (/api/events, server-sent events). Hand-written, no library:
// the explorer must work offline, and every number shown is one the API returned.
"use strict";

const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path) {
  let response;
  try {
    response = await fetch(path, { headers: { Accept: "application/json" } });
  } catch (exc) {
    throw new ApiError(0, "explorer_unreachable", "the explorer server cannot be reached");
  }
  let body;
  try {
    body = await response.json();
  } catch (exc) {
    throw new ApiError(response.status, "bad_response", `the explorer answered ${response.status} without JSON`);
  }
  if (!response.ok) {
    const err = body.error || {};
    throw new ApiError(response.status, err.code || "error", err.message || `error ${response.status}`);
  }
  return body;
}

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message;
  box.hidden = false;
}

function clearError() {
  const box = document.getElementById("error");
  box.hidden = true;
  box.textContent = "";
}

function setLive(state, text) {
  const live = document.getElementById("live");
  live.dataset.state = state;
  live.textContent = text;
}

const short = (addr) => (addr ? `${addr.slice(0, 8)}…${addr.slice(-4)}` : "");
const fmtTime = (ts) => (ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–");
const fmtNum = (v) => (v === null || v === undefined ? "–" : String(v));
const fmtScore = (v) => (v === null || v === undefined ? "–" : Number(v).toFixed(3));

// A node's commitments journaled but not on chain yet: not a chain number, so it says
// where it was read (the running node, its journal, its log's last round) or that it is
// unknown; "paused" when the node's rounds wait for them (more than its max_pending).
const BACKLOG_FROM = { node: "the running node", journal: "its journal", log: "its round log" };
function fmtBacklog(b) {
  if (!b || b.pending === null || b.pending === undefined) return "?";
  return b.paused ? `${b.pending} paused` : String(b.pending);
}
function backlogTitle(b) {
  if (!b || b.source === null || b.source === undefined) {
    return "unknown: no journal, round log or running node of this node is at hand";
  }
  const bound = b.max_pending === null || b.max_pending === undefined ? "bound unknown" : `bound ${b.max_pending}`;
  const asOf = b.source === "log" ? ` as of round ${b.as_of_round}` : "";
  const paused = b.paused === null ? "pause unknown" : b.paused ? "rounds paused until some land" : "not paused";
  const waited = b.last_wait_s ? `; its last logged round waited ${b.last_wait_s.toFixed(1)} s for it` : "";
  return `commitments pending, from ${BACKLOG_FROM[b.source]}${asOf}; ${bound}; ${paused}${waited}`;
}

// ---------------------------------------------------------------- live stream

let stream = null;
function follow(onSwarm) {
  if (stream) stream.close();
  stream = new EventSource("/api/events");
  stream.addEventListener("open", () => setLive("live", "live"));
  stream.addEventListener("swarm", (e) => {
    const data = JSON.parse(e.data);
    setLive("live", `live · revision ${data.revision}`);
    onSwarm(data);
  });
  stream.addEventListener("problem", (e) => {
    const p = JSON.parse(e.data);
    setLive("down", "chain unreachable");
    showError(p.message);
  });
  stream.addEventListener("error", () => setLive("down", "reconnecting"));
}

// ---------------------------------------------------------------- swarm page

const COLUMNS = [
  ["node", "node", "text"],
  ["metadata", "model", "text"],
  ["rounds_committed", "rounds"],
  ["last_round", "last round"],
  ["rollouts_committed", "shared"],
  ["external_used", "used"],
  ["credit_received", "credit"],
  ["score", "score"],
  ["backlog", "pending"],
  ["last_seen", "last seen"],
];

const swarmState = { data: null, sortKey: "credit_received", sortDir: -1, revision: null };

function sortedNodes(nodes) {
  const { sortKey, sortDir } = swarmState;
  return [...nodes].sort((a, b) => {
    const value = (n) => (sortKey === "backlog" ? (n.backlog || {}).pending : n[sortKey]);
    const x = value(a);
    const y = value(b);
    if (x === y) return a.node < b.node ? -1 : 1;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * sortDir;
  });
}

function nodeCell(n) {
  return el("td", { class: "text", "data-col": "node", "data-value": n.node },
    el("a", { href: `/node/${n.node}`, class: "addr", title: n.node }, short(n.node)),
    n.name ? el("span", { class: "tag" }, n.name) : null);
}

function renderSwarmTable(data, previous) {
  const head = el("tr", {}, COLUMNS.map(([key, label, kind]) => {
    const th = el("th", { "data-key": key, class: kind || null, scope: "col" }, label);
    if (key === swarmState.sortKey) th.setAttribute("aria-sort", swarmState.sortDir > 0 ? "ascending" : "descending");
    th.addEventListener("click", () => {
      swarmState.sortDir = swarmState.sortKey === key ? -swarmState.sortDir : -1;
      swarmState.sortKey = key;
      renderSwarm(swarmState.data, null);
    });
    return th;
  }));
  const rows = sortedNodes(data.nodes).map((n) => {
    const before = previous ? previous.get(n.node) : undefined;
    const changed = previous && JSON.stringify(before) !== JSON.stringify(n);
    return el("tr", { "data-node": n.node, class: changed ? "fresh" : null }, COLUMNS.map(([key]) => {
      if (key === "node") return nodeCell(n);
      if (key === "metadata") return el("td", { class: "text", "data-col": key, title: n.metadata }, n.metadata.slice(0, 24));
      if (key === "last_seen") return el("td", { "data-col": key, "data-value": fmtNum(n.last_seen) }, fmtTime(n.last_seen));
      if (key === "score") return el("td", { "data-col": key, "data-value": fmtNum(n.score) }, fmtScore(n.score));
      if (key === "backlog") {
        const b = n.backlog || {};
        return el("td", { "data-col": key, "data-value": fmtNum(b.pending), "data-paused": fmtNum(b.paused),
          "data-source": fmtNum(b.source), class: b.paused ? "paused" : null, title: backlogTitle(b) }, fmtBacklog(b));
      }
      return el("td", { "data-col": key }, fmtNum(n[key]));
    }));
  });
  return el("table", { id: "nodes" }, el("thead", {}, head), el("tbody", {}, rows));
}

function usageGraph(data) {
  const W = 520, H = 380, cx = W / 2, cy = H / 2, R = Math.min(W, H) / 2 - 60;
  const nodes = data.nodes;
  const pos = new Map();
  nodes.forEach((n, i) => {
    const a = (2 * Math.PI * i) / Math.max(1, nodes.length) - Math.PI / 2;
    pos.set(n.node, [cx + R * Math.cos(a), cy + R * Math.sin(a)]);
  });
  const max = Math.max(1, ...data.usage.map((u) => u.count));
  const root = svg("svg", { id: "usage-graph", viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img",
    "aria-label": "usage graph: an arrow from producer to consumer for every consumer that trained on the producer's rollouts" });
  const defs = svg("defs");
  defs.append(svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "10", markerHeight: "10", markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" },
    svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#2d6cdf" })));
  root.append(defs);
  for (const u of data.usage) {
    const p = pos.get(u.producer), c = pos.get(u.consumer);
    if (!p || !c) continue;
    // Bend each edge to its right so that a->b and b->a do not overlap.
    const mx = (p[0] + c[0]) / 2, my = (p[1] + c[1]) / 2;
    const dx = c[0] - p[0], dy = c[1] - p[1], len = Math.hypot(dx, dy) || 1;
    const bx = mx + (dy / len) * 28, by = my - (dx / len) * 28;
    const ex = c[0] - (dx / len) * 18, ey = c[1] - (dy / len) * 18;
    const sx = p[0] + (dx / len) * 18, sy = p[1] + (dy / len) * 18;
    const g = svg("g", { class: "usage", "data-producer": u.producer, "data-consumer": u.consumer, "data-count": u.count });
    g.append(svg("title", {}, `${u.consumer} trained on ${u.count} rollouts of ${u.producer}`));
    g.append(svg("path", { class: "edge", d: `M ${sx} ${sy} Q ${bx} ${by} ${ex} ${ey}`,
      "stroke-width": 1 + (5 * u.count) / max, "marker-end": "url(#arrow)" }));
    g.append(svg("text", { x: (mx + bx) / 2, y: (my + by) / 2, "text-anchor": "middle" }, u.count));
    root.append(g);
  }
  for (const n of nodes) {
    const [x, y] = pos.get(n.node);
    const g = svg("g", { class: "node", "data-node": n.node });
    const link = svg("a", { href: `/node/${n.node}` });
    link.append(svg("circle", { cx: x, cy: y, r: 16 }));
    link.append(svg("text", { x, y: y + 4, "text-anchor": "middle" }, n.rounds_committed));
    link.append(svg("text", { x, y: y + (y < cy ? -24 : 32), "text-anchor": "middle" }, n.name || short(n.node)));
    g.append(link);
    root.append(g);
  }
  return root;
}

function renderSwarm(data, previous) {
  swarmState.data = data;
  const t = data.totals;
  const view = document.getElementById("view");
  view.replaceChildren(
    el("h2", {}, "Swarm"),
    el("p", { id: "summary" }, "Ledger ", el("code", {}, data.ledger), ` on ${data.chain}: `,
      el("b", { "data-total": "nodes" }, t.nodes), " nodes, ",
      el("b", { "data-total": "rounds_committed" }, t.rounds_committed), " commitments, ",
      el("b", { "data-total": "rollouts_committed" }, t.rollouts_committed), " rollouts shared, ",
      el("b", { "data-total": "external_used" }, t.external_used), " external rollouts trained on ",
      el("span", { class: "tag" }, "chain"),
      t.paused_for_backlog ? el("span", { class: "paused" }, " · ", el("b", { "data-total": "paused_for_backlog" }, t.paused_for_backlog),
        " paused for their commitment backlog") : null),
    el("div", { class: "card" }, renderSwarmTable(data, previous),
      el("p", { class: "muted" }, "shared: rollouts committed · used: external rollouts trained on · credit: own rollouts others trained on",
        data.has_score ? " · score: consumer rounds that used the node, weighted by each consumer's standing (docs/ledger.md)" : " · score: none yet (no usage credited)")),
    el("div", { class: "card" }, el("h3", {}, "Who trained on whose rollouts"),
      data.usage.length ? usageGraph(data) : el("p", { class: "muted", id: "usage-empty" }, "no usage credited yet"),
      el("p", { class: "muted" }, "An arrow runs from a producer to a node that trained on its rollouts, labelled with how many (UsageCredited events); a circle shows the node's committed rounds. ",
        el("span", { class: "tag" }, "chain"))),
  );
}

async function swarmPage() {
  try {
    renderSwarm(await api("/api/swarm"), null);
    clearError();
  } catch (exc) {
    document.getElementById("view").replaceChildren(el("h2", {}, "Swarm"), el("p", { class: "muted" }, "nothing to show until the ledger can be read"));
    showError(exc.message);
  }
  follow((data) => {
    clearError();
    const previous = swarmState.data ? new Map(swarmState.data.nodes.map((n) => [n.node, n])) : null;
    renderSwarm(data, previous);
  });
}

// ---------------------------------------------------------------- node page

function lineChart(id, points, label) {
  const W = 520, H = 200, P = 34;
  const root = svg("svg", { id, viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": label, "data-points": points.length });
  if (!points.length) return root;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const y0 = Math.min(0, ...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const X = (x) => P + ((x - x0) / (x1 - x0)) * (W - 2 * P);
  const Y = (y) => H - P - ((y - y0) / (y1 - y0)) * (H - 2 * P);
  root.append(svg("line", { class: "axis", x1: P, y1: H - P, x2: W - P, y2: H - P }));
  root.append(svg("line", { class: "axis", x1: P, y1: P, x2: P, y2: H - P }));
  root.append(svg("text", { x: P, y: H - 10 }, `round ${x0}`));
  root.append(svg("text", { x: W - P, y: H - 10, "text-anchor": "end" }, `round ${x1}`));
  root.append(svg("text", { x: 2, y: P - 8 }, y1.toFixed(3)));
  root.append(svg("text", { x: 2, y: H - P + 4 }, y0.toFixed(2)));
  root.append(svg("polyline", { class: "curve", points: points.map(([x, y]) => `${X(x)},${Y(y)}`).join(" ") }));
  return root;
}

function timelineChart(timeline) {
  const W = 520, H = 180, P = 30;
  const root = svg("svg", { id: "timeline-chart", viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img",
    "aria-label": "commitments by round: rollouts shared and external rollouts used", "data-points": timeline.length });
  if (!timeline.length) return root;
  const r0 = Math.min(...timeline.map((c) => c.round)), r1 = Math.max(...timeline.map((c) => c.round));
  const max = Math.max(1, ...timeline.map((c) => Math.max(c.rollouts, c.external)));
  const slot = (W - 2 * P) / (r1 - r0 + 1), bar = Math.max(1, slot / 2 - 1);
  root.append(svg("line", { class: "axis", x1: P, y1: H - P, x2: W - P, y2: H - P }));
  for (const c of timeline) {
    const x = P + (c.round - r0) * slot;
    const h1 = ((H - 2 * P) * c.rollouts) / max, h2 = ((H - 2 * P) * c.external) / max;
    const g = svg("g", { "data-round": c.round });
    g.append(svg("title", {}, `round ${c.round}: ${c.rollouts} shared, ${c.external} external, block ${c.block}, ${fmtTime(c.timestamp)}`));
    g.append(svg("rect", { class: "bar-own", x, y: H - P - h1, width: bar, height: h1 }));
    g.append(svg("rect", { class: "bar-ext", x: x + bar + 1, y: H - P - h2, width: bar, height: h2 }));
    root.append(g);
  }
  root.append(svg("text", { x: P, y: H - 10 }, `round ${r0}`));
  root.append(svg("text", { x: W - P, y: H - 10, "text-anchor": "end" }, `round ${r1}`));
  root.append(svg("text", { x: P, y: 14 }, `max ${max}`));
  return root;
}

function table(id, headers, rows) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, headers.map((h, i) => el("th", { class: i === 0 ? "text" : null }, h)))),
    el("tbody", {}, rows));
}

function pairs(id, obj, what) {
  const entries = Object.entries(obj);
  if (!entries.length) return el("p", { class: "muted", id }, `none ${what}`);
  return table(id, ["node", "rollouts"], entries.map(([k, v]) => el("tr", { "data-key": k },
    el("td", { class: "text" }, el("a", { href: `/node/${k}`, class: "addr" }, k)), el("td", {}, v))));
}

function renderNode(n) {
  const stat = (key, label, value) => el("div", { class: "stat" }, el("b", { "data-stat": key }, value), el("span", {}, label));
  const view = document.getElementById("view");
  const rounds = n.rounds.map((r) => {
    const log = r.log || {};
    return el("tr", { "data-round": r.round },
      el("td", { class: "text" }, r.round),
      el("td", { "data-col": "rollouts" }, fmtNum(r.rollouts)),
      el("td", { "data-col": "external" }, fmtNum(r.external)),
      el("td", { "data-col": "reward" }, log.reward_mean === undefined ? "–" : log.reward_mean.toFixed(3)),
      el("td", { "data-col": "received" }, fmtNum(log.groups_received)),
      el("td", { "data-col": "rejected" }, fmtNum(log.rejected)));
  });
  const rejections = Object.entries(n.rejections);
  view.replaceChildren(
    el("h2", {}, "Node ", el("code", { id: "node-address" }, n.node), n.name ? el("span", { class: "tag" }, n.name) : null),
    el("p", { class: "muted" }, n.registered ? `registered · model ${n.metadata || "–"}` : "not registered", " · last seen ", fmtTime(n.last_seen),
      n.log ? ` · log ${n.log}` : " · no round log given"),
    el("div", { class: "stats" },
      stat("rounds_committed", "rounds (chain)", n.rounds_committed),
      stat("last_round", "last round", fmtNum(n.last_round)),
      stat("rollouts_committed", "shared (chain)", n.rollouts_committed),
      stat("external_used", "used (chain)", n.external_used),
      stat("credit_received", "credit (chain)", n.credit_received),
      el("div", { class: "stat", title: n.score_detail ? `from trusted consumers ${n.score_detail.from_trusted}, standing ${n.score_detail.standing}, ${n.score_detail.consumers} consumers` : "no score" },
        el("b", { "data-stat": "score" }, fmtScore(n.score)), el("span", {}, "contribution score")),
      el("div", { class: "stat", title: backlogTitle(n.backlog) },
        el("b", { "data-stat": "backlog", class: n.backlog && n.backlog.paused ? "paused" : null }, fmtBacklog(n.backlog)),
        el("span", {}, n.backlog && n.backlog.source ? `pending commitments (${n.backlog.source})` : "pending commitments (unknown)"))),
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h3", {}, "Commitment timeline ", el("span", { class: "tag" }, "chain")),
        el("p", { class: "legend" }, el("span", {}, el("i", { style: "background:#2d6cdf" }), "rollouts shared"), el("span", {}, el("i", { style: "background:#e07b24" }), "external used")),
        timelineChart(n.timeline)),
      el("div", { class: "card" }, el("h3", {}, "Reward ", el("span", { class: "tag" }, "log")),
        n.reward_curve.length ? lineChart("reward-curve", n.reward_curve, "mean reward of the node's own completions, by round")
          : el("p", { class: "muted", id: "reward-curve-empty" }, "no round log for this node (start the explorer with --logs DIR)"))),
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h3", {}, "Rejections by reason ", el("span", { class: "tag" }, "log")),
        rejections.length ? table("rejections", ["reason", "groups"], rejections.map(([k, v]) => el("tr", { "data-reason": k }, el("td", { class: "text" }, k), el("td", {}, v))))
          : el("p", { class: "muted", id: "rejections-empty" }, n.log ? "no rejections in the log" : "no round log")),
      el("div", { class: "card" }, el("h3", {}, "Credit received, by consumer ", el("span", { class: "tag" }, "chain")), pairs("credit-by-consumer", n.credit_by_consumer, "yet"),
        el("h3", {}, "External rollouts used, by producer ", el("span", { class: "tag" }, "chain")), pairs("usage-by-producer", n.usage_by_producer, "yet"))),
    el("div", { class: "card" }, el("h3", {}, "Per-round counts"),
      table("rounds", ["round", "shared (chain)", "external (chain)", "reward (log)", "received (log)", "rejected (log)"], rounds)),
  );
}

async function nodePage(address) {
  let revision = null;
  const load = async () => {
    try {
      renderNode(await api(`/api/node/${encodeURIComponent(address)}`));
      clearError();
      return true;
    } catch (exc) {
      document.getElementById("view").replaceChildren(el("h2", {}, "Node"), el("p", { class: "muted" }, `nothing to show for ${address}`));
      showError(exc.message);
      return exc.status >= 500; // a bad address will not get better; a chain outage may
    }
  };
  if (await load()) {
    follow((data) => {
      if (data.revision !== revision) {
        revision = data.revision;
        load();
      }
    });
  }
}

// ---------------------------------------------------------------- verify page

function renderVerdict(answer) {
  const out = document.getElementById("result");
  out.replaceChildren(
    el("div", { id: "verdict", "data-included": String(answer.included) }, answer.included ? "INCLUDED" : "NOT INCLUDED"),
    el("p", { id: "verdict-message" }, answer.message),
    answer.found.length ? table("found", ["node", "round", "kind", "producer", "contract says", "proof"],
      answer.found.map((r) => el("tr", { "data-included": String(r.included) },
        el("td", { class: "text" }, el("a", { href: `/node/${r.node}`, class: "addr" }, r.node)),
        el("td", {}, r.round), el("td", {}, r.kind), el("td", { class: "addr" }, short(r.producer)),
        el("td", {}, r.included ? "included" : "not included"), el("td", {}, `${r.proof.length} siblings`)))) : null,
  );
}

function verifyPage() {
  const params = new URLSearchParams(location.search);
  const field = (id, label, value, attrs = {}) => [el("label", { for: id }, label), el("input", { id, name: id, value: value || "", ...attrs })];
  const form = el("form", { id: "verify-form", class: "card" },
    ...field("hash", "Rollout hash (0x and 64 hex digits)", params.get("hash"), { placeholder: "0x…", autocomplete: "off" }),
    el("details", { open: params.get("node") ? "" : null },
      el("summary", {}, "check a proof yourself (otherwise the explorer's journals are searched)"),
      ...field("node", "Committing node", params.get("node")),
      ...field("round", "Round", params.get("round"), { inputmode: "numeric" }),
      el("label", { for: "kind" }, "Kind"),
      el("select", { id: "kind", name: "kind" }, el("option", { value: "own" }, "own (the node shared it)"), el("option", { value: "external" }, "external (the node trained on it)")),
      el("label", { for: "proof" }, "Proof: sibling hashes, comma separated"),
      el("textarea", { id: "proof", name: "proof", rows: "3" }, params.get("proof") || "")),
    el("button", { type: "submit", id: "verify-button" }, "verify on chain"));
  if (params.get("kind")) form.querySelector("#kind").value = params.get("kind");
  document.getElementById("view").replaceChildren(el("h2", {}, "Verify a rollout's inclusion"),
    el("p", { class: "muted" }, "The contract stores Merkle roots; the answer below is the contract's own check of the inclusion proof."),
    form, el("div", { id: "result" }));
  const run = async () => {
    const hash = form.querySelector("#hash").value.trim();
    const q = new URLSearchParams();
    for (const k of ["node", "round", "kind", "proof"]) {
      const v = form.querySelector(`#${k}`).value.trim();
      if (v && (k !== "kind" || form.querySelector("#node").value.trim())) q.set(k, v);
    }
    history.replaceState(null, "", `/verify?${new URLSearchParams({ hash, ...Object.fromEntries(q) })}`);
    document.getElementById("result").replaceChildren(el("p", { class: "muted" }, "asking the contract…"));
    try {
      renderVerdict(await api(`/api/verify/${encodeURIComponent(hash || "-")}?${q}`));
      clearError();
    } catch (exc) {
      document.getElementById("result").replaceChildren();
      showError(exc.message);
    }
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); run(); });
  if (params.get("hash")) run();
  setLive("live", "on demand");
}

// ---------------------------------------------------------------- routing

function route() {
  const path = location.pathname;
  if (path === "/" || path === "") return swarmPage();
  if (path.startsWith("/node/")) return nodePage(decodeURIComponent(path.slice(6)));
  if (path === "/verify") return verifyPage();
  showError(`no page at ${path}`);
  return null;
}

document.addEventListener("DOMContentLoaded", route);
