// One job: facts, failure, live curves, live logs, events, the TrainJob; suspend, resume and delete after asking.
"use strict";

const NAME = decodeURIComponent(location.pathname.split("/").pop());
const API = `/api/jobs/${encodeURIComponent(NAME)}`;
const MAX_LOG_LINES = 5000;
let job = null;
let stream = null;
let timer = null;

function fact(label, value) {
  return `<div><span>${TJ.esc(label)}</span>${value}</div>`;
}

function render(data) {
  job = data;
  document.title = `trainjob: ${data.name}`;
  document.getElementById("name").textContent = data.name;
  document.getElementById("status").innerHTML = TJ.badge(data.status);
  document.getElementById("where").textContent = `${data.backend} backend`;
  const when = (t) => (t == null ? "-" : new Date(t * 1000).toLocaleString());
  document.getElementById("facts").innerHTML = [
    fact("Nodes x processes", `${data.nodes} x ${data.procs ?? "?"} (world size ${data.world_size})`),
    fact("Runtime", TJ.esc(data.runtime)),
    fact("Created", `${when(data.created)} <span class="muted">(${TJ.duration(data.now - data.created)} ago)</span>`),
    fact("Ran for", TJ.duration(TJ.runFor(data, data.now))),
    fact("Restarts", String(data.restarts)),
    fact("Reason", TJ.esc(data.reason || "-")),
    fact("Last metrics", TJ.esc(Object.entries(data.metrics).map(([k, v]) => `${k}=${v == null ? v : Number(v).toPrecision(4)}`).join(" ") || "-")),
    fact("Nodes", data.steps.map((s) => `${TJ.esc(s.name)} ${TJ.esc(s.status || "-")}`).join("<br>") || "-"),
  ].join("");
  document.getElementById("progress").innerHTML = TJ.progressHtml(data);
  const failed = data.status === "Failed";
  const waiting = data.status === "Queued";
  const box = document.getElementById("failure");
  box.hidden = !(failed || waiting || data.restarts > 0);
  box.classList.toggle("failure", failed);
  document.getElementById("failure-title").textContent = failed ? `Failed: ${data.reason}` : waiting ? "Waiting in the queue" : `Restarted ${data.restarts} time(s)`;
  const restarts = data.events.filter((e) => e.reason === "Restarting").map((e) => e.message);
  document.getElementById("failure-text").textContent = failed || waiting ? data.message || "" : restarts.join("\n");
  document.querySelector("#events tbody").innerHTML = data.events.map((e) =>
    `<tr><td>${new Date(e.time * 1000).toLocaleTimeString()}</td><td>${TJ.esc(e.type)}</td><td>${TJ.esc(e.reason)}</td>` +
    `<td>${TJ.esc(e.object)}</td><td style="white-space:normal">${TJ.esc(e.message)}</td></tr>`).join("");
  document.getElementById("spec").textContent = JSON.stringify(data.resource, null, 2);
  const active = UNFINISHED.includes(data.status);
  document.getElementById("suspend").disabled = !active;
  document.getElementById("resume").disabled = data.status !== "Suspended";
  document.getElementById("delete").disabled = false;
  fillSelect("log-node", Array.from({ length: data.nodes }, (_, i) => [String(i), `node-${i}`]));
  fillSelect("log-rank", Array.from({ length: data.world_size }, (_, r) => [String(r), `rank ${r}`]));
  if (active && !stream) openLogs();
}

function fillSelect(id, options) {
  const select = document.getElementById(id);
  if (select.options.length === options.length + 1) return;
  select.innerHTML = select.options[0].outerHTML + options.map(([v, t]) => `<option value="${v}">${TJ.esc(t)}</option>`).join("");
}

async function refresh() {
  clearTimeout(timer);
  try {
    render(await TJ.json(API));
  } catch (error) {
    const gone = document.getElementById("gone");
    gone.hidden = false;
    gone.textContent = error.message;
    if (/not found/i.test(error.message)) {
      for (const id of ["suspend", "resume", "delete"]) document.getElementById(id).disabled = true;
      return;
    }
  }
  timer = setTimeout(refresh, 1000);
}

// Logs arrive as Server-Sent Events, in batches; the stream ends when the job does.
function openLogs() {
  if (stream) stream.close();
  const pre = document.getElementById("logs");
  pre.textContent = "";  // a new stream starts from the beginning of the log
  const params = new URLSearchParams();
  const node = document.getElementById("log-node").value;
  const rank = document.getElementById("log-rank").value;
  if (node) params.set("node", node);
  if (rank) params.set("rank", rank);
  const state = document.getElementById("log-state");
  state.textContent = "following";
  stream = new EventSource(`${API}/logs?${params}`);
  const source = stream;
  source.onmessage = (event) => {
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40;
    const fragment = document.createDocumentFragment();
    for (const line of JSON.parse(event.data)) {
      const where = document.createElement("span");
      where.className = "where";
      where.textContent = line.rank == null ? `node-${line.node} | ` : `node-${line.node}/rank-${line.rank} | `;
      fragment.append(where, line.text + "\n");
    }
    pre.append(fragment);
    while (pre.childNodes.length > MAX_LOG_LINES * 2) pre.removeChild(pre.firstChild);
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  };
  source.addEventListener("end", () => {
    source.close();
    if (stream === source) stream = null;
    state.textContent = "end of log (the job is not running)";
  });
  source.addEventListener("failure", (event) => { state.textContent = `error: ${JSON.parse(event.data)}`; });
  source.onerror = () => { if (source.readyState === EventSource.CLOSED && stream === source) stream = null; };
}

async function act(verb, method, path, question, danger) {
  if (!(await TJ.confirm(`${verb} ${NAME}?`, question, verb, danger))) return;
  const button = document.getElementById(verb.toLowerCase());
  button.disabled = true;
  button.textContent = { Suspend: "Suspending…", Resume: "Resuming…", Delete: "Deleting…" }[verb];
  try {
    await TJ.action(path, method);
    if (verb === "Delete") { location.href = "/"; return; }
  } catch (error) {
    alert(`${verb} failed: ${error.message}`);
  } finally {
    button.textContent = verb;
  }
  refresh();
}

document.addEventListener("DOMContentLoaded", () => {
  const charts = new MetricCharts(document.getElementById("charts"));
  new MutationObserver(() => { document.getElementById("no-metrics").hidden = charts.charts.size > 0; })
    .observe(document.getElementById("charts"), { childList: true });
  charts.watch(NAME, () => job && job.status);
  document.getElementById("suspend").onclick = () => act("Suspend", "POST", `${API}/suspend`,
    "Its processes stop now; the job stays and Resume starts them again (a script that checkpoints continues from its checkpoint).");
  document.getElementById("resume").onclick = () => act("Resume", "POST", `${API}/resume`,
    "Its nodes start again from the beginning of the script (which resumes from its checkpoint, if it keeps one).");
  document.getElementById("delete").onclick = () => act("Delete", "DELETE", API,
    "Its processes stop and the job, its logs and metrics are removed. This cannot be undone.", true);
  document.getElementById("log-node").onchange = openLogs;
  document.getElementById("log-rank").onchange = openLogs;
  const overlay = document.getElementById("overlay");
  overlay.onfocus = async () => {
    const data = await TJ.json("/api/jobs?limit=100");
    overlay.innerHTML = overlay.options[0].outerHTML + data.jobs.filter((j) => j.name !== NAME)
      .map((j) => `<option>${TJ.esc(j.name)}</option>`).join("");
  };
  overlay.onchange = () => { if (overlay.value) charts.watch(overlay.value); overlay.value = ""; };
  refresh().then(() => { if (!stream) openLogs(); });
});
