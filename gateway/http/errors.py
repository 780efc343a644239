"""OpenAI-style errors. Every failure the API returns has the body
``{"error": {"message", "type", "param", "code"}}``; bad input is always a 4xx, never a 500.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "timeout_error",
}


class APIError(Exception):
    """Raised anywhere in request handling; turned into a response by ``error_response``."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, retry_after: int | None = None,
                 headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.headers = headers  # extra response headers (a 429's x-ratelimit-*)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}


def error_response(err: APIError) -> Response:
    headers = dict(err.headers)
    if err.retry_after is not None:
        headers["Retry-After"] = str(err.retry_after)
    return Response(json.dumps(err.body()), status_code=err.status, headers=headers,
                    media_type="application/json")


def error_bytes(err: APIError) -> bytes:
    return json.dumps(err.body()).encode()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, code=code, param=param)


# Seconds a client is told to wait before retrying a request refused or ended by a stopping
# server: a restart (or another replica behind the balancer) takes about this long.
SHUTDOWN_RETRY_AFTER_S = 5


def server_shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry the request",
                    code="server_shutdown", retry_after=SHUTDOWN_RETRY_AFTER_S)


# Seconds a client is told to wait when Redis is unreachable: a restart takes about this long.
BACKEND_RETRY_AFTER_S = 2


def backend_unavailable() -> APIError:
    return APIError(503, "the server's backend (Redis) is unreachable; retry the request",
                    code="backend_unavailable", retry_after=BACKEND_RETRY_AFTER_S)


def output_lost() -> APIError:
    """Part of a request's output never reached Redis's new master: a Redis Cluster or
    Sentinel failover lost writes its old master had acknowledged but not yet replicated
    (``relay.py``: the token offsets show the gap)."""
    return APIError(503, "part of the output was lost in a failover of the server's backend "
                         "(Redis); retry the request", code="output_lost",
                    retry_after=BACKEND_RETRY_AFTER_S)


def request_lost() -> APIError:
    """A request Redis lost with its data before any output was written (``recovery.py``),
    or whose admission a failover lost (``relay.py``)."""
    return APIError(503, "the request was lost: the server's backend (Redis) lost its data; "
                         "retry the request", code="backend_unavailable",
                    retry_after=BACKEND_RETRY_AFTER_S)
