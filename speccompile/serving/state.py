"""The state every route of ``speccompile serve`` shares (``serving/app.py`` builds one per app)."""
from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass, field

from fastapi import Request

from speccompile.runtime.engine import Engine
from speccompile.runtime.scheduler import Scheduler
from speccompile.serving.api import APIError
from speccompile.serving.metrics import ServerMetrics


@dataclass
class ServingState:
    """What every route needs: the scheduler (and its engine), the metrics, the served name
    and the API key. One per app; the routes only read it."""

    scheduler: Scheduler
    model_name: str
    api_key: str | None = None
    engine: Engine = field(init=False)
    metrics: ServerMetrics = field(init=False)
    created: int = field(init=False)  # the model card's "created": when the app was built

    def __post_init__(self):
        self.engine = self.scheduler.engine
        self.metrics = ServerMetrics(self.scheduler)
        self.created = int(time.time())

    def authorize(self, request: Request) -> None:
        """Raise the 401 unless the request carries ``Authorization: Bearer <api_key>``
        (compared in constant time); every request passes when no key is set."""
        if self.api_key is None:
            return
        scheme, token = _bearer(request)
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise APIError(401, "Incorrect API key provided. Send it as 'Authorization: Bearer KEY'.",
                           code="invalid_api_key")

    def tenant(self, request: Request) -> str:
        """Whose earlier requests may draft for this one (runtime/drafters/suffix.py's store): a digest
        of the API key the request was authorized with; one tenant when the server has none."""
        if self.api_key is None:
            return ""
        return hashlib.sha256(_bearer(request)[1].encode()).hexdigest()[:16]

    def max_model_len(self) -> int:
        """The longest sequence (prompt and answer) one request can have: the model's context
        window, or less when the KV cache holds fewer tokens."""
        return min(self.engine.context_window, self.scheduler.capacity_tokens)

    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "speccompile",
                "max_model_len": self.max_model_len()}


def _bearer(request: Request) -> tuple[str, str]:
    """(scheme, token) of the request's Authorization header ("", "" without one)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme, token.strip()
