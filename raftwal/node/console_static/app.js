// raftwal's read-only console: polls /console/state.json once a second and renders it.
// Self-contained (no libraries, no build step). Values from the cluster are only ever put
// into the page as text (textContent), never as HTML.
"use strict";

const POLL_MS = 1000;
const TIMEOUT_MS = 5000;
const STALE_MS = 5000;
const TOKEN_KEY = "raftwal-console-token";

let lastSnapshot = null;
let lastError = "";

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function badge(text, kind) {
  return el("span", text, "badge " + kind);
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return (unit === 0 ? value : value.toFixed(1)) + " " + units[unit];
}

function ago(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return ms + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  return Math.round(ms / 60000) + " min";
}

function fill(tableId, rows, render) {
  const body = document.querySelector("#" + tableId + " tbody");
  const fresh = document.createElement("tbody");
  for (const row of rows) fresh.appendChild(render(row));
  if (rows.length === 0) {
    const tr = el("tr");
    const td = el("td", "none", "empty");
    td.colSpan = document.querySelectorAll("#" + tableId + " thead th").length;
    tr.appendChild(td);
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}

function row(cells, attributes) {
  const tr = el("tr");
  for (const [name, value] of Object.entries(attributes || {})) tr.setAttribute(name, value);
  for (const cell of cells) {
    const td = el("td");
    if (cell && typeof cell === "object" && cell.node) {
      td.appendChild(cell.node);
      if (cell.className) td.className = cell.className;
    } else if (cell && typeof cell === "object" && "text" in cell) {
      td.textContent = cell.text;
      if (cell.className) td.className = cell.className;
    } else {
      td.textContent = cell === null || cell === undefined ? "" : String(cell);
    }
    tr.appendChild(td);
  }
  return tr;
}

function diskCell(m) {
  // The worst of the member's data directories against its watermarks.
  const disks = m.disks || [];
  if (!m.reachable || disks.length === 0) return "";
  const order = { ok: 0, soft: 1, hard: 2 };
  const worst = disks.reduce((a, b) => (order[b.level] > order[a.level] ? b : a));
  const kind = worst.level === "ok" ? "ok" : worst.level === "soft" ? "warn" : "bad";
  const text = (worst.level === "ok" ? "" : worst.level + " mark, ") + bytes(worst.free_bytes)
    + " free" + (m.raft_reserve_released ? ", Raft reserve in use" : "");
  return { node: badge(text, m.raft_reserve_released ? "bad" : kind), className: "disk" };
}

function renderMembers(s) {
  fill("members", s.members, (m) => {
    const down = m.state === "DOWN" || !m.reachable;
    const status = m.state === "DOWN" ? badge("DOWN", "bad")
      : !m.reachable ? badge("UNREACHABLE", "bad") : badge(m.state, "ok");
    const tr = row([
      m.node_id, m.role, { node: status, className: "state" },
      { text: m.reachable ? "yes" : "no", className: "reachable" },
      m.is_leader ? "leader" : "",
      m.reachable ? m.raft_term : "", m.reachable ? m.commit_index : "",
      m.reachable ? m.applied_index : "", m.reachable ? m.durable_index : "",
      m.reachable ? m.revision : "", m.reachable ? bytes(m.data_dir_bytes) : "",
      diskCell(m), m.grpc_address,
    ], { "data-node": m.node_id, "data-state": m.state, "data-reachable": String(m.reachable) });
    if (down) tr.className = "bad";
    return tr;
  });
}

function renderProcesses(s) {
  fill("processes", s.processes || [], (p) => {
    const name = p.kind === "worker" ? "worker " + p.index : p.kind;
    const tr = row([
      p.node_id, name, p.pid || "", { node: p.up ? badge("up", "ok") : badge("down", "bad") },
      p.cpu_seconds, bytes(p.rss_bytes), p.grpc_address, p.transfer_port || "",
      p.kind === "worker" ? p.restarts : "", p.owned_pchannels.join(", "),
      p.kind === "worker" ? p.logs : "",
    ], { "data-node": p.node_id, "data-process": name });
    if (!p.up) tr.className = "bad";
    return tr;
  });
}

function renderPChannels(s) {
  fill("pchannels", s.pchannels, (p) => {
    const replicas = p.replicas.map((r) =>
      r.node_id + (r.down ? " DOWN" : "")
        + (r.lagging_ms !== null && r.lagging_ms !== undefined ? " LAGGING " + ago(r.lagging_ms) : "")
        + " (" + (r.durable_lsn === null ? "?" : r.durable_lsn) + ")"
    ).join(", ");
    const replication = p.under_replicated
      ? badge("under-replicated " + p.live_replicas + "/" + p.wanted_replicas, "bad")
      : badge("ok", "ok");
    const wal = p.wal_alter_stage ? p.wal + " (" + p.wal_alter_stage + ")" : p.wal;
    const tr = row([
      p.name, p.state, { text: p.owner_node_id, className: "owner" }, p.term, wal, replicas,
      p.last_lsn, p.committed_lsn, p.retention_floor_lsn,
      p.committed_segments + " (" + bytes(p.committed_bytes) + ")", bytes(p.disk_bytes),
      { node: replication },
    ], { "data-pchannel": p.name, "data-owner": p.owner_node_id, "data-state": p.state });
    if (p.under_replicated) tr.className = "warn";
    if (p.state !== "ASSIGNED") tr.className = "bad";
    return tr;
  });
}

function renderRest(s) {
  fill("vchannels", s.vchannels, (v) => row([v.name, v.id, v.pchannel, v.state]));
  fill("segments", s.segments, (g) => row([
    g.pchannel, g.count, bytes(g.bytes), g.first_lsn, g.last_lsn, g.retention_floor_lsn,
    { text: g.latest.map((x) => x.first_lsn + "-" + x.last_lsn).join(" "), className: "detail" },
  ]));
  const positions = [];
  for (const sub of s.subscriptions) {
    for (const p of sub.positions) positions.push([sub, p]);
    if (sub.positions.length === 0) positions.push([sub, null]);
  }
  fill("subscriptions", positions, ([sub, p]) => row(p === null ? [sub.name] : [
    sub.name, p.vchannel, p.pchannel, p.lsn, p.lag_entries === null ? "?" : p.lag_entries,
    ago(p.lag_ms), p.member_id, p.generation || "", sub.holds_retention ? "yes" : "no",
  ]));
  fill("shards", s.shards, (h) => row([
    h.subscription, h.vchannel,
    { node: badge(h.state, h.state === "ASSIGNED" ? "ok" : "warn") },
    h.member_id, h.generation || "", h.position_lsn, h.lag_entries === null ? "?" : h.lag_entries,
  ]));
  fill("replication", s.replication, (r) => {
    const tr = row([
      r.pchannel, r.target_cluster_id + "/" + r.target_pchannel, r.state, r.node_id,
      r.source_committed_lsn, r.target_lsn, r.lag_entries, bytes(r.lag_bytes),
      r.lag_s ? r.lag_s.toFixed(1) + " s" : "0", Math.round(r.apply_rate_entries_s),
      Math.round(r.commit_rate_entries_s), r.inflight_batches + " (" + bytes(r.inflight_bytes) + ")",
      { node: r.keeping_up ? badge("yes", "ok") : badge("no", "bad") },
    ], { "data-pchannel": r.pchannel, "data-target": r.target_cluster_id });
    if (!r.keeping_up) tr.className = "bad";
    return tr;
  });
  fill("events", s.events, (e) => row([
    e.revision, new Date(e.time_ms).toLocaleTimeString(), e.kind,
    { text: e.summary, className: "detail" },
  ]));
}

function renderSummary(s) {
  const summary = document.getElementById("summary");
  summary.replaceChildren();
  const c = s.counts;
  const items = [
    ["leader", s.leader_node_id || "NONE"], ["revision", s.revision],
    ["nodes", c.nodes], ["pchannels", c.pchannels], ["vchannels", c.vchannels],
    ["subscriptions", c.subscriptions], ["leases", c.leases], ["locks", c.locks],
    ["pending broadcasts", c.pending_broadcasts],
  ];
  for (const [name, value] of items) {
    const span = el("span");
    span.appendChild(el("b", name + ": "));
    span.appendChild(document.createTextNode(String(value)));
    summary.appendChild(span);
  }
  const warnings = document.getElementById("warnings");
  warnings.replaceChildren(...s.warnings.map((w) => el("li", w)));
  const cut = Object.keys(s.truncated || {});
  if (cut.length) warnings.appendChild(el("li", "tables cut short: " + cut.join(", ")));
}

function render(s) {
  renderSummary(s);
  renderMembers(s);
  renderProcesses(s);
  renderPChannels(s);
  renderRest(s);
}

function showFreshness() {
  const box = document.getElementById("freshness");
  if (!lastSnapshot) {
    box.textContent = lastError || "connecting…";
    box.className = "freshness" + (lastError ? " stale" : "");
    return;
  }
  const age = Date.now() - lastSnapshot.generated_at_ms;
  const when = new Date(lastSnapshot.generated_at_ms).toLocaleTimeString();
  let text = "data from " + lastSnapshot.answered_by + " at " + when + " (" + ago(Math.max(0, age)) + " ago)";
  if (lastError) text += " · " + lastError;
  box.textContent = text;
  box.className = "freshness" + (age > STALE_MS || lastError ? " stale" : "");
  box.dataset.ageMs = String(age);
}

async function poll() {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = "Bearer " + token;
  try {
    const response = await fetch("/console/state.json", { headers, signal: controller.signal, cache: "no-store" });
    const body = await response.json();
    if (response.status === 401 || response.status === 403) {
      document.getElementById("token-form").hidden = false;
      document.getElementById("token-error").textContent = body.error || "refused";
      lastError = "a token with a read role is needed";
    } else if (!response.ok) {
      lastError = body.error || ("HTTP " + response.status);
    } else {
      document.getElementById("token-form").hidden = true;
      lastSnapshot = body;
      lastError = "";
      render(body);
    }
  } catch (error) {
    lastError = "this node does not answer (" + (error.name === "AbortError" ? "timeout" : error.message) + ")";
  } finally {
    clearTimeout(timer);
    showFreshness();
    setTimeout(poll, POLL_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    document.getElementById("token").value = "";
  });
  setInterval(showFreshness, 1000);
  poll();
});
