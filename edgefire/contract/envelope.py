"""Cloudflare's v4 success envelope (errors are rendered by edgefire.contract.http_errors)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


def success(result: Any, result_info: dict | None = None,
            headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"result": result, "success": True, "errors": [], "messages": []}
    if result_info is not None:
        body["result_info"] = result_info
    return JSONResponse(body, headers=headers)
