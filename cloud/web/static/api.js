/* The operator token (kept in localStorage; ?token=... in the URL is moved there once and removed
 * from the address bar) and the calls to cloudd's API, including the SSE stream read with fetch
 * (EventSource cannot send an Authorization header). */
"use strict";

const TOKEN_KEY = "edgefed.operatorToken";

function takeTokenFromUrl() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token) {
    localStorage.setItem(TOKEN_KEY, token);
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
}

function authHeaders() {
  const token = localStorage.getItem(TOKEN_KEY);
  return token ? {Authorization: "Bearer " + token} : {};
}

/* An HTTP error from cloudd: `status` and cloudd's `error` code and `detail` kept for the caller. */
class ApiError extends Error {
  constructor(path, status, body) {
    super(`${path}: HTTP ${status} ${body.error || ""}: ${body.detail || ""}`);
    Object.assign(this, {status, code: body.error, detail: body.detail});
  }
}

async function apiGet(path) {
  const response = await fetch(path, {headers: authHeaders()});
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(path, response.status, body);
  return body;
}

async function apiPost(path, payload) {
  const response = await fetch(path, {method: "POST", body: payload === undefined ? "" : JSON.stringify(payload),
    headers: {...authHeaders(), "Content-Type": "application/json"}});
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(path, response.status, body);
  return body;
}

/* Follow a job's events; onEvent(kind, data) per event. Returns {stop()}. Reconnects from the
 * last seen id after a dropped connection until the stream says "end" or stop() is called. */
function followEvents(jobId, onEvent, onEnd) {
  const controller = new AbortController();
  let next = 0, ended = false;
  async function run() {
    while (!ended && !controller.signal.aborted) {
      try {
        const response = await fetch(`/v1/jobs/${jobId}/events?since=${next}`,
          {headers: authHeaders(), signal: controller.signal});
        if (!response.ok) throw new ApiError("events", response.status, {});
        const reader = response.body.getReader(), decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, {stream: true});
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            let kind = "message", data = "", id = null;
            for (const line of block.split("\n")) {
              if (line.startsWith("event: ")) kind = line.slice(7);
              else if (line.startsWith("data: ")) data += line.slice(6);
              else if (line.startsWith("id: ")) id = Number(line.slice(4));
            }
            if (!data) continue;
            if (id !== null) next = id + 1;
            if (kind === "end") { ended = true; if (onEnd) onEnd(); return; }
            onEvent(kind, JSON.parse(data));
          }
        }
      } catch (err) {
        if (controller.signal.aborted) return;
      }
      await new Promise(r => setTimeout(r, 1000));
    }
  }
  run();
  return {stop: () => controller.abort()};
}

window.api = {TOKEN_KEY, takeTokenFromUrl, apiGet, apiPost, followEvents, ApiError};
