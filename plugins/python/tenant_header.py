"""Scope from a tenant header, limit key from one or two more: the Python twin of
plugins/tenant-header, built from the same WIT world with componentize-py."""

from typing import Optional

import wit_world
from wit_world.imports import host
from wit_world.imports.types import (
    Classification,
    Outcome,
    Outcome_Keep,
    Outcome_Reject,
    Outcome_Set,
    Rejection,
    Request,
)


class _Settings:
    """The config, read once per instance: a new config is a new load."""

    def __init__(self) -> None:
        self.scope_header = host.config("scope-header") or "x-tenant"
        self.l1_header = host.config("l1-header")
        self.l2_header = host.config("l2-header")
        self.require = host.config("require") == "true"


_settings: Optional[_Settings] = None


def _header(request: Request, name: Optional[str]) -> Optional[str]:
    if name is None:
        return None
    name = name.lower()
    for key, value in request.headers:
        if key == name:
            return value
    return None


class WitWorld(wit_world.WitWorld):
    def extract(self, request: Request) -> Outcome:
        global _settings
        if _settings is None:
            _settings = _Settings()
        settings = _settings
        tenant = _header(request, settings.scope_header)
        if tenant is None:
            if settings.require:
                return Outcome_Reject(
                    Rejection(400, f"missing tenant header '{settings.scope_header}'")
                )
            return Outcome_Keep()
        l1 = _header(request, settings.l1_header)
        l2 = _header(request, settings.l2_header)
        if l1 is not None and l2 is not None:
            limit_key: Optional[str] = f"{l1}/{l2}"
        else:
            limit_key = l1
        return Outcome_Set(Classification(scope=tenant, limit_key=limit_key))
