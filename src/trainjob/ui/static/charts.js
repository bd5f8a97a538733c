// Metric curves drawn with Plotly: one chart per metric name, one line per job, extended as records arrive.
"use strict";

const UNFINISHED = ["Queued", "Created", "Running"];

class MetricCharts {
  constructor(container) {
    this.container = container;
    this.charts = new Map();     // metric -> {div, traces: Map(job -> trace index)}
    this.watched = new Map();    // job -> {after, t0, timer}
  }

  chart(metric) {
    let chart = this.charts.get(metric);
    if (chart) return chart;
    const div = document.createElement("div");
    div.className = "chart";
    div.dataset.metric = metric;
    div.dataset.points = "0";
    const names = [...this.charts.keys(), metric].sort();
    const before = this.charts.get(names[names.indexOf(metric) + 1]);
    this.container.insertBefore(div, before ? before.div : null);
    const dark = matchMedia("(prefers-color-scheme: dark)").matches;
    Plotly.newPlot(div, [], {
      title: { text: metric, font: { size: 14 } }, margin: { l: 50, r: 12, t: 36, b: 36 },
      xaxis: { title: { text: "step" } }, hovermode: "x unified", showlegend: true,
      legend: { orientation: "h", y: -0.2 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: dark ? "#e6e8eb" : "#1d1f23" },
    }, { displaylogo: false, responsive: true, displayModeBar: false });
    chart = { div, traces: new Map() };
    this.charts.set(metric, chart);
    return chart;
  }

  add(job, records, state) {
    const series = new Map();
    for (const record of records) {
      if (state.t0 == null) state.t0 = record.time;
      const x = record.step ?? +(record.time - state.t0).toFixed(3);
      for (const [metric, value] of Object.entries(record.metrics)) {
        if (value == null) continue;
        if (!series.has(metric)) series.set(metric, { x: [], y: [] });
        series.get(metric).x.push(x);
        series.get(metric).y.push(value);
      }
    }
    for (const [metric, points] of series) {
      const chart = this.chart(metric);
      if (!chart.traces.has(job)) {
        chart.traces.set(job, chart.traces.size);
        Plotly.addTraces(chart.div, { x: points.x, y: points.y, name: job, mode: "lines+markers", marker: { size: 4 } });
      } else {
        Plotly.extendTraces(chart.div, { x: [points.x], y: [points.y] }, [chart.traces.get(job)]);
      }
      chart.div.dataset.points = String(chart.div.data.reduce((n, trace) => n + trace.x.length, 0));
    }
  }

  // Poll the job's metrics every second while it may still report; ``status()`` says whether it can.
  watch(job, status) {
    if (this.watched.has(job)) return;
    const state = { after: 0, t0: null, timer: null };
    this.watched.set(job, state);
    const poll = async () => {
      try {
        const data = await TJ.json(`/api/jobs/${encodeURIComponent(job)}/metrics?after=${state.after}`);
        if (data.records.length) this.add(job, data.records, state);
        state.after = data.last;
      } catch (error) {
        if (/not found/i.test(error.message)) return;  // deleted: stop polling
      }
      const current = status ? status() : null;
      // A finished job is looked at now and then only (resuming it brings new points).
      state.timer = setTimeout(poll, current == null || UNFINISHED.includes(current) ? 1000 : 5000);
    };
    poll();
  }
}
