"""Reading request bodies, for both processes: size limit, strict JSON, query pages."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from edgefire.contract.errors import InvalidInputError, RequestTooLargeError

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
    Its fields are checked by a schema next (edgefire.contract.validation.Checker)."""
    return parse_json(await read_body(request, max_bytes))


def given(body: dict[str, Any], key: str, default: Any = None) -> Any:
    """body[key] from a body the schema passed; null counts as absent."""
    value = body.get(key)
    return default if value is None else value


def page_number(query: Mapping[str, str], key: str, default: int) -> int:
    """A query's `page`-like parameter: 1..MAX_PAGE, else 5006 naming it."""
    raw = query.get(key)
    if raw is None:
        return default
    if not _PAGE.fullmatch(raw) or not 1 <= int(raw) <= MAX_PAGE:
        raise InvalidInputError(f"{key} must be an integer from 1 to {MAX_PAGE}", field=key)
    return int(raw)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")
