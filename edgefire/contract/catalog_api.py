"""The catalog as Workers AI lists it: `GET …/ai/models/search` and `GET …/ai/models/schema`.

A model's properties are its context window, then any catalog field named like a Workers AI
property (`price`, `function_calling`, …: _PROPERTY_IDS), then `planning_only` for models that
cannot run here. Values are strings except `price`, as Cloudflare's. Edgefire adds
`size_tier` (the catalog's: small, medium, large, huge), `miniature` (what of the model is
synthetic, for a miniature run in its place), `weight_precision` (absent where unknown) and,
for runnable models, `weight_codec` (the catalog `codec` the weights load through). Which
precision a runnable model has is the node's to say
(edgefire.runtime.weight_precision.stated_precision: it knows the codecs and its dtype); the
gateway, which loads neither, states only the published precision of planning-only models.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response

from edgefire.contract.bodies import page_number
from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.contract.envelope import success
from edgefire.contract.errors import InvalidInputError
from edgefire.contract.tasks import TASKS, task_of

_PROPERTY_IDS = ("price", "function_calling", "reasoning", "vision", "async_queue", "beta",
                 "lora", "terms", "info", "max_input_tokens", "output_dimensions", "partner",
                 "realtime", "planned_deprecation_date")

_PUBLISHED = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "int4-g32-sym": "int4"}

# A model's weight precision as a catalog listing states it; None where it is unknown.
PrecisionOf = Callable[[ModelSpec], str | None]

# Catalog fields the engine reads that Workers AI also shows, under its own name.
_RENAMED = {"dimensions": "output_dimensions"}


def author(model_id: str) -> str:
    """`meta` for `@cf/meta/llama-…`."""
    parts = model_id.split("/")
    return parts[1] if len(parts) > 2 else ""


def openai_model_list(catalog: Catalog) -> dict:
    """The runnable models as OpenAI's `GET /v1/models` lists them; a miniature says so in an
    extra `miniature` field (what of it is synthetic)."""
    data = []
    for spec in catalog.specs:
        if spec.runnable and spec.weights:
            item = {"id": spec.id, "object": "model", "created": 0, "owned_by": author(spec.id)}
            if spec.miniature:
                item["miniature"] = spec.miniature
            data.append(item)
    return {"object": "list", "data": data}


def published_precision(spec: ModelSpec) -> str | None:
    """A planning-only model's published weight dtype (catalog `config.weight_dtype`, or the
    routed experts' where they hold most weights, as Kimi's INT4 ones), named as a loaded model
    would name it; None for runnable models and where none is published."""
    if spec.runnable and spec.weights:
        return None
    config = spec.extra.get("config", {})
    published = config.get("routed_expert_dtype") or config.get("weight_dtype")
    return _PUBLISHED.get(published, published)


def model_object(spec: ModelSpec, precision_of: PrecisionOf) -> dict:
    task = task_of(spec.task)
    return {
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, spec.id)),
        "source": 1,
        "name": spec.id,
        "description": spec.description.strip(),
        "task": {"id": task.id, "name": task.name, "description": task.description},
        "tags": list(spec.extra.get("tags", ())),
        "properties": _properties(spec, precision_of(spec)),
    }


class CatalogRoutes:
    def __init__(self, catalog: Catalog, precision_of: PrecisionOf) -> None:
        self.catalog = catalog
        self.precision_of = precision_of

    async def search(self, request: Request) -> Response:
        return self.listing(request.query_params)

    def listing(self, query: QueryParams) -> Response:
        """The search answer for these query parameters (a Worker's env.AI.models() sends them
        wrapped, so they do not always come from the request's own URL)."""
        page, per_page = page_number(query, "page", 1), page_number(query, "per_page", 20)
        found = [spec for spec in self.catalog.specs if _matches(spec, query)]
        shown = found[(page - 1) * per_page:page * per_page]
        return success([model_object(spec, self.precision_of) for spec in shown],
                       {"page": page, "per_page": per_page, "count": len(shown),
                        "total_count": len(found)})

    async def schema(self, request: Request) -> Response:
        name = request.query_params.get("model")
        if not name:
            raise InvalidInputError("the model query parameter is required", field="model")
        task = TASKS[self.catalog.find(name, TASKS, runnable=False).task]
        return success({"input": task.input_schema, "output": task.output_schema})


def _matches(spec: ModelSpec, query: QueryParams) -> bool:
    task, text, who = query.get("task"), query.get("search"), query.get("author")
    if task and task.lower() not in (spec.task, task_of(spec.task).name.lower()):
        return False
    if text and text.lower() not in f"{spec.id}\n{spec.description}".lower():
        return False
    return not who or who.lower() == author(spec.id).lower()


def _properties(spec: ModelSpec, precision: str | None) -> list[dict]:
    found = {"context_window": str(spec.context_window)}
    for key, value in spec.extra.items():
        key = _RENAMED.get(key, key)
        if key in _PROPERTY_IDS:
            found[key] = value if key == "price" else _string(value)
    found["size_tier"] = spec.size_tier
    if not spec.runnable:
        found["planning_only"] = "true"
    if spec.miniature:
        found["miniature"] = spec.miniature
    if precision is not None:
        found["weight_precision"] = precision
    if spec.runnable:
        found["weight_codec"] = spec.codec
    return [{"property_id": key, "value": value} for key, value in found.items()]


def _string(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
