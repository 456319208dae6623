"""The real path's device handling (issue 14): any GPU gets an entry, CUDA that is not there
is one line, PyTorch's cached memory counts as free, and a missing load average is None."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from batching.cli import main
from batching.costs.devices import DeviceSpec
from batching.costs.profile import ProfileCost
from batching.real import hardware, measure
from batching.real.hardware import DeviceError, available_bytes, entry_for, resolve_device

pytestmark = pytest.mark.model


def test_registry_gpus_have_datasheets_and_any_other_gpu_gets_its_own_entry() -> None:
    h200 = entry_for("cuda", "NVIDIA H200")
    assert (h200.name, h200.datasheet, h200.registered) == ("H200-SXM", True, True)
    assert entry_for("cuda", "NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert entry_for("cuda", "NVIDIA A100-SXM4-80GB").name == "A100-SXM"
    rtx = entry_for("cuda", "NVIDIA GeForce RTX 4090")
    assert (rtx.name, rtx.device_name, rtx.datasheet, rtx.registered) == (
        "nvidia-geforce-rtx-4090",
        "NVIDIA GeForce RTX 4090",
        False,
        False,
    )
    cpu = entry_for("cpu", "AMD EPYC 7B13")
    assert (cpu.name, cpu.datasheet, cpu.registered) == ("cpu-here", False, True)


def test_an_unknown_gpus_profile_carries_its_measured_figures_and_loads(monkeypatch) -> None:
    """The whole measurement runs and files the GPU under its own name; its bandwidth and
    peak measured in the run make a registry entry that the simulator loads it with."""
    rtx = entry_for("cuda", "NVIDIA GeForce RTX 4090")
    monkeypatch.setattr(measure, "device_entry", lambda dev: rtx)
    grid = {"batches": [1, 2], "ctxs": [8, 16], "prefill_tokens": [4, 8], "mixed": [(4, 1, 8), (8, 1, 8)]}
    doc = measure.measure("tiny", "cpu", **grid, reps=1, bandwidth_bytes=1 << 22)
    meta = doc["meta"]
    assert (meta["device"], meta["datasheet"]) == ("nvidia-geforce-rtx-4090", False)
    spec = DeviceSpec(**meta["device_spec"])
    assert spec.bandwidth == pytest.approx(doc["device"]["bandwidth"]["matvec"]["GBps_best"] * 1e9)
    assert spec.peak("fp32") == pytest.approx(doc["device"]["matmul_peak"]["TFLOPs_best"] * 1e12)
    cost = ProfileCost.from_dict(doc, device=spec)
    assert cost.device.name == "nvidia-geforce-rtx-4090" and cost.bandwidth == spec.bandwidth
    # ...and without being told: a profile of a GPU the registry lacks carries its own entry
    alone = ProfileCost.from_dict(doc)
    assert alone.device == spec and alone.bandwidth == spec.bandwidth
    assert meta["slots"] == 2 and meta["max_len"] >= 8  # how the profile's runner was built


def test_cuda_without_cuda_is_refused_saying_why(monkeypatch) -> None:
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DeviceError, match="real runs use cpu or cuda"):
        resolve_device("meta")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    with pytest.raises(DeviceError, match=r"device='cuda': this torch .* is built without CUDA"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(DeviceError, match="torch sees no CUDA GPU"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(DeviceError, match=r"has 2 CUDA GPU\(s\), 0..1"):
        resolve_device("cuda:3")
    assert resolve_device("cuda:1") == torch.device("cuda:1")


def test_free_cuda_memory_counts_what_pytorch_caches(monkeypatch) -> None:
    """mem_get_info counts PyTorch's cache as taken; the cache's unused part is free to us."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (1_000, 80_000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev: 900)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: 300)
    assert available_bytes(torch.device("cuda")) == 1_600
    assert available_bytes(torch.device("cpu")) > 0


def _no_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["run", "--preset", "padding-pair", "--scheduler", "static", "--device", "cuda"],
            "error: device='cuda': this torch",
        ),
        (
            [
                "run",
                "--preset",
                "padding-pair",
                "--scheduler",
                "static",
                "--model",
                "llama-70b",
                "--device",
                "cpu",
            ],
            "error: llama-70b in torch.bfloat16",  # --dtype auto: too big in the smaller dtype
        ),
        (["measure", "--model", "tiny", "--device", "cuda"], "error: device='cuda': this torch"),
    ],
)
def test_real_commands_refuse_bad_devices_in_one_line(monkeypatch, capsys, args, message) -> None:
    _no_cuda(monkeypatch)
    assert main([*args, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
    assert "context" not in err  # measure: no GPU is said before any length


def test_the_cli_turns_a_model_too_big_into_its_numbers(capsys) -> None:
    args = ["run", "--preset", "padding-pair", "--scheduler", "static", "--model", "llama-70b"]
    assert main([*args, "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "needed=" in err and "available=" in err
    assert hardware.DeviceMemoryError.__mro__[1] is MemoryError  # the library keeps its own type


# ------------------------------------------------------------------ what the device is (issue 21)
def test_a_cpu_is_its_model_name_and_threads_and_a_gpu_its_name(monkeypatch) -> None:
    """Every CPU is filed as cpu-here; its machine tells an AMD EPYC at 2 threads from an
    Intel Xeon, from the same EPYC at 8 threads, and from an EPYC of other flags."""
    from batching.costs.devices import Machine, machine_of, same_machine

    monkeypatch.setattr(hardware, "_proc", lambda path, key: "Intel(R) Xeon(R) Platinum 8375C")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: "amx_bf16,avx2,avx512_bf16,avx512f")
    cpu = hardware.machine(torch.device("cpu"))
    xeon = "Intel(R) Xeon(R) Platinum 8375C"
    assert cpu == Machine("cpu", xeon, 8, "amx_bf16,avx2,avx512_bf16,avx512f")
    assert cpu.to_dict() == {
        "kind": "cpu",
        "name": xeon,
        "threads": 8,
        "flags": "amx_bf16,avx2,avx512_bf16,avx512f",
    }
    assert machine_of({"machine": cpu.to_dict()}) == cpu
    assert cpu.label == "Intel(R) Xeon(R) Platinum 8375C (8 threads, AMX)"
    # One model name, two CPUs: an EPYC with AVX-512 BF16 is not one with AVX2 only, and a
    # record written before flags were kept is neither.
    zen4, zen3 = (Machine("cpu", "AMD EPYC", 2, f) for f in ("avx2,avx512_bf16,avx512f", "avx2"))
    assert not same_machine(zen4, zen3) and zen3.label == "AMD EPYC (2 threads, AVX2)"
    assert not same_machine(zen3, Machine("cpu", "AMD EPYC", 2))
    monkeypatch.setattr(hardware, "cpu_flags", lambda: None)
    assert hardware.device_entry(torch.device("cpu")).name == "cpu-here"  # the entry cannot tell
    epyc = Machine("cpu", "AMD EPYC", 2)
    assert not same_machine(cpu, epyc) and not same_machine(epyc, Machine("cpu", "AMD EPYC", 8))
    assert same_machine(epyc, Machine("cpu", "AMD EPYC", 2)) and not same_machine(epyc, None)
    # No /proc/cpuinfo (macOS, Windows): what platform says.
    monkeypatch.setattr(hardware, "_proc", lambda path, key: None)
    monkeypatch.setattr(hardware.platform, "processor", lambda: "arm")
    assert hardware.machine(torch.device("cpu")) == Machine("cpu", "arm", 8)
    assert hardware.machine(torch.device("cpu")).label == "arm (8 threads)"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA H200")
    gpu = hardware.machine(torch.device("cuda"))
    assert gpu == Machine("cuda", "NVIDIA H200") and gpu.to_dict() == {"kind": "cuda", "name": "NVIDIA H200"}
    assert gpu.label == "NVIDIA H200"  # a GPU's threads are nobody's business


def test_an_old_profile_gets_its_machine_from_device_name_and_threads() -> None:
    """Files written before ``machine`` was recorded are not re-measured: their device_name and
    threads say it (the cpu-s profile committed on 2026-12-01: an AMD EPYC at 2 threads)."""
    from batching.costs.devices import Machine, machine_of

    meta = {
        "device": "cpu-here",
        "device_name": "AMD EPYC",
        "datasheet": False,
        "model": "cpu-s",
        "threads": 2,
    }
    assert machine_of(meta) == Machine("cpu", "AMD EPYC", 2)
    # A real executor's old record (device "cpu") and a GPU sweep's (device_type), a GPU profile.
    assert machine_of({"device": "cpu", "device_name": "AMD EPYC", "threads": 1}) == Machine(
        "cpu", "AMD EPYC", 1
    )
    sweep_meta = {"device": "H200-SXM", "device_type": "cuda", "device_name": "NVIDIA H200", "threads": 16}
    assert machine_of(sweep_meta) == Machine("cuda", "NVIDIA H200")
    assert machine_of({"device": "H200-SXM", "device_name": "NVIDIA H200"}) == Machine("cuda", "NVIDIA H200")
    # The recorded key wins over the old ones; a file that names no device has no machine.
    new = {**meta, "machine": {"kind": "cpu", "name": "Intel Xeon", "threads": 4}}
    assert machine_of(new) == Machine("cpu", "Intel Xeon", 4)
    assert machine_of({"device": "cpu-here", "threads": 1}) is None


def test_profiles_and_real_runs_record_the_machine() -> None:
    """A tiny profile, a tiny real run and a tiny live sweep each say what they ran on, as
    :func:`hardware.machine` does, in JSON."""
    import json

    from batching.real.executor import run_real
    from batching.real.sweep import decode_sweep
    from batching.request import Request
    from batching.schedulers import make_scheduler

    here = hardware.machine(torch.device("cpu")).to_dict()
    assert here["kind"] == "cpu" and here["threads"] == torch.get_num_threads()
    grid = {"batches": [1, 2], "ctxs": [8], "prefill_tokens": [4], "mixed": [(4, 1, 8)]}
    doc = measure.measure("tiny", "cpu", **grid, reps=1, bandwidth_bytes=1 << 20, peak_n=64)
    assert json.loads(json.dumps(doc["meta"]))["machine"] == here
    reqs = [Request(i, 0.0, 4, 2) for i in range(2)]
    res = run_real(
        reqs, make_scheduler("continuous", max_context=64, slots=2), "tiny", device="cpu", max_len=64
    )
    assert res.executor["machine"] == here
    sw = decode_sweep(
        model="tiny", device="cpu", batches=[1, 2], ctx=8, reps=1, peak_n=64, bandwidth_bytes=1 << 20
    )
    assert sw["meta"]["machine"] == here
