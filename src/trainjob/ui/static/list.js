// The job list: newest jobs first, refreshed every second without reloading the page.
"use strict";

const selected = new Set();
let timer = null;

function row(job, now) {
  const checked = selected.has(job.name) ? " checked" : "";
  const name = TJ.esc(job.name);
  return `<tr data-name="${name}">` +
    `<td><input type="checkbox" aria-label="select ${name}" value="${name}"${checked}></td>` +
    `<td class="name"><a href="/jobs/${encodeURIComponent(job.name)}">${name}</a></td>` +
    `<td>${TJ.badge(job.status)}</td>` +
    `<td>${job.nodes}x${job.procs ?? "?"}</td>` +
    `<td class="progress">${TJ.progressHtml(job)}</td>` +
    `<td>${TJ.duration(now - job.created)}</td>` +
    `<td>${TJ.duration(TJ.runFor(job, now))}</td></tr>`;
}

async function refresh() {
  clearTimeout(timer);
  const params = new URLSearchParams({ q: document.getElementById("q").value, status: document.getElementById("status").value });
  try {
    const data = await TJ.json(`/api/jobs?${params}`);
    document.querySelector("#jobs tbody").innerHTML = data.jobs.map((job) => row(job, data.now)).join("");
    document.getElementById("empty").hidden = data.total > 0;
    const counts = Object.entries(data.counts).map(([status, n]) => `<b>${n.toLocaleString()}</b> ${TJ.esc(status)}`).join(" · ");
    document.getElementById("counts").innerHTML = `${data.total.toLocaleString()} job(s)${counts ? ": " + counts : ""}`;
    document.getElementById("more").textContent = data.matching > data.jobs.length
      ? `Showing the newest ${data.jobs.length.toLocaleString()} of ${data.matching.toLocaleString()} matching jobs; filter to find others.` : "";
    document.getElementById("where").textContent = `${data.backend} backend`;
    if (window.tjFirstRender == null) {  // time to first render, read by benchmarks/ui_joblist.py
      window.tjFirstRender = performance.now();
      document.body.dataset.ready = "1";
    }
  } catch (error) {
    document.getElementById("counts").innerHTML = `<span class="error">${TJ.esc(error.message)}</span>`;
  }
  timer = setTimeout(refresh, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("q").addEventListener("input", refresh);
  document.getElementById("status").addEventListener("change", refresh);
  document.querySelector("#jobs tbody").addEventListener("change", (event) => {
    if (event.target.type !== "checkbox") return;
    if (event.target.checked) selected.add(event.target.value); else selected.delete(event.target.value);
    document.getElementById("compare").disabled = selected.size < 1;
  });
  document.getElementById("compare").addEventListener("click", () => {
    location.href = `/compare?jobs=${[...selected].map(encodeURIComponent).join(",")}`;
  });
  refresh();
});
