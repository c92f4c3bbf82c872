"""The Hugging Face Hub client, an adapter beside hardware/: bounded HTTP (bounded_http) and Hub
models not in the catalog (models: config.json and safetensors headers, fetched once and cached).
The pure parsing (config.json -> ModelSpec) stays in core.models.loader; the core makes no request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainfit.core.models.spec import ModelSpec


def resolve_model(ref: str) -> ModelSpec:
    """trainfit.core.models.catalog.resolve_model with Hub ids ("owner/name[@revision]") read from
    the Hub (or trainfit's cache of it): what every command and the runner call."""
    from trainfit.core.models.catalog import resolve_model as resolve
    from trainfit.hub.models import load_hub_model

    return resolve(ref, hub_loader=load_hub_model)
