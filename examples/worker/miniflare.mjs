// The same Worker under Miniflare's JS API, as a test harness would run it: env.AI is the
// built-in binding with its calls proxied to edgefire (remoteProxyConnectionString).
//
//   node miniflare.mjs [path …]     default: every route once
//
// Prints one JSON line per path: {path, status, contentType, body}. The gateway is
// EDGEFIRE_GATEWAY_URL (default http://127.0.0.1:8787, `make run`'s); the calls carry no token,
// so they are served as `edge-gateway dev`'s dev account (from this machine only).
import { Miniflare } from "miniflare";

const gateway = process.env.EDGEFIRE_GATEWAY_URL || "http://127.0.0.1:8787";
const paths = process.argv.length > 2
  ? process.argv.slice(2)
  : ["/?max_tokens=8", "/stream?max_tokens=8", "/cached", "/cached", "/error", "/models"];

const mf = new Miniflare({
  modules: true,
  scriptPath: new URL("./src/index.js", import.meta.url).pathname,
  compatibilityDate: "2026-04-01",
  cf: false, // no request.cf download: everything stays on this machine
  ai: { binding: "AI", remoteProxyConnectionString: new URL("/", gateway) },
});
try {
  for (const path of paths) {
    const response = await mf.dispatchFetch(new URL(path, "http://worker.local"));
    const body = await response.text();
    const contentType = response.headers.get("content-type");
    console.log(JSON.stringify({ path, status: response.status, contentType, body }));
  }
} finally {
  await mf.dispose();
}
