// Runs the status page's script under node against a live coordinator, with a minimal DOM:
// node ui_harness.js SCRIPT_FILE BASE_URL TOKEN JOB  -> prints the rendered sections as JSON.
const fs = require("fs");
const [script, base, token, job] = process.argv.slice(2);
const els = {};
const el = (id) => (els[id] = els[id] || {id, innerHTML: "", textContent: "", value: "", dataset: {}});
global.document = {getElementById: el, querySelectorAll: () => []};
const store = {"et-token": token};
global.sessionStorage = {getItem: (k) => store[k] ?? null, setItem: (k, v) => { store[k] = v; }};
const realFetch = global.fetch;
global.fetch = (path, opts) => realFetch(base + path, opts);
global.setInterval = () => 0;
const src = fs.readFileSync(script, "utf8").replace('let chosen = null;', `let chosen = ${JSON.stringify(job)};`);
eval(src + "\n;globalThis.__refresh = refresh;");
setTimeout(async () => {
  await globalThis.__refresh();
  console.log(JSON.stringify({jobs: el("jobs").innerHTML, queue: el("queue").innerHTML,
                              cluster: el("cluster").innerHTML || el("cluster").textContent,
                              job: el("job").innerHTML, err: el("err").textContent}));
}, 300);
