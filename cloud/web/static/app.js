/* The router: #/fleet, #/gateways/<id>, #/devices/<gateway>/<device>, #/alerts[/<gateway>], #/jobs,
 * #/job/<id>, #/models, #/datasets, #/federated; one page at a time, refreshed
 * every 2 s (the job page streams its events as well). Errors show in one banner, never as alerts.
 * Invariant: the banner keeps one message per source; a successful refresh clears only the
 * "refresh" source (the error it had was its own and has cleared), so an error from an action
 * (submitting a job, cancelling one) stays until the user dismisses it or the next action succeeds. */
"use strict";

const app = (() => {
  let current = null, timer = null;
  const errors = new Map();  // source -> message
  function showError(err, source) {
    source = source || "refresh";
    if (err) errors.set(source, String(err.message || err));
    else errors.delete(source);
    const box = document.getElementById("error");
    box.hidden = errors.size === 0;
    document.getElementById("error-text").textContent = [...errors.values()].join("\n");
  }
  function dismiss() { errors.clear(); showError(null); }
  async function refresh() {
    if (!current) return;
    try { await current.refresh(); showError(null); } catch (err) { showError(err); }
  }
  function route() {
    if (current) current.stop();
    clearInterval(timer);
    errors.clear();
    showError(null);
    const page = document.getElementById("page");
    const [, name, ...args] = (location.hash || "#/fleet").split("/");
    const [arg, arg2] = args.map(decodeURIComponent);
    const tab = {job: "jobs", gateways: "fleet", devices: "fleet"}[name] || name;
    document.querySelectorAll("nav a").forEach(a => a.classList.toggle("active", a.id === `nav-${tab}`));
    if (name === "job" && arg) current = jobview.jobPage(page, arg);
    else if (name === "gateways" && arg) current = gateway.gatewayPage(page, arg);
    else if (name === "devices" && arg && arg2) current = device.devicePage(page, arg, arg2);
    else if (name === "alerts") current = fleet.alertsPage(page, arg);
    else if (name === "jobs") current = pages.jobsPage(page);
    else if (name === "models") current = pages.modelsPage(page);
    else if (name === "datasets") current = pages.datasetsPage(page);
    else if (name === "federated") current = federated.page(page);
    else current = fleet.fleetPage(page);
    refresh();
    timer = setInterval(refresh, 2000);
  }
  function start() {
    api.takeTokenFromUrl();
    const input = document.getElementById("token");
    input.value = localStorage.getItem(api.TOKEN_KEY) || "";
    document.getElementById("login").addEventListener("submit", ev => {
      ev.preventDefault();
      localStorage.setItem(api.TOKEN_KEY, input.value.trim());
      route();
    });
    document.getElementById("logout").addEventListener("click", () => {
      localStorage.removeItem(api.TOKEN_KEY);
      input.value = "";
      route();
    });
    document.getElementById("error-dismiss").addEventListener("click", dismiss);
    window.addEventListener("hashchange", route);
    route();
  }
  return {start, showError};
})();

window.app = app;
app.start();
