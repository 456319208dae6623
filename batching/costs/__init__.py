"""How long one engine step takes, the simulator's clock: the :class:`RooflineCost` of a
model on a device's datasheet, or the :class:`ProfileCost` the real engine measured on one;
both answer what :class:`batching.engine.StepCost` asks. ``models`` and ``devices`` hold the
registry shapes they are computed from.
"""

from __future__ import annotations

from .devices import DEVICES, DeviceSpec, get_device
from .models import MODELS, ModelShape, canonical_dtype, get_model
from .profile import ProfileCost, ProfileError
from .roofline import RooflineCost

__all__ = [
    "DEVICES",
    "MODELS",
    "DeviceSpec",
    "ModelShape",
    "ProfileCost",
    "ProfileError",
    "RooflineCost",
    "get_cost_model",
    "get_device",
    "get_model",
]


def get_cost_model(
    model: str, device: str, tp: int = 1, profile: str | None = None, dtype: str | None = None
) -> RooflineCost | ProfileCost:
    """The CLI's cost model: a roofline, or the profile at path ``profile`` (measured or derived
    for this model on ``tp`` such devices: its ``meta.tp``, 1 if absent, must be ``tp``)."""
    shape, dev = get_model(model), get_device(device)
    if profile is None:
        return RooflineCost(shape, dev, tp=tp, dtype=dtype)
    cost = ProfileCost.from_json(profile)
    if cost.tp != tp:
        raise ValueError(f"profile {profile} is for tp={cost.tp}, not tp={tp}: pass --tp {cost.tp}")
    if cost.model.name != shape.name or cost.device.name != dev.name:
        raise ValueError(
            f"profile {profile} was measured for {cost.model.name} on {cost.device.name}, "
            f"not {shape.name} on {dev.name}"
        )
    if dtype is not None and canonical_dtype(dtype) != cost.model.dtype:
        raise ValueError(f"profile {profile} is {cost.model.dtype}, not {canonical_dtype(dtype)}")
    return cost
