// A Worker that uses env.AI as any Worker would. Under `wrangler dev --env offline` (or
// Miniflare with remoteProxyConnectionString) edgefire answers it; deployed, Workers AI does.
//
//   GET /          a plain run           GET /cached   a run through AI Gateway, cached
//   GET /stream    a streamed run        GET /error    a bad input (or ?fault=): what run() throws
//   GET /models    models() search
// Each takes ?prompt= and ?max_tokens= where it runs the model.

const MODEL = "@cf/huggingfacetb/smollm2-135m-instruct";
const GATEWAY = "default";

function inputs(url, extra = {}) {
  return {
    prompt: url.searchParams.get("prompt") ?? "What is the capital of France?",
    max_tokens: Number(url.searchParams.get("max_tokens") ?? 16),
    ...extra,
  };
}

async function plain(env, url) {
  const answer = await env.AI.run(MODEL, inputs(url));
  return Response.json({ answer, requestId: env.AI.lastRequestId });
}

async function stream(env, url) {
  const events = await env.AI.run(MODEL, inputs(url, { stream: true }));
  return new Response(events, { headers: { "content-type": "text/event-stream" } });
}

// Cached by AI Gateway: the same prompt twice gives one model call; the gateway's log of this
// call says whether the cache answered it.
async function cached(env, url) {
  const answer = await env.AI.run(MODEL, inputs(url), {
    gateway: { id: GATEWAY, cacheTtl: 3600, metadata: { route: "cached" } },
  });
  const logId = env.AI.aiGatewayLogId;
  const log = await env.AI.gateway(GATEWAY).getLog(logId);
  return Response.json({ answer, logId, cached: log.cached, metadata: log.metadata });
}

// A bad input; or, with ?fault=capacity (rate-limit, timeout, server-error), edgefire's fault
// injection failing the call as production would, to exercise a Worker's retry code.
async function error(env, url) {
  const fault = url.searchParams.get("fault");
  try {
    if (fault) {
      await env.AI.run(MODEL, inputs(url), { extraHeaders: { "x-edgefire-fault": fault } });
    } else {
      await env.AI.run(MODEL, { prompt: 42 });
    }
    return Response.json({ error: null }, { status: 500 });
  } catch (e) {
    return Response.json({ name: e.name, message: e.message }, { status: 400 });
  }
}

async function models(env, url) {
  const found = await env.AI.models({ search: url.searchParams.get("search") ?? "smollm2" });
  return Response.json(found.map((model) => model.name));
}

const ROUTES = { "/": plain, "/stream": stream, "/cached": cached, "/error": error, "/models": models };

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const route = ROUTES[url.pathname];
    if (route === undefined) {
      return new Response("not found", { status: 404 });
    }
    return route(env, url);
  },
};
