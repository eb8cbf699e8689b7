// runcell's operator console: polls GET /v1/admin/overview every 2 s and shows it; approves
// or denies runs waiting for network (POST /v1/approvals/{id}).
//
// Everything shown is text a client chose (key ids, languages, destinations): it is only ever
// written with textContent or as attribute values, never parsed as markup. The admin key lives
// in this tab's sessionStorage and goes out as an Authorization header (no cookies).
"use strict";

(function () {
  const KEY_STORE = "runcell-console-key";
  const TAB_STORE = "runcell-console-tab";
  const POLL_MS = 2000;
  const SAMPLES = 60;
  const SVG = "http://www.w3.org/2000/svg";

  let key = sessionStorage.getItem(KEY_STORE);
  let timer = null;
  let samples = [];
  let previousTotals = null;
  const drawn = {};

  const $ = (id) => document.getElementById(id);

  // An element with attributes and children (strings become text nodes).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  function clock(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toLocaleTimeString([], { hour12: false });
  }

  function stamp(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    if (isNaN(d)) return String(iso);
    const today = new Date().toDateString() === d.toDateString();
    return today ? clock(iso) : d.toLocaleString([], { hour12: false });
  }

  function seconds(s) {
    if (s === null || s === undefined) return "";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 120) return s.toFixed(s < 10 ? 2 : 1) + " s";
    return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  }

  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i++;
    }
    return (i ? n.toFixed(1) : n) + " " + units[i];
  }

  function keyCell(id) {
    return id === null || id === undefined ? el("span", { class: "muted" }, "(no key)") : el("span", { class: "key" }, id);
  }

  function hash(h) {
    return el("code", { class: "hash", title: h }, String(h || "").slice(0, 16));
  }

  function status(text, kind) {
    const s = $("status");
    s.textContent = text;
    s.className = "status " + (kind || "");
  }

  async function api(path, options) {
    const headers = { Accept: "application/json" };
    if (key) headers.Authorization = "Bearer " + key;
    if (options && options.body) headers["Content-Type"] = "application/json";
    const res = await fetch(path, {
      method: (options && options.method) || "GET",
      headers,
      body: options && options.body,
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
    let body = null;
    try {
      body = await res.json();
    } catch (_) {
      body = null;
    }
    return { status: res.status, body };
  }

  function errorText(r) {
    const e = r.body && r.body.error;
    return e && e.message ? e.message : "HTTP " + r.status;
  }

  // ---- Signing in and out ----

  function showLogin(message) {
    if (timer) clearTimeout(timer);
    timer = null;
    $("app").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    status("");
    $("key").value = "";
    $("key").focus();
  }

  function refusal(r) {
    if (r.status === 401) return "This key is not valid here.";
    if (r.status === 403) return "This key is not an admin key: the console needs one (admin = true in its [[api_keys]] entry, or --admin-key).";
    return "The server answered: " + errorText(r);
  }

  async function open(candidate) {
    key = candidate;
    $("login-button").disabled = true;
    let r;
    try {
      r = await api("/v1/admin/overview");
    } catch (e) {
      r = { status: 0, body: null };
    }
    $("login-button").disabled = false;
    if (r.status !== 200) {
      key = null;
      sessionStorage.removeItem(KEY_STORE);
      showLogin(r.status === 0 ? "The server cannot be reached." : refusal(r));
      return;
    }
    sessionStorage.setItem(KEY_STORE, candidate);
    $("login").hidden = true;
    $("app").hidden = false;
    $("logout").hidden = false;
    samples = [];
    previousTotals = null;
    for (const k of Object.keys(drawn)) delete drawn[k];
    render(r.body);
    schedule();
  }

  function schedule() {
    if (timer) clearTimeout(timer);
    timer = setTimeout(poll, POLL_MS);
  }

  async function poll() {
    timer = null;
    let r;
    try {
      r = await api("/v1/admin/overview");
    } catch (e) {
      status("Connection lost; retrying", "bad");
      schedule();
      return;
    }
    if (r.status === 401 || r.status === 403) {
      sessionStorage.removeItem(KEY_STORE);
      key = null;
      showLogin(refusal(r));
      return;
    }
    if (r.status !== 200) {
      status("The server answered: " + errorText(r), "bad");
    } else {
      render(r.body);
    }
    schedule();
  }

  // ---- Tables ----

  // Replaces a table's rows when its data changed (so that a button being clicked is not
  // replaced under the pointer by an identical one).
  function fill(id, items, signature, row) {
    const sig = JSON.stringify(items.map(signature));
    const empty = document.querySelector('[data-empty-for="' + id + '"]');
    if (empty) empty.hidden = items.length > 0;
    $(id).hidden = items.length === 0;
    if (drawn[id] === sig) return;
    drawn[id] = sig;
    $(id).tBodies[0].replaceChildren(...items.map(row));
  }

  function cells(...values) {
    return values.map((v) => (v instanceof Node ? el("td", {}, v) : el("td", {}, v === null || v === undefined ? "" : v)));
  }

  function num(v) {
    return el("td", { class: "num" }, v === null || v === undefined ? "" : String(v));
  }

  async function decide(id, decision, buttons) {
    buttons.forEach((b) => (b.disabled = true));
    $("decision-error").textContent = "";
    let r;
    try {
      r = await api("/v1/approvals/" + encodeURIComponent(id), {
        method: "POST",
        body: JSON.stringify({ decision }),
      });
    } catch (e) {
      r = { status: 0, body: null };
    }
    if (r.status !== 200) {
      $("decision-error").textContent = "Could not " + decision + ": " + (r.status === 0 ? "the server cannot be reached." : errorText(r));
      buttons.forEach((b) => (b.disabled = false));
    }
    if (!timer) return;
    clearTimeout(timer);
    poll();
  }

  function approvalRow(a) {
    const approve = el("button", { type: "button", class: "approve" }, "Approve");
    const deny = el("button", { type: "button", class: "deny danger" }, "Deny");
    approve.addEventListener("click", () => decide(a.id, "approve", [approve, deny]));
    deny.addEventListener("click", () => decide(a.id, "deny", [approve, deny]));
    const dests = el("ul", { class: "plain" }, ...(a.destinations || []).map((d) => el("li", {}, el("code", {}, d))));
    return el(
      "tr",
      { "data-id": a.id },
      ...cells(clock(a.requested_at), keyCell(a.key_id), a.language, dests, el("span", {}, hash(a.code_sha256), " ", el("span", { class: "muted" }, bytes(a.code_bytes))), clock(a.expires_at)),
      el("td", { class: "actions" }, approve, deny)
    );
  }

  function stateTag(state, busy) {
    const kind = state === "paused" ? "paused" : busy ? "busy" : "ok";
    return el("span", { class: "tag " + kind }, busy && state !== "paused" ? "running a call" : state);
  }

  function outcome(category) {
    return el("span", { class: "tag " + (category === "ok" ? "ok" : "bad") }, category);
  }

  function render(o) {
    status("Live · runcell " + o.version + (o.commit && o.commit !== "unknown" ? " (" + o.commit.slice(0, 12) + ")" : "") + " · " + clock(o.time), "good");
    $("badge-approvals").textContent = o.approvals.length ? String(o.approvals.length) : "";
    $("badge-sandboxes").textContent = o.runs.length ? String(o.runs.length) : "";
    $("badge-sessions").textContent = o.sessions.length ? String(o.sessions.length) : "";

    fill("approvals", o.approvals, (a) => [a.id, a.expires_at], approvalRow);

    fill(
      "sandboxes",
      o.runs,
      (r) => [r.request_id, r.kind, r.elapsed_seconds],
      (r) => el("tr", { "data-request-id": r.request_id }, ...cells(el("span", { class: "tag" }, r.kind), r.language, keyCell(r.key_id), r.session_id ? el("code", {}, r.session_id) : "", el("code", { class: "muted" }, r.request_id), clock(r.started_at)), num(seconds(r.elapsed_seconds)))
    );

    fill(
      "sessions",
      o.sessions,
      (s) => [s.id, s.key_id, s.state, s.busy, s.last_used_at, s.execution_count, s.expires_at],
      (s) => el("tr", { "data-id": s.id }, ...cells(el("code", {}, s.id), keyCell(s.key_id), s.language, stateTag(s.state, s.busy), stamp(s.created_at), stamp(s.last_used_at)), num(s.execution_count), el("td", {}, stamp(s.expires_at)))
    );

    fill(
      "recent",
      o.recent_runs,
      (r) => [r.request_id, r.time, r.category],
      (r) =>
        el(
          "tr",
          { "data-request-id": r.request_id, "data-sha256": r.code_sha256 },
          ...cells(stamp(r.time), keyCell(r.key_id), r.interface, r.language, outcome(r.category)),
          num(r.exit_code),
          num(seconds(r.duration_seconds)),
          el("td", {}, hash(r.code_sha256)),
          el("td", {}, el("code", { class: "muted" }, r.request_id))
        )
    );

    fill(
      "pool",
      o.pool,
      (p) => [p.language, p.target, p.ready, p.hits, p.misses, p.refills, p.refill_failures],
      (p) => el("tr", {}, el("td", {}, p.language), num(p.target), num(p.ready), num(p.hits), num(p.misses), num(p.refills), num(p.refills ? seconds(p.refill_seconds / p.refills) : ""), num(p.refill_failures))
    );

    const t = o.templates;
    figures("templates", [
      ["Live", t.live],
      ["Failed (retrying)", t.failed],
      ["Starts", t.starts],
      ["Failed starts", t.start_failures],
      ["Forks", t.forks],
      ["Failed forks", t.fork_failures],
      ["Mean fork", t.mean_fork_seconds === null || t.mean_fork_seconds === undefined ? "–" : seconds(t.mean_fork_seconds)],
    ]);

    const m = o.metrics;
    const sum = (obj) => Object.values(obj || {}).reduce((a, b) => a + b, 0);
    figures("figures", [
      ["Sandboxes running", m.sandboxes_running + " / " + m.max_concurrent],
      ["Queue depth", m.queue_depth + " / " + m.max_queue],
      ["Live sessions", m.sessions],
      ["Waiting for approval", m.approvals_waiting],
      ["Memory held", bytes(m.memory_held_bytes)],
      ["Runs", sum(m.executions)],
      ["Refused", sum(m.rejections)],
      ["Connections allowed / refused", m.network_connections_allowed + " / " + m.network_connections_refused],
      ["Sessions created / expired / deleted", m.sessions_created + " / " + m.sessions_expired + " / " + m.sessions_deleted],
    ]);
    const counts = (obj) => Object.entries(obj || {}).sort((a, b) => b[1] - a[1]);
    fill("executions", counts(m.executions), (e) => e, (e) => el("tr", {}, el("td", {}, outcome(e[0])), num(e[1])));
    fill("rejections", counts(m.rejections), (e) => e, (e) => el("tr", {}, el("td", {}, e[0]), num(e[1])));

    const totals = { runs: sum(m.executions), refused: sum(m.rejections) };
    samples.push({
      running: m.sandboxes_running,
      queue: m.queue_depth,
      sessions: m.sessions,
      approvals: m.approvals_waiting,
      memory: m.memory_held_bytes / (1024 * 1024),
      runs: previousTotals ? Math.max(0, totals.runs - previousTotals.runs) : 0,
      refused: previousTotals ? Math.max(0, totals.refused - previousTotals.refused) : 0,
    });
    previousTotals = totals;
    if (samples.length > SAMPLES) samples.shift();
    charts();
    $("footer").textContent = "Recent runs keep the last 200 audit records of this server. Polling every 2 s.";
  }

  function figures(id, pairs) {
    const dl = $(id);
    dl.replaceChildren(...pairs.flatMap(([k, v]) => [el("div", { class: "figure" }, el("dt", {}, k), el("dd", {}, String(v)))]));
  }

  // ---- Sparklines ----

  const CHARTS = [
    ["running", "Sandboxes running", (v) => String(v)],
    ["queue", "Queue depth", (v) => String(v)],
    ["sessions", "Live sessions", (v) => String(v)],
    ["approvals", "Waiting for approval", (v) => String(v)],
    ["runs", "Runs since the sample before", (v) => String(v)],
    ["refused", "Refused since the sample before", (v) => String(v)],
    ["memory", "Memory held (MiB)", (v) => v.toFixed(0)],
  ];

  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    return e;
  }

  function sparkline(values) {
    const w = 240;
    const h = 48;
    const pad = 3;
    const max = Math.max(1, ...values);
    const step = (w - 2 * pad) / (SAMPLES - 1);
    const x0 = w - pad - step * (values.length - 1);
    const pts = values.map((v, i) => [x0 + i * step, h - pad - (v / max) * (h - 2 * pad)]);
    const s = svg("svg", { viewBox: "0 0 " + w + " " + h, width: w, height: h, class: "spark", role: "img" });
    s.append(svg("line", { x1: pad, y1: h - pad, x2: w - pad, y2: h - pad, class: "axis" }));
    if (pts.length > 1) {
      const line = pts.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ");
      const area = line + " " + pts[pts.length - 1][0].toFixed(1) + "," + (h - pad) + " " + pts[0][0].toFixed(1) + "," + (h - pad);
      s.append(svg("polygon", { points: area, class: "area" }));
      s.append(svg("polyline", { points: line, class: "line" }));
    }
    const last = pts[pts.length - 1];
    if (last) s.append(svg("circle", { cx: last[0].toFixed(1), cy: last[1].toFixed(1), r: 2.5, class: "dot" }));
    return s;
  }

  function charts() {
    const box = $("charts");
    box.replaceChildren(
      ...CHARTS.map(([field, title, fmt]) => {
        const values = samples.map((s) => s[field]);
        const now = values.length ? values[values.length - 1] : 0;
        const max = values.length ? Math.max(...values) : 0;
        return el(
          "div",
          { class: "chart", "data-chart": field },
          el("div", { class: "chart-head" }, el("span", {}, title), el("strong", {}, fmt(now))),
          sparkline(values),
          el("div", { class: "muted small" }, "max " + fmt(max) + " over " + values.length + " samples")
        );
      })
    );
  }

  // ---- Tabs ----

  function showTab(name) {
    for (const b of document.querySelectorAll("#tabs button")) {
      const on = b.dataset.tab === name;
      b.classList.toggle("active", on);
      b.setAttribute("aria-selected", on ? "true" : "false");
    }
    for (const s of document.querySelectorAll("section.tab")) s.hidden = s.id !== "tab-" + name;
    sessionStorage.setItem(TAB_STORE, name);
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => showTab(b.dataset.tab));
    showTab(sessionStorage.getItem(TAB_STORE) || "approvals");
    $("login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      open($("key").value.trim());
    });
    $("logout").addEventListener("click", () => {
      sessionStorage.removeItem(KEY_STORE);
      key = null;
      showLogin("");
    });
    if (key !== null) open(key);
    else showLogin("");
  });
})();
