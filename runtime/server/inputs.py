"""Reading request bodies: size limit, JSON, the schema check, and the fields it let through."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from edgefire.runtime.catalog import Catalog, ModelSpec
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.errors import InvalidInputError, UnknownModelError
from edgefire.runtime.server.errors import RequestTooLargeError
from starlette.requests import Request

# Checked by the schema; SamplingParams.validate checks what depends on the model (top_k).
_SAMPLING_FIELDS = ("temperature", "top_p", "repetition_penalty", "frequency_penalty",
                    "presence_penalty")
# JSON Schema counts 2.0 as an integer; the engine wants Python ints.
_INTEGER_FIELDS = ("top_k", "seed")

# Past this a page holds nothing, and page * per_page must stay an SQLite (int64) offset.
MAX_PAGE = 1_000_000
_PAGE = re.compile(r"[0-9]{1,7}")  # ASCII digits: str.isdigit() also takes "²", int() does not

_TYPE_NAMES = {dict: "an object", list: "an array"}
# An escaped UTF-16 surrogate: json.loads pairs them, but leaves a lone one in the string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


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
    """raw as strict JSON of the given kind (an object unless told), else 5006.

    Strict: no NaN or Infinity (no JSON value, and they pass every range check), no lone
    surrogate (no text: it cannot be tokenized or written back), no nesting past Python's
    recursion limit.
    """
    try:
        body = json.loads(raw, parse_constant=_no_constant)
        if _SURROGATE_ESCAPE.search(raw):
            json.dumps(body, ensure_ascii=False).encode()
    except (ValueError, RecursionError):  # UnicodeError is a ValueError
        raise InvalidInputError("the request body is not valid JSON", field="body") from None
    if not isinstance(body, kind):
        raise InvalidInputError(f"the request body must be {_TYPE_NAMES[kind]}", field="body")
    return body


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object; 3006 past max_bytes (declared or read), 5006 if not JSON.
    Its fields are checked by a schema next (edgefire.runtime.server.validation.Checker)."""
    return parse_json(await read_body(request, max_bytes))


def given(body: dict[str, Any], key: str, default: Any = None) -> Any:
    """body[key] from a body the schema passed; null counts as absent."""
    value = body.get(key)
    return default if value is None else value


def sampling_params(body: dict[str, Any], max_tokens_keys: tuple[str, ...]) -> SamplingParams:
    """Sampling inputs, Workers AI defaults for the rest; the first max_tokens key given wins."""
    fields = {name: body[name] for name in _SAMPLING_FIELDS if body.get(name) is not None}
    fields |= {name: int(body[name]) for name in _INTEGER_FIELDS if body.get(name) is not None}
    for key in max_tokens_keys:
        if body.get(key) is not None:
            fields["max_tokens"] = int(body[key])
            break
    stop = body.get("stop")
    if stop is not None:
        fields["stop"] = [stop] if isinstance(stop, str) else stop
    return SamplingParams(**fields)


def reject_if_busy(body: dict[str, Any]) -> bool:
    """`options.rejectIfBusy`: a sibling of the model inputs, never one of them."""
    return given(given(body, "options", {}), "rejectIfBusy", False)


def page_number(query: Mapping[str, str], key: str, default: int) -> int:
    """A query's `page`-like parameter: 1..MAX_PAGE, else 5006 naming it."""
    raw = query.get(key)
    if raw is None:
        return default
    if not _PAGE.fullmatch(raw) or not 1 <= int(raw) <= MAX_PAGE:
        raise InvalidInputError(f"{key} must be an integer from 1 to {MAX_PAGE}", field=key)
    return int(raw)


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


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")
