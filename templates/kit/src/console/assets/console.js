// The outbox console's live parts: on the overview, the figures, the
// charts and the queues are fetched from overview.json every two seconds
// and drawn in place. Every other page works without this script.
"use strict";

(function () {
  const figures = document.querySelectorAll("[data-figure]");
  if (figures.length === 0) return;
  const status = document.querySelector('[data-live="status"]');
  const queues = document.querySelector('[data-live="queues"] tbody');

  function shown(key, value) {
    if (value === null || value === undefined) return "–";
    if (key === "lag_seconds") return value.toFixed(1) + " s";
    if (key === "backlog") return String(value);
    return value.toFixed(1);
  }

  function draw(svg, points) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    if (points.length < 2) return;
    const xs = points.map((p) => p[0]);
    const ys = points.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs);
    const top = Math.max(1e-9, Math.max(...ys));
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", points.map((p) =>
      ((p[0] - x0) / Math.max(1e-9, x1 - x0) * 300).toFixed(1) + "," +
      (78 - p[1] / top * 74).toFixed(1)).join(" "));
    svg.appendChild(line);
  }

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
  }

  async function refresh() {
    try {
      const response = await fetch("overview.json", { headers: { Accept: "application/json" } });
      const body = await response.json();
      if (!response.ok) throw new Error(body.error || response.statusText);
      for (const element of figures) {
        element.textContent = shown(element.dataset.figure, body.now[element.dataset.figure]);
      }
      for (const svg of document.querySelectorAll("[data-series]")) {
        draw(svg, body.series[svg.dataset.series] || []);
      }
      if (queues) {
        queues.replaceChildren();
        for (const q of body.now.queues) {
          const row = document.createElement("tr");
          for (const text of [q.queue, q.size, q.pending, q.retry, q.archived,
                              q.latency_seconds.toFixed(1) + " s", q.paused ? "paused" : "running"]) {
            cell(row, String(text));
          }
          queues.appendChild(row);
        }
      }
      status.textContent = "Live: refreshed every two seconds.";
      status.classList.remove("error");
    } catch (err) {
      status.textContent = "Not refreshed: " + err.message + " (trying again)";
      status.classList.add("error");
    }
  }

  refresh();
  setInterval(refresh, 2000);
})();
