"""The coordinator's status page, ``GET /ui``: one static HTML file whose script reads the JSON
API with the token (typed into the form, or given once as ``/ui#token=...[&job=ID]``; kept in the tab's
sessionStorage and sent as the bearer token; with ``--public-read`` none is needed). Without
the token it shows no data. Refreshed every 2 seconds, it shows:

* the cluster (when a policy runs, ``/v1/cluster``): its nodes and their GPUs or slots in use,
  GPU utilization over time (``/v1/cluster/utilization``, a chart), the users' tickets and shares
  (``/v1/cluster/users``);
* the running jobs with their placements and interleaving groups (Muri; measured against eq. 3),
  the queue (waiting and preempted jobs, with why), and the ended jobs;
* every job the coordinator knows (``/v1/jobs``: etrun jobs too);
* a page per job (click one): its stage profile (a bar chart), its step rate over time
  (``/v1/cluster/jobs/{id}/steps``, a chart), its starts, restarts and their reasons (its
  events), its log tail (``.../logs``), its datasets and each worker's resource use.

The page holds no data itself, so serving it needs no token. Charts are inline SVG; the page
loads nothing from elsewhere. Its script and style are files of their own (``/ui/app.js``,
``/ui/app.css``) so that the page's Content-Security-Policy forbids every inline script: text a
job prints that slipped into the HTML could not run. Every value from the API is escaped before it
joins the HTML (``esc``)."""

PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>elastictrain</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/ui/app.css">
</head><body>
<h1>elastictrain coordinator</h1>
<form id="login">token <input id="token" type="password" autocomplete="current-password"
placeholder="paste the coordinator's token (not needed with --public-read)">
<button id="save">use</button> <span id="err"></span></form>
<h2>Cluster</h2><div id="cluster" class="muted">-</div>
<h2>Scheduled jobs</h2><div id="queue" class="muted">-</div>
<h2>Interleaving groups</h2><div id="groups" class="muted">-</div>
<h2>Other jobs (etrun)</h2><div id="jobs" class="muted">loading...</div>
<h2 id="jobtitle">Job</h2><div id="job" class="muted">click a job above</div>
<script src="/ui/app.js"></script></body></html>
"""

APP_CSS = b"""body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .4em} h2{font-size:1.05em;margin:1.2em 0 .3em} h3{font-size:.95em;margin:.8em 0 .2em}
table{border-collapse:collapse;margin:.2em 0} td,th{border-bottom:1px solid #ddd;padding:.25em .7em;text-align:left}
th{background:#f4f4f4} tr.pick{cursor:pointer} tr.pick:hover{background:#eef5ff}
#err{color:#a00} .muted{color:#777} input{width:28em} pre{background:#f7f7f7;padding:.5em;max-height:22em;overflow:auto}
svg.chart text{font:11px system-ui,sans-serif;fill:#444} .cols{display:flex;gap:2em;flex-wrap:wrap}
"""

APP_JS = b""""use strict";
let chosen = null;
const $ = (id) => document.getElementById(id);
// runs after the first by reason, and etrun's restarts after worker failures: `elastictrain history`'s column
const restarts = (q) => {
  const r = Object.assign({}, q.runs_by_reason || {});
  const f = q.restarts - (r.failure || 0);
  if (f > 0) r.worker_failure = f;
  return Object.keys(r).sort().map((k) => k + ":" + r[k]).join(",") || "-";
};
const hash = typeof location !== "undefined" && location.hash || "";
const given = hash.match(/token=([^&]+)/), shown = hash.match(/job=([^&]+)/);
if (shown) chosen = decodeURIComponent(shown[1]);
if (given) {  // a link with the token: kept in this tab, then taken out of the address bar
  sessionStorage.setItem("et-token", decodeURIComponent(given[1]));
  if (typeof history !== "undefined") history.replaceState(null, "", location.pathname + (shown ? "#job=" + shown[1] : ""));
}
$("token").value = sessionStorage.getItem("et-token") || "";
$("login").onsubmit = (e) => { e.preventDefault(); sessionStorage.setItem("et-token", $("token").value.trim()); refresh(); };
async function get(path) {
  const headers = {"Accept": "application/json"};
  const token = sessionStorage.getItem("et-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const r = await fetch(path, {headers});
  const body = await r.json();
  if (!r.ok) throw new Error(path + ": " + (body.reason || r.status));
  return body;
}
// every value from the API goes through esc() before it joins the HTML: names, commands, event
// texts and log lines are shown as text, never parsed as markup
function esc(v) {
  return String(v ?? "-").replace(/[&<>"'`]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;",
                                                        "'": "&#39;", "`": "&#96;"}[c]));
}
function table(head, rows, onclick, ids) {
  let h = "<table><tr>" + head.map((x) => "<th>" + esc(x) + "</th>").join("") + "</tr>";
  rows.forEach((r, i) => { h += "<tr" + (onclick ? ' class="pick" data-job="' + esc(ids[i]) + '"' : "") + ">" +
    r.map((x) => "<td>" + esc(x) + "</td>").join("") + "</tr>"; });
  return h + "</table>";
}
const mib = (b) => b == null ? "-" : (b / 1048576).toFixed(0) + " MiB";
const clock = (t) => new Date(t * 1000).toISOString().slice(11, 19);
const within = (s) => {  // "in 1h 6m" (sim/forecast.py's when())
  if (s < 1) return "now";
  let r = Math.round(s); const d = Math.floor(r / 86400); r %= 86400;
  const h = Math.floor(r / 3600); r %= 3600; const m = Math.floor(r / 60), x = r % 60;
  return "in " + [d ? d + "d" : "", h ? h + "h" : "", m && !d ? m + "m" : "", x && !(d || h) ? x + "s" : ""]
    .filter((p) => p).join(" ");
};
function bars(labels, values, fmt) {
  const w = 300, bh = 16, max = Math.max(...values, 1e-12);
  let s = '<svg class="chart" role="img" width="' + (w + 190) + '" height="' + (labels.length * (bh + 4)) + '">';
  labels.forEach((l, i) => {
    const len = values[i] / max * w, y = i * (bh + 4);
    s += '<text x="0" y="' + (y + 12) + '">' + esc(l) + '</text><rect x="80" y="' + y + '" width="' + len.toFixed(1) +
      '" height="' + bh + '" fill="#4a7bd0"></rect><text x="' + (85 + len).toFixed(1) + '" y="' + (y + 12) + '">' +
      esc(fmt(values[i])) + '</text>';
  });
  return s + "</svg>";
}
function chart(xs, series, unit, ymax) {
  const w = 480, h = 120, left = 46;
  if (xs.length < 2) return '<span class="muted">not enough points yet</span>';
  const x0 = xs[0], x1 = xs[xs.length - 1], top = ymax ?? Math.max(1e-9, ...series.flatMap((s) => s.values));
  const px = (x) => left + (x - x0) / Math.max(1e-9, x1 - x0) * (w - left - 4);
  const py = (y) => h - 16 - Math.min(1, y / top) * (h - 24);
  let s = '<svg class="chart" role="img" width="' + w + '" height="' + h + '"><rect x="' + left + '" y="8" width="' +
    (w - left - 4) + '" height="' + (h - 24) + '" fill="none" stroke="#ccc"></rect>';
  s += '<text x="0" y="14">' + esc(top.toFixed(top < 10 ? 2 : 0) + " " + unit) + '</text><text x="0" y="' + (h - 16) +
    '">0</text><text x="' + left + '" y="' + (h - 2) + '">' + clock(x0) + '</text><text x="' + (w - 54) + '" y="' +
    (h - 2) + '">' + clock(x1) + '</text>';
  series.forEach((sr) => {
    s += '<polyline fill="none" stroke="' + sr.color + '" stroke-width="1.5" points="' +
      xs.map((x, i) => px(x).toFixed(1) + "," + py(sr.values[i]).toFixed(1)).join(" ") + '"></polyline>';
  });
  return s + "</svg>";
}
function pick(section) {
  document.querySelectorAll("#" + section + " tr.pick").forEach((tr) => tr.onclick = () => { chosen = tr.dataset.job; refresh(); });
}
const ENDED = ["finished", "failed", "cancelled"];
const WHY = ["preempt", "preempted", "requeue", "straggler", "regroup", "migrate", "resize", "fail", "member_failed",
             "cancel", "start", "resume", "finish", "group", "assumed", "profiled", "deferred"];
async function clusterView() {
  let c;
  try { c = await get("/v1/cluster?ended=30"); } catch (e) {
    if (/409|policy/.test(e.message)) { $("cluster").textContent = "no scheduling policy on this coordinator";
      $("queue").textContent = "-"; $("groups").textContent = "-"; return null; }
    throw e;
  }
  const util = await get("/v1/cluster/utilization");
  const pct = (x) => (100 * x).toFixed(1) + "%";
  let h = "policy " + esc(c.policy) + ", " + esc(c.decisions) + " decisions" +
    table(["node", "state", "GPU type", "slots", "in use", "jobs"],
      c.nodes.map((n) => [n.name, (n.cordoned_until ? "cordoned: " + (n.cordon_why || "-") : n.state) +
                          (n.maint_start ? "; maintenance planned " + new Date(n.maint_start * 1000).toLocaleString() +
                           " to " + new Date(n.maint_end * 1000).toLocaleString() : ""),
                          n.gpu_type || n.kind, n.slots, n.used, n.jobs.join(" ")])) +
    "<h3>GPUs in use</h3>" + chart(util.times, [{values: util.values.used, color: "#4a7bd0"},
                                                 {values: util.values.total, color: "#bbb"}], "GPUs");
  const u = await get("/v1/cluster/users?window=600");
  const quota = (x) => {  // its quota (docs/cluster.md, "Quotas"), what its admitted jobs count, who waits
    const q = [x.quota_gpus != null ? x.quota_gpus + " GPUs" : "", x.quota_jobs != null ? x.quota_jobs + " jobs" : ""]
      .filter((p) => p).join(", ");
    return q ? q + (x.quota_own ? "" : " (default)") + ": " + (x.admitted_gpus || 0) + " GPUs admitted" +
      (x.waiting_for_quota ? ", " + x.waiting_for_quota + " waiting" : "") : "-";
  };
  if (u.users.length) h += "<h3>Users</h3>" + table(["user", "tickets", "entitled",
      "share of the last " + u.window.toFixed(0) + " s", "running GPUs", "jobs", "quota"],
    u.users.map((x) => [x.user, x.tickets + (x.set ? "" : " (default)"), pct(x.entitled), pct(x.share),
                        x.running_gpus, x.jobs, quota(x)]));
  $("cluster").innerHTML = h;
  const where = (q) => q.placement.map((p) => p.node + ":" + (p.gpus.length ? p.gpus.join(",") : p.slots)).join(" ");
  const running = c.jobs.filter((q) => q.status === "running");
  const waiting = c.jobs.filter((q) => q.status === "queued" || q.status === "preempted");
  const ended = c.jobs.filter((q) => ENDED.includes(q.status));
  const prog = (q) => q.step + (q.steps ? "/" + q.steps : "");
  const who = (q) => q.user + (q.priority ? " (priority " + q.priority + ")" : "");
  let qh = "<h3>Running</h3>" + (running.length ? table(["job", "name", "user", "gpus", "placement", "group", "step",
      "s/step", "restarts"], running.map((q) => [q.id, q.name, who(q), q.workers || q.gpus, where(q),
      q.info.group || "-", prog(q), q.info.group_iteration_time ||
        (q.iteration_time == null ? "-" : q.iteration_time.toFixed(3)),
      restarts(q)]), true, running.map((q) => q.id)) : '<span class="muted">none</span>');
  // when each waiting job is expected to start: the policy simulated from now (status --start; shared for 5 s)
  const f = waiting.length ? await get("/v1/cluster/forecast").catch(() => null) : null;
  const eta = {};
  if (f) f.jobs.forEach((x) => { eta[x.id] = x.start != null ? within(x.start - f.now) : "-"; });
  qh += "<h3>Queue</h3>" + (waiting.length ? table(["job", "name", "user", "status", "gpus", "attained GPU-s",
      "expected start", "why"],
      waiting.map((q) => [q.id, q.name, who(q), q.status, q.gpus, (q.attained_gpu || 0).toFixed(1), eta[q.id] || "-",
                          q.reason || "-"]),
      true, waiting.map((q) => q.id)) : '<span class="muted">empty</span>');
  qh += "<h3>Ended</h3>" + (ended.length ? table(["job", "name", "user", "status", "JCT s", "reason"],
      ended.map((q) => [q.id, q.name, q.user, q.status, q.end_time ? (q.end_time - q.submit_time).toFixed(1) : "-",
                        q.reason || "-"]), true, ended.map((q) => q.id)) : '<span class="muted">none</span>');
  $("queue").innerHTML = qh;
  ["queue"].forEach(pick);
  const groups = {};
  c.jobs.forEach((q) => { if (q.info.group && q.status === "running") groups[q.info.group] = groups[q.info.group] || q; });
  const gl = Object.keys(groups);
  $("groups").innerHTML = gl.length ? table(["members", "placement", "measured s/step", "eq. 3 s/step"],
    gl.map((g) => [g, where(groups[g]), groups[g].info.group_iteration_time || "-", groups[g].info.group_predicted || "-"]))
    : '<span class="muted">no job runs interleaved now</span>';
  return c;
}
async function jobView(c, unscheduled) {
  const id = encodeURIComponent(chosen);
  let h = "";
  // (a scheduled job that ended before the 30 the cluster view lists is read on its own)
  const q = c && (c.jobs.find((x) => x.id === chosen) || (unscheduled.has(chosen) ? undefined :
                  await get("/v1/cluster/jobs/" + id).catch(() => undefined)));
  if (q) {
    h += "<p>" + esc(q.name) + " (" + esc(q.user) + "): " + esc(q.status) + (q.reason ? ": " + esc(q.reason) : "") +
      "; step " + esc(q.step) + (q.steps ? " of " + esc(q.steps) : "") + "; run " + esc(q.run) + "; " + esc(q.preemptions) +
      " preemptions, restarts " + esc(restarts(q)) + "</p>";
    const stages = ["load", "preprocess", "compute", "sync"];
    h += '<div class="cols"><div><h3>Stage profile (per iteration)</h3>' + (q.stage_times.length ?
      bars(stages, q.stage_times, (v) => (v * 1000).toFixed(1) + " ms") : '<span class="muted">not profiled</span>');
    const st = await get("/v1/cluster/jobs/" + id + "/steps").catch(() => ({times: [], values: {step: []}}));
    const rate = [], at = [];
    for (let i = 1; i < st.times.length; i++) {
      const dt = st.times[i] - st.times[i - 1], ds = st.values.step[i] - st.values.step[i - 1];
      if (dt > 0 && ds >= 0) { rate.push(ds / dt); at.push(st.times[i]); }
    }
    h += '</div><div><h3>Step rate</h3>' + chart(at, [{values: rate, color: "#2a9d55"}], "steps/s") + "</div></div>";
    const ev = (await get("/v1/cluster/events?job=" + id)).events.filter((e) => WHY.includes(e.kind));
    h += "<h3>Starts, restarts and their reasons</h3>" + table(["time", "event", "run", "why"],
      ev.slice(-40).map((e) => [clock(e.time), e.kind, e.detail.run ?? "-",
        e.detail.reason || e.detail.why || e.detail.assumed || e.detail.resume_reason ||
        (e.detail.group && e.detail.group.length ? "group " + e.detail.group.join("+") : "") || "-"]));
    const logs = await get("/v1/cluster/jobs/" + id + "/logs").catch((e) => ({chunks: [], denied: e.message}));
    const text = logs.chunks.map((k) => { try { return atob(k.data); } catch (e) { return ""; } }).join("");
    h += '<h3>Log tail</h3><pre id="logtail">' + esc(text.split("\\n").slice(-400).join("\\n") || logs.denied ||
      "(no output yet)") + "</pre>";
  }
  let j = null;
  try { j = await get("/v1/jobs/" + id); } catch (e) { if (!q) throw e; }
  if (j) {
    const ds = await Promise.all((j.datasets || []).map((d) => get("/v1/jobs/" + id + "/datasets/" + encodeURIComponent(d))));
    const res = (await get("/v1/jobs/" + id + "/resources")).workers;
    h += table(["dataset", "todo", "doing", "done", "total", "finished", "last commit"],
        ds.map((d) => [d.spec.name, d.todo, d.doing, d.done, d.total, d.finished ? "yes" : "no", d.last_commit])) +
      table(["worker", "cpu %", "rss", "step", "step time", "gpu"],
        res.map((w) => [w.worker, w.latest.cpu_percent.toFixed(0), mib(w.latest.rss_bytes), w.latest.step,
                        w.latest.step_time == null ? "-" : w.latest.step_time.toFixed(3) + " s",
                        w.latest.gpu_util == null ? (w.latest.gpu_absent || "-") : w.latest.gpu_util + "%"]));
  }
  $("jobtitle").textContent = "Job " + chosen;
  // the log tail opens at its end, and stays there as lines come, unless the reader scrolled up
  const old = $("logtail"), top = old ? old.scrollTop : 0;
  const atEnd = !old || !old.scrollHeight || old.scrollTop + old.clientHeight >= old.scrollHeight - 4;
  $("job").innerHTML = h;
  const pre = $("logtail");
  if (pre) pre.scrollTop = atEnd ? pre.scrollHeight : top;
}
async function refresh() {
  try {
    const c = await clusterView();
    // (the scheduler's jobs are shown above, with its view of them)
    const jobs = (await get("/v1/jobs?scheduled=0")).jobs.filter((j) => !j.job.startsWith("g."));
    $("jobs").innerHTML = jobs.length ? table(["job", "status", "generation", "world size", "nodes", "--nnodes"],
      jobs.map((j) => [j.job, j.status + (j.detail ? ": " + j.detail : ""), j.generation, j.world_size, j.nodes,
                       j.min_nodes + ":" + j.max_nodes]), true, jobs.map((j) => j.job)) :
      (c && c.jobs.length ? "none besides the scheduled jobs" : "no jobs yet");
    pick("jobs");
    if (chosen) await jobView(c, new Set(jobs.map((j) => j.job)));
    $("err").textContent = "";
  } catch (e) { $("err").textContent = e.message; }
}
refresh(); setInterval(refresh, 2000);
"""

#: the page's Content-Security-Policy: scripts and styles only from this origin's files (no inline
#: script, no eval), requests only to this origin, nothing may frame it
CSP = (b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

#: path -> (content type, body)
FILES = {"/ui": (b"text/html; charset=utf-8", PAGE), "/ui/": (b"text/html; charset=utf-8", PAGE),
         "/ui/app.js": (b"text/javascript; charset=utf-8", APP_JS), "/ui/app.css": (b"text/css; charset=utf-8", APP_CSS)}
