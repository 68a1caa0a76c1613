"""Reading request bodies and fields: size limit, JSON, types, and the model they name."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from starlette.requests import Request

from runtime.catalog import Catalog, ModelSpec
from runtime.engine.sampling_params import SamplingParams
from runtime.errors import InvalidInputError, UnknownModelError
from runtime.server.errors import RequestTooLargeError

# Passed through as given: SamplingParams.validate checks type and range, naming the field.
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty",
                    "frequency_penalty", "presence_penalty")

_TYPE_NAMES = {bool: "a boolean", int: "an integer", str: "a string", dict: "an object",
               list: "an array"}


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body; 3006 past max_bytes, whether declared or found while reading."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise RequestTooLargeError()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:  # chunked bodies declare no length
            raise RequestTooLargeError()
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes, kind: type = dict) -> Any:
    """raw as JSON of the given kind (an object unless told), else 5006."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise InvalidInputError("the request body is not valid JSON", field="body") from None
    if not isinstance(body, kind):
        raise InvalidInputError(f"the request body must be {_TYPE_NAMES[kind]}", field="body")
    return body


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object; 3006 past max_bytes (declared or read), 5006 if not JSON."""
    return parse_json(await read_body(request, max_bytes))


def optional(body: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """body[key] if it is a `kind` (null counts as absent), else InvalidInputError naming key."""
    value = body.get(key)
    if value is None:
        return default
    # bool is an int to Python, never to a JSON schema.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InvalidInputError(f"{key} must be {_TYPE_NAMES[kind]}", field=key)
    return value


def required(body: dict[str, Any], key: str, kind: type) -> Any:
    value = optional(body, key, kind)
    if value is None:
        raise InvalidInputError(f"{key} is required", field=key)
    return value


def sampling_params(body: dict[str, Any], max_tokens_keys: tuple[str, ...]) -> SamplingParams:
    """Sampling inputs, Workers AI defaults for the rest; the first max_tokens key given wins."""
    fields = {name: body[name] for name in _SAMPLING_FIELDS if body.get(name) is not None}
    for key in max_tokens_keys:
        if body.get(key) is not None:
            fields["max_tokens"] = body[key]
            break
    stop = body.get("stop")
    if stop is not None:
        fields["stop"] = [stop] if isinstance(stop, str) else stop
    return SamplingParams(seed=optional(body, "seed", int), **fields)


def reject_if_busy(body: dict[str, Any]) -> bool:
    """`options.rejectIfBusy`: a sibling of the model inputs, never one of them."""
    return optional(optional(body, "options", dict, {}), "rejectIfBusy", bool, False)


def find_model(catalog: Catalog, name: str, tasks: Collection[str], *,
               runnable: bool = True) -> ModelSpec:
    """The spec `name` refers to, or 5007 in Workers AI's words (also if its task is not one
    of `tasks`); a model listed for planning only is a ModelUnavailableError when `runnable`."""
    try:
        spec = catalog.get_runnable(name) if runnable else catalog.get(name)
    except UnknownModelError:
        spec = None
    if spec is None or spec.task not in tasks:
        raise UnknownModelError(f"No such model {name} or task", field="model")
    return spec
