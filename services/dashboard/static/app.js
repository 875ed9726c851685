// shardlog's cluster page: polls /api/snapshot every second and redraws with the DOM (no framework,
// nothing loaded from outside).  Every element a test reads has a stable id or data-* attribute.
"use strict";

const POLL_MS = 1000;
const PALETTE = ["#3f6fd8", "#e07b39", "#3aa76d", "#b648a8", "#c9a227", "#2bb0c4", "#d9534f", "#7a5cc7", "#6d8a2e", "#8c6d52"];
const DASH = "—";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v;
    else if (k === "style") e.setAttribute("style", v);
    else e.setAttribute(k, String(v));
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c === null || c === undefined ? "" : String(c)));
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function link(href, text) {
  return el("a", { href, target: "_blank", rel: "noopener", class: "traces" }, text || "traces");
}

function bytes(n) {
  if (n === null || n === undefined) return DASH;
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function num(n, digits) {
  if (n === null || n === undefined || Number.isNaN(n)) return DASH;
  return digits === undefined ? Number(n).toLocaleString("en") : Number(n).toFixed(digits);
}

function colours(shards) {
  const out = {};
  shards.forEach((s, i) => { out[s.id] = PALETTE[i % PALETTE.length]; });
  return out;
}

// ------------------------------------------------------------------ shards

function figuresOf(snap, kind, name) {
  const block = (snap.figures || {})[kind] || {};
  return block[name] || null;
}

function renderShards(snap, colour) {
  const body = document.querySelector("#shards tbody");
  body.replaceChildren(...snap.shards.map((s) => {
    const f = figuresOf(snap, "shards", s.id);
    return el("tr", {
      class: "shard", "data-shard": s.id, "data-chunks": s.chunks, "data-documents": s.documents ?? "",
      "data-size": s.dataSizeBytes ?? "", "data-draining": s.draining, "data-answering": s.answering,
    },
      el("td", {}, el("span", { class: "swatch", style: `background:${colour[s.id]}` }), " ", s.id),
      el("td", { class: "num size" }, bytes(s.dataSizeBytes)),
      el("td", { class: "num documents" }, num(s.documents)),
      el("td", { class: "num chunks" }, num(s.chunks)),
      el("td", { class: s.draining ? "draining" : (s.answering ? "" : "unknown") }, s.draining ? "draining" : (s.answering ? "up" : "unknown")),
      el("td", {}, s.zones.join(", ")),
      el("td", { class: "num ops" }, f ? num(f.opsPerSec, 1) : DASH),
      el("td", { class: "num p50" }, f ? `${num(f.p50Ms, 1)} ms` : DASH),
      el("td", { class: "num p99" }, f ? `${num(f.p99Ms, 1)} ms` : DASH),
      el("td", {}, link(s.traces)),
    );
  }));
  renderBars(snap.shards, colour);
}

// Three groups of bars (data size, documents, chunks), one bar per shard, each scaled to its group's max.
function renderBars(shards, colour) {
  const chart = document.getElementById("shard-bars");
  const metrics = [["dataSizeBytes", "data size", bytes], ["documents", "documents", num], ["chunks", "chunks", num]];
  const W = chart.clientWidth || 600, H = 150, top = 14, bottom = 20;
  const groupW = W / metrics.length, barW = Math.max(4, Math.min(40, (groupW - 20) / Math.max(1, shards.length)));
  const nodes = [];
  metrics.forEach(([key, label, fmt], g) => {
    const max = Math.max(1, ...shards.map((s) => s[key] || 0));
    const x0 = g * groupW + (groupW - barW * shards.length) / 2;
    nodes.push(svg("text", { x: g * groupW + groupW / 2, y: H - 4, "text-anchor": "middle" }, label));
    shards.forEach((s, i) => {
      const v = s[key];
      const h = v === null || v === undefined ? 0 : ((H - top - bottom) * v) / max;
      const bar = svg("rect", {
        x: x0 + i * barW + 1, y: H - bottom - h, width: barW - 2, height: h, fill: colour[s.id],
        "data-shard": s.id, "data-metric": key, "data-value": v ?? "",
      });
      bar.append(svg("title", {}, `${s.id} ${label}: ${fmt(v)}`));
      nodes.push(bar, svg("text", { x: x0 + i * barW + barW / 2, y: H - bottom - h - 3, "text-anchor": "middle", class: "value" }, fmt(v)));
    });
  });
  chart.replaceChildren(...nodes);
}

// ------------------------------------------------------------------ collections

function renderLegend(snap, colour) {
  document.getElementById("legend").replaceChildren(
    ...snap.shards.map((s) => el("li", { "data-shard": s.id }, el("span", { class: "swatch", style: `background:${colour[s.id]}` }), s.id)),
    el("li", { class: "jumbo-key" }, el("span", { class: "swatch jumbo" }), "jumbo"),
    el("li", { class: "zone-key" }, el("span", { class: "swatch zone" }), "zone range"),
  );
}

// The placement at a past second (null: now): the slider under the legend sets it.
let placementAt = null;
let lastSnap = null;

function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString();
}

// A chunk's owner at the end of second `at`: its history is newest first, as config.chunks keeps it.
function ownerAt(ch, at) {
  if (at === null) return ch.shard;
  const h = (ch.history || []).find((e) => e.validAfter[0] <= at);
  return h ? h.shard : null;
}

function renderPlacement(snap) {
  const slider = document.getElementById("placement-at");
  const oldest = snap.collections.map((c) => c.historyFrom[0]).filter((t) => t > 0);
  const now = Math.floor(snap.at);
  slider.min = String(oldest.length ? Math.min(...oldest) : now);
  slider.max = String(now);
  if (placementAt === null) slider.value = String(now);
  const box = document.getElementById("placement");
  box.dataset.past = String(placementAt !== null);
  document.getElementById("placement-label").textContent = placementAt === null ? "now" : clock(placementAt);
}

document.getElementById("placement-at").addEventListener("input", (e) => {
  const at = Number(e.target.value);
  placementAt = at >= Number(e.target.max) ? null : at;
  if (lastSnap) render(lastSnap);
});
document.getElementById("placement-now").addEventListener("click", () => {
  placementAt = null;
  if (lastSnap) render(lastSnap);
});

function renderCollections(snap, colour) {
  const box = document.getElementById("collections");
  if (!snap.collections.length) {
    box.replaceChildren(el("p", { class: "dim" }, "no sharded collection"));
    return;
  }
  box.replaceChildren(...snap.collections.map((c) => {
    const n = c.chunks.length;
    const f = figuresOf(snap, "collections", c.ns);
    const zones = el("div", { class: "zones" }, ...c.zones.filter((z) => z.chunks).map((z) => el("div", {
      class: "zone-mark", "data-zone": z.zone, title: `zone ${z.zone}: ${z.min} -->> ${z.max}`,
      style: `left:${(100 * z.chunks[0]) / n}%;width:${(100 * (z.chunks[1] - z.chunks[0] + 1)) / n}%`,
    }, z.zone)));
    const strip = el("div", { class: "strip", "data-chunks": n }, ...c.chunks.map((ch, i) => {
      const owner = ownerAt(ch, placementAt); // the shard now, or at the slider's second
      return el("div", {
        class: ch.jumbo ? "chunk jumbo" : "chunk", "data-index": i, "data-shard": ch.shard, "data-jumbo": ch.jumbo,
        "data-zone": ch.zone ?? "", "data-shard-at": owner ?? "", style: `background-color:${colour[owner] || "#999"}`,
        title: `${ch.min} -->> ${ch.max} on ${ch.shard}${ch.jumbo ? " (jumbo)" : ""}${ch.zone ? ` zone ${ch.zone}` : ""}` +
          (ch.documents === null ? "" : `: ${num(ch.documents)} documents, ${bytes(ch.dataSizeBytes)}`) +
          (placementAt === null ? "" : `\nat ${clock(placementAt)}: ${owner ?? "before the retained history"}`) +
          (ch.history || []).map((h) => `\n${h.shard} since ${clock(h.validAfter[0])}`).join(""),
      });
    }));
    const per = Object.entries(c.chunksPerShard).map(([s, k]) => `${s}: ${k}`).join(", ");
    return el("div", { class: "collection", "data-ns": c.ns },
      el("h3", {}, c.ns, " ", el("span", { class: "dim" }, `key ${c.keyShell || JSON.stringify(c.key)} · ${n} chunks (${per})`),
        c.balancerEnabled ? "" : el("span", { class: "draining" }, " · balancing off"),
        c.allowMigrations ? "" : el("span", { class: "draining" }, " · migrations stopped"),
        " ", el("span", { class: "dim" }, f ? `${num(f.opsPerSec, 1)} ops/s` : ""), " ", link(c.traces)),
      zones, strip);
  }));
}

// ------------------------------------------------------------------ migrations

function renderMigrations(snap) {
  const box = document.getElementById("migrations");
  if (!snap.migrations.length) {
    box.replaceChildren(el("p", { class: "dim", id: "no-migrations" }, "none"));
    return;
  }
  box.replaceChildren(...snap.migrations.map((m) => {
    const pct = m.fraction === null ? null : Math.round(100 * m.fraction);
    const range = m.kind === "primary" ? "movePrimary" : `${m.min} -->> ${m.max ?? "…"}`;
    return el("div", {
      class: "migration", "data-id": m.id, "data-ns": m.ns, "data-phase": m.phase,
      "data-cloned": m.documentsCloned ?? "", "data-bytes": m.bytesCloned ?? "", "data-fraction": m.fraction ?? "",
    },
      el("div", {}, el("strong", {}, m.ns), ` ${range} · ${m.donor} → ${m.recipient} · `,
        el("span", { class: m.phase === "unknown" ? "phase unknown" : "phase" }, m.phase), " ", link(m.traces)),
      el("div", { class: "dim progress-text" },
        `${num(m.documentsCloned)} documents (${bytes(m.bytesCloned)}) cloned` +
        (m.documentsInRange === null ? "" : ` of ~${num(m.documentsInRange)}`) + `, ${num(m.mods)} modifications` +
        (pct === null ? "" : ` · ${pct}%`)),
      el("div", { class: "bar" }, el("div", { style: `width:${pct ?? 0}%` })),
    );
  }));
}

// ------------------------------------------------------------------ balancer

function renderBalancer(snap) {
  const b = snap.balancer;
  const box = document.getElementById("balancer");
  box.setAttribute("data-enabled", b.enabled);
  box.setAttribute("data-mode", b.mode);
  box.setAttribute("data-answering", b.answering);
  const w = b.window ? `${b.window.start}–${b.window.stop} ${b.window.timeZone}` : "none: any time";
  const inWindow = b.inWindow === null ? "unknown" : (b.inWindow ? "inside" : "outside");
  const rows = [
    ["state", `${b.enabled ? "on" : "off"} (mode ${b.mode})`], ["window", `${w} (${inWindow})`],
    ["round", b.round ?? "unknown"], ["now", b.activity ?? (b.answering ? DASH : "unknown: the balancer did not answer")],
  ];
  const dl = el("dl", {}, ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k }, v)]));
  const notCompliant = Object.entries(b.notCompliant || {}).map(([ns, why]) => el("li", { class: "not-compliant" }, `${ns}: ${[].concat(why).join(", ")}`));
  const inFlight = (b.inFlight || []).map((a) => el("li", { class: "in-flight", "data-kind": a.kind },
    `${a.kind} ${a.ns || ""} ${a.from || a.donor || ""}${a.to || a.recipient ? " → " + (a.to || a.recipient) : ""}${a.reason ? ` (${a.reason})` : ""} · round ${a.round}`));
  const rounds = (b.rounds || []).map((r) => el("li", { "data-round": r.round },
    `round ${r.round}${r.at ? " at " + new Date(r.at * 1000).toLocaleTimeString() : ""}: ` +
    `${r.summary.splits ?? 0} split(s), ${r.summary.migrations ?? 0} migration(s)` +
    (r.summary.failed ? `, ${r.summary.failed} failed` : "") +
    ((r.summary.reasons || []).length ? ` · because ${r.summary.reasons.join(", ")}` : "")));
  const failures = (b.recentFailures || []).map((f) => el("li", { class: "failure" }, `${f.kind} ${f.ns || ""}: ${f.code || ""} ${f.error || ""}`));
  box.replaceChildren(
    dl,
    el("div", {}, "last rounds ", link(b.traces)),
    el("ul", { id: "balancer-rounds" }, ...(rounds.length ? rounds : [el("li", { class: "dim" }, "none seen yet")])),
    ...(inFlight.length ? [el("div", {}, "in flight"), el("ul", { id: "balancer-in-flight" }, ...inFlight)] : []),
    ...(notCompliant.length ? [el("div", {}, "not compliant"), el("ul", {}, ...notCompliant)] : []),
    ...(failures.length ? [el("div", {}, "recent failures"), el("ul", {}, ...failures)] : []),
  );
}

// ------------------------------------------------------------------ range deletions

function renderRangeDeletions(snap) {
  const rd = snap.rangeDeletions;
  const rows = rd.tasks.map((t) => el("tr", { class: "range-deletion", "data-id": t.id, "data-shard": t.shard, "data-state": t.state },
    el("td", {}, t.shard), el("td", {}, t.ns), el("td", {}, `${t.min} -->> ${t.max}`), el("td", {}, t.state),
    el("td", { class: "num" }, num(t.left)), el("td", { class: "wrap" }, t.waiting || "deleting now")));
  const unknown = rd.unanswered.map((s) => el("tr", { class: "unknown", "data-shard": s }, el("td", {}, s), el("td", { colspan: 5 }, "unknown: the shard did not answer")));
  const all = [...rows, ...unknown];
  document.querySelector("#range-deletions tbody").replaceChildren(...(all.length ? all : [el("tr", {}, el("td", { colspan: 6, class: "dim" }, "none"))]));
}

// ------------------------------------------------------------------ figures (services/dashboard/figures.py)

function renderFigures(snap) {
  const f = snap.figures || {};
  const rows = [];
  for (const [kind, label] of [["shards", "shard"], ["collections", "collection"], ["routers", "router"]]) {
    for (const [name, v] of Object.entries(f[kind] || {})) {
      const traces = kind === "shards" ? (snap.shards.find((s) => s.id === name) || {}).traces
        : kind === "collections" ? (snap.collections.find((c) => c.ns === name) || {}).traces : null;
      rows.push(el("tr", { class: "figure", "data-kind": label, "data-name": name, "data-ops": v.opsPerSec ?? "" },
        el("td", {}, `${label} ${name}`), el("td", { class: "num ops" }, num(v.opsPerSec, 1)),
        el("td", { class: "num p50" }, `${num(v.p50Ms, 1)} ms`), el("td", { class: "num p99" }, `${num(v.p99Ms, 1)} ms`),
        el("td", {}, traces ? link(traces) : "")));
    }
  }
  const none = el("tr", {}, el("td", { class: "dim", colspan: 5 }, f.error ? `${DASH} (${f.error})` : `${DASH} (no figures yet)`));
  document.querySelector("#figures tbody").replaceChildren(...(rows.length ? rows : [none]));
}

// ------------------------------------------------------------------ the loop

function render(snap) {
  document.getElementById("cluster-name").textContent = snap.cluster || "";
  const errors = Object.entries(snap.errors || {});
  const box = document.getElementById("errors");
  box.hidden = !errors.length;
  box.replaceChildren(...errors.map(([part, why]) => el("div", { "data-part": part }, `${part}: ${why}`)));
  if (!snap.shards) return; // the snapshot itself failed: the error says why
  const colour = colours(snap.shards);
  if (snap.tracing) document.getElementById("tracing-link").setAttribute("href", snap.tracing);
  renderShards(snap, colour);
  lastSnap = snap;
  renderLegend(snap, colour);
  renderPlacement(snap);
  renderCollections(snap, colour);
  renderMigrations(snap);
  renderBalancer(snap);
  renderRangeDeletions(snap);
  renderFigures(snap);
  const status = document.getElementById("status");
  status.textContent = `ConfigTime ${snap.configTime} · ${new Date(snap.at * 1000).toLocaleTimeString()}`;
  status.className = "dim";
}

async function poll() {
  try {
    const r = await fetch("/api/snapshot", { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes) + 1);
  } catch (e) {
    const status = document.getElementById("status");
    status.textContent = `cannot reach the dashboard: ${e.message}`;
    status.className = "unknown";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
