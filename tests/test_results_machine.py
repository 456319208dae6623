"""What a live run records about its machine (batching.results.load_average, machine_load)."""

from __future__ import annotations

import math

from batching import results


def test_machine_load_takes_the_highest_known_load_and_judges_it_against_the_cores(monkeypatch) -> None:
    monkeypatch.setattr(results.os, "cpu_count", lambda: 2)
    m = results.machine_load(1.5, None, 2.5, math.nan)
    assert m == {"load": 2.5, "cpus": 2.0, "busy": True}
    assert results.machine_load(0.4, 1.9) == {"load": 1.9, "cpus": 2.0, "busy": False}


def test_an_unknown_load_is_nan_and_not_busy(monkeypatch) -> None:
    monkeypatch.setattr(results.os, "cpu_count", lambda: None)
    m = results.machine_load(None, math.nan)
    assert math.isnan(m["load"]) and m["cpus"] == 1.0 and m["busy"] is False


def test_load_average_is_none_where_the_platform_has_none(monkeypatch) -> None:
    if hasattr(results.os, "getloadavg"):
        assert isinstance(results.load_average(), float)
        monkeypatch.delattr(results.os, "getloadavg")
    assert results.load_average() is None
