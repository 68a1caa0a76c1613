// A wrangler dev plugin: a Worker's env.AI, answered by an edgefire gateway.
//
// wrangler.toml declares, for the environment that should run offline:
//
//   [[env.offline.unsafe.bindings]]
//   name = "AI"
//   type = "ai"
//   dev = { plugin = { package = "edgefire-wrangler-plugin", name = "edgefire-ai" },
//           options = { url = "http://127.0.0.1:8787" } }
//
// The binding stays workerd's own `Ai` class (module cloudflare-internal:ai-api), so run(),
// streams, gateway options, models() and errors behave as in production; only its inner
// `fetcher` is pointed at the gateway, through an external HTTP service.
//
// Options; the environment wrangler runs in overrides them, so one checkout can point at
// another fleet without editing wrangler.toml:
//   url    the gateway; EDGEFIRE_GATEWAY_URL; default http://127.0.0.1:8787 (`make run`'s)
//   token  an edgefire account token; EDGEFIRE_API_TOKEN. Sent as `Authorization: Bearer` with
//          every call (workerd's injectRequestHeaders). Without one, `edge-gateway dev` serves
//          the calls as its dev account, from this machine only.

const DEFAULT_URL = "http://127.0.0.1:8787";

function serviceName(binding) {
  return `edgefire-ai:${binding.name}`;
}

function settings(binding) {
  const options = binding.options ?? {};
  const url = new URL(process.env.EDGEFIRE_GATEWAY_URL || options.url || DEFAULT_URL);
  if (url.protocol !== "http:") {
    throw new Error(`edgefire-wrangler-plugin: ${url} is not an http:// URL`);
  }
  const token = process.env.EDGEFIRE_API_TOKEN || options.token;
  return { address: `${url.hostname}:${url.port || "80"}`, token };
}

export const plugins = {
  "edgefire-ai": {
    // `options` is the list of this plugin's unsafe bindings for one Worker (or undefined).
    getBindings(options = []) {
      return options.map((binding) => ({
        name: binding.name,
        wrapped: {
          moduleName: "cloudflare-internal:ai-api",
          innerBindings: [{ name: "fetcher", service: { name: serviceName(binding) } }],
        },
      }));
    },
    // Node-side bindings (getPlatformProxy) are not offered: the binding lives in workerd.
    getNodeBindings() {
      return {};
    },
    getServices({ options = [] }) {
      return options.map((binding) => {
        const { address, token } = settings(binding);
        const http = token
          ? { injectRequestHeaders: [{ name: "Authorization", value: `Bearer ${token}` }] }
          : {};
        return { name: serviceName(binding), external: { address, http } };
      });
    },
  },
};
