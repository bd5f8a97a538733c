// Helpers shared by the dashboard's pages: fetching JSON, formatting times and progress, escaping text.
"use strict";

const TJ = {
  async json(url, options) {
    const response = await fetch(url, options);
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
    return body;
  },
  action(url, method) {
    return TJ.json(url, { method, headers: { "X-Trainjob-Action": "1" } });
  },
  esc(text) {
    return String(text ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  },
  duration(seconds) {  // 42s, 3m12s, 2h5m, 3d4h: as `trainjob list` writes them
    if (seconds == null) return "-";
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m${s % 60}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
    return `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600)}h`;
  },
  runFor(job, now) {
    return job.started == null ? null : (job.finished ?? now) - job.started;
  },
  fraction(job) {
    return job.step != null && job.total_steps ? Math.min(1, job.step / job.total_steps) : null;
  },
  progressText(job) {
    const parts = [];
    const f = TJ.fraction(job);
    if (f != null) parts.push(`${Math.round(f * 100)}% ${job.step}/${job.total_steps}`);
    else if (job.step != null) parts.push(`step ${job.step}`);
    if (job.loss != null) parts.push(`loss=${Number(job.loss).toPrecision(4)}`);
    if (job.eta != null) parts.push(`eta ${TJ.duration(job.eta)}`);
    return parts.join(" ") || "-";
  },
  progressHtml(job) {
    const f = TJ.fraction(job);
    const bar = f == null ? "" : `<div class="bar"><span style="width:${(f * 100).toFixed(1)}%"></span></div>`;
    return `${bar}<span class="small">${TJ.esc(TJ.progressText(job))}</span>`;
  },
  badge(status) {
    return `<span class="badge ${TJ.esc(status)}" data-status="${TJ.esc(status)}">${TJ.esc(status)}</span>`;
  },
  // A modal question; resolves true when the user confirms.
  confirm(title, text, verb, danger) {
    const dialog = document.getElementById("confirm");
    dialog.querySelector("h3").textContent = title;
    dialog.querySelector("p").textContent = text;
    const ok = dialog.querySelector("button[value=ok]");
    ok.textContent = verb;
    ok.className = danger ? "primary danger" : "primary";
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise((resolve) => dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true }));
  },
};
