"""The LitServer of ``cdlm-serve``: the model's ``CdlmAPI`` behind ``CdlmSpec``, the page at
``/`` in place of LitServe's own, and every error in OpenAI's shape (``{"error": {"message"}}``,
which the ``openai`` client shows); a request FastAPI cannot read is answered as every refusal
is, HTTP 400 with one line (FastAPI's own is a 422 with a list)."""

from __future__ import annotations

import multiprocessing
import sys
from typing import Any

import litserve
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cdlm.serve.api import CdlmAPI
from cdlm.serve.page import page
from cdlm.serve.requests import SAMPLERS
from cdlm.serve.spec import CdlmSpec


def openai_error(message: str, status: int) -> JSONResponse:
    """An error as OpenAI's API answers one (the ``openai`` client shows its ``message``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"message": message, "type": kind, "param": None, "code": status}
    return JSONResponse({"error": body}, status_code=status)


def one_line_400(_request: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0]
    loc = [str(p) for p in first["loc"] if p != "body"]
    where = "body" if first["type"] == "json_invalid" else ".".join(loc) or "body"
    return openai_error(f"{where}: {first['msg']}", 400)


def http_error(_request: Request, error: StarletteHTTPException) -> JSONResponse:
    return openai_error(str(error.detail), error.status_code)


def build(
    ckpt: str,
    device: str,
    options: dict[str, Any],
    chat_template: str | None = None,
    max_batch_size: int = 8,
    batch_timeout: float = 0.05,
    timeout: float = 600,
) -> litserve.LitServer:
    """A server for the model ``ckpt`` (loaded as ``load_model(ckpt, device, **options)`` in
    LitServe's worker process), ready to ``run``."""
    gone = multiprocessing.get_context("spawn").Manager().dict()  # read by the worker
    api = CdlmAPI(
        ckpt,
        device,
        options,
        gone,
        chat_template,
        max_batch_size=max_batch_size,
        batch_timeout=batch_timeout,
        spec=CdlmSpec(ckpt, gone),
    )
    # one worker on a CPU slot: CdlmAPI.setup puts the model on device= itself
    server = litserve.LitServer(api, accelerator="cpu", devices=1, timeout=timeout)
    app = server.app
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != "/"]
    text = page(ckpt, SAMPLERS)
    app.add_api_route("/", lambda: HTMLResponse(text), methods=["GET"])
    app.add_exception_handler(RequestValidationError, one_line_400)
    app.add_exception_handler(StarletteHTTPException, http_error)
    return server


def serve(server: litserve.LitServer, host: str, port: int, ckpt: str) -> None:
    """Runs ``server`` on ``host:port`` until interrupted."""
    print(f"cdlm-serve: {ckpt} on http://{host}:{port}/ (API: /v1)", file=sys.stderr, flush=True)
    server.run(host=host, port=port, generate_client_file=False)
