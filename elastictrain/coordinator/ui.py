"""The coordinator's status page, ``GET /ui``: one static HTML file whose script reads the JSON
API with the token the user pastes (kept in the tab's sessionStorage, sent as the bearer token;
with ``--public-read`` none is needed). It shows every job (``/v1/jobs``), the cluster's nodes
and queue when a policy runs (``/v1/cluster``) with the users' tickets and shares
(``/v1/cluster/users``), and for a chosen job its datasets and each
worker's resource use (``/v1/jobs/{job}``, ``.../datasets/{ds}``, ``.../resources``), refreshed
every 2 seconds. The page holds no data itself, so serving it needs no token."""

PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>elastictrain</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .4em} h2{font-size:1.05em;margin:1.2em 0 .3em}
table{border-collapse:collapse;margin:.2em 0} td,th{border-bottom:1px solid #ddd;padding:.25em .7em;text-align:left}
th{background:#f4f4f4} tr.pick{cursor:pointer} tr.pick:hover{background:#eef5ff}
#err{color:#a00} .muted{color:#777} input{width:28em}
</style></head><body>
<h1>elastictrain coordinator</h1>
<div>token <input id="token" type="password" placeholder="paste the coordinator's token (not needed with --public-read)">
<button id="save">use</button> <span id="err"></span></div>
<h2>Jobs</h2><div id="jobs" class="muted">loading...</div>
<h2>Cluster</h2><div id="cluster" class="muted">-</div>
<h2 id="jobtitle">Job</h2><div id="job" class="muted">click a job above</div>
<script>
"use strict";
let chosen = null;
const $ = (id) => document.getElementById(id);
$("token").value = sessionStorage.getItem("et-token") || "";
$("save").onclick = () => { sessionStorage.setItem("et-token", $("token").value.trim()); refresh(); };
async function get(path) {
  const headers = {"Accept": "application/json"};
  const token = sessionStorage.getItem("et-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const r = await fetch(path, {headers});
  const body = await r.json();
  if (!r.ok) throw new Error(path + ": " + (body.reason || r.status));
  return body;
}
function esc(v) { return String(v ?? "-").replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c])); }
function table(head, rows, onclick) {
  let h = "<table><tr>" + head.map((x) => "<th>" + esc(x) + "</th>").join("") + "</tr>";
  rows.forEach((r, i) => { h += "<tr" + (onclick ? ' class="pick" data-i="' + i + '"' : "") + ">" +
    r.map((x) => "<td>" + esc(x) + "</td>").join("") + "</tr>"; });
  return h + "</table>";
}
const mib = (b) => b == null ? "-" : (b / 1048576).toFixed(0) + " MiB";
async function refresh() {
  try {
    const jobs = (await get("/v1/jobs")).jobs;
    $("jobs").innerHTML = jobs.length ? table(["job", "status", "generation", "world size", "nodes", "--nnodes"],
      jobs.map((j) => [j.job, j.status + (j.detail ? ": " + j.detail : ""), j.generation, j.world_size, j.nodes,
                       j.min_nodes + ":" + j.max_nodes]), true) : "no jobs yet";
    document.querySelectorAll("#jobs tr.pick").forEach((tr) => tr.onclick = () => { chosen = jobs[+tr.dataset.i].job; refresh(); });
    try {
      const c = await get("/v1/cluster");
      $("cluster").innerHTML = "policy " + esc(c.policy) + table(["node", "state", "slots", "used", "jobs"],
        c.nodes.map((n) => [n.name, n.state, n.slots, n.used, n.jobs.join(" ")])) +
        table(["cluster job", "name", "user", "status", "gpus", "attained GPU-s"],
          c.jobs.map((q) => [q.id, q.name, q.user, q.status, q.gpus, (q.attained_gpu || 0).toFixed(1)]));
      const u = await get("/v1/cluster/users?window=600");
      const pct = (x) => (100 * x).toFixed(1) + "%";
      if (u.users.length) $("cluster").innerHTML += table(["user", "tickets", "entitled",
          "share of the last " + u.window.toFixed(0) + " s", "running GPUs", "jobs"],
        u.users.map((x) => [x.user, x.tickets + (x.set ? "" : " (default)"), pct(x.entitled), pct(x.share),
                            x.running_gpus, x.jobs]));
    } catch (e) { $("cluster").textContent = "no scheduling policy on this coordinator"; }
    if (chosen) {
      const j = await get("/v1/jobs/" + encodeURIComponent(chosen));
      const ds = await Promise.all((j.datasets || []).map((d) => get("/v1/jobs/" + encodeURIComponent(chosen) + "/datasets/" + encodeURIComponent(d))));
      const res = (await get("/v1/jobs/" + encodeURIComponent(chosen) + "/resources")).workers;
      $("jobtitle").textContent = "Job " + chosen;
      $("job").innerHTML = table(["dataset", "todo", "doing", "done", "total", "finished", "last commit"],
          ds.map((d) => [d.spec.name, d.todo, d.doing, d.done, d.total, d.finished ? "yes" : "no", d.last_commit])) +
        table(["worker", "cpu %", "rss", "step", "step time", "gpu"],
          res.map((w) => [w.worker, w.latest.cpu_percent.toFixed(0), mib(w.latest.rss_bytes), w.latest.step,
                          w.latest.step_time == null ? "-" : w.latest.step_time.toFixed(3) + " s",
                          w.latest.gpu_util == null ? (w.latest.gpu_absent || "-") : w.latest.gpu_util + "%"]));
    }
    $("err").textContent = "";
  } catch (e) { $("err").textContent = e.message; }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
"""
