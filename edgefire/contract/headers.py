"""Header names both processes and the clients agree on (lower case, as ASGI gives them)."""

from __future__ import annotations

# Between gateway and nodes: the shared secret on every call, both ways (heartbeats too).
NODE_SECRET = "x-edgefire-node-secret"
# On every inference answer: the precision of the weights that made it
# (edgefire.runtime.weight_precision names the values).
WEIGHT_PRECISION = "x-edgefire-weight-precision"
# On a streamed answer: its prompt's token count, known before the first event. With the
# events relayed, the gateway can still count a stream the client left before its usage event.
PROMPT_TOKENS = "x-edgefire-prompt-tokens"
# Workers AI's request id on an answer; the gateway passes it through.
REQUEST_ID = "cf-ai-req-id"
# On every inference answer of a miniature (a big model's architecture at a small size, run in
# its place here): what of it is synthetic (ModelSpec.miniature).
MINIATURE = "x-edgefire-miniature"
# On an answer made by a stand-in model (the requested one cannot run here): the stand-in's id.
STAND_IN = "x-edgefire-stand-in"
# A request asking the gateway to fail it as production would (edgefire.gateway.faults).
FAULT = "x-edgefire-fault"
# On an answer an edge node made: the node's city (a cached answer has none).
NODE = "x-edgefire-node"
# A Worker's env.AI names the model of a run() in this header (its body holds only the inputs).
BINDING_MODEL = "cf-consn-model-id"
# From the gateway to a decode node: the prefill node (its URL) to hand the prompt's prefill to.
PREFILL_NODE = "x-edgefire-prefill-node"
# A conversation's key: the gateway keeps it on the node holding its prefix cache.
SESSION_AFFINITY = "x-session-affinity"

# AI Gateway's request headers (`cf-aig-*`) …
AIG_AUTHORIZATION = "cf-aig-authorization"
AIG_GATEWAY_ID = "cf-aig-gateway-id"
AIG_CACHE_TTL = "cf-aig-cache-ttl"
AIG_SKIP_CACHE = "cf-aig-skip-cache"
AIG_CACHE_KEY = "cf-aig-cache-key"
AIG_COLLECT_LOG = "cf-aig-collect-log"
AIG_METADATA = "cf-aig-metadata"
AIG_CUSTOM_COST = "cf-aig-custom-cost"
# … and the ones it answers with.
AIG_CACHE_STATUS = "cf-aig-cache-status"
AIG_STEP = "cf-aig-step"
AIG_LOG_ID = "cf-aig-log-id"
