"""The seed guides' hardware scenarios (shared/seeds 000, 002, 003, 004: the hardware guides of real
projects) as a benchmark: each guide's setting beside trainfit's plan for the same goal.

For every scenario the guide names a model, a machine, a method and (mostly) a batch; it leaves
the sequence length and gradient checkpointing open. Its setting is built with the guide's knobs
(LoRA r16 / alpha 32 on q,k,v,o as seed 004's LoraConfig and PEFT's Llama default, NF4 with double
quantisation for "4-bit", ZeRO-2 for seed 003's DeepSpeed runs, the precision trainfit's rules
pick for the card) at 512 tokens (1024 for Qwen2-VL, as tests/memory/test_seeds.py assumes), and
is checked by the memory model (the `estimate` verdict) with gradient checkpointing off, then on:
the guide's setting fits when either does. The plan is `trainfit plan MODEL --hardware HW --method
M` with only the data size the guide states (preference pairs, epochs): no --seq-len, no memory
flags. The check: every scenario whose guide setting fits has at least one mode that fits.

A "minimum VRAM" row (seed 002) runs on the smallest catalog card with at least that memory:
8 GB -> RTX 3070, 12 GB -> RTX 3060, 40 GB -> A100 40GB, 60 GB -> A100 80GB. Seed 004's flavors
run on their GPU (t4-small / t4-medium: T4, a10g-large: A10G, a100-large: A100 40GB). Inference
rows (seed 002 "inference from 4 GB") are not training plans and are left out.

    .venv/bin/python bench/seed_scenarios.py              # all scenarios, ~1 min; writes bench/results/seed_scenarios.{json,md}
    .venv/bin/python bench/seed_scenarios.py --only ID    # one scenario, printed, nothing written
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

GIB = 1 << 30


@dataclass(frozen=True)
class Scenario:
    id: str
    seed: str  # which guide
    quote: str  # what the guide says
    model: str
    hardware: str  # catalog machine
    method: str  # the plan's --method (the guide's goal)
    micro_batch: int = 1
    grad_accum: int = 1
    lora: bool = False
    four_bit: bool = False
    zero_stage: int = 0
    seq_len: int = 512  # assumed: the guides do not say
    plan_args: dict = field(default_factory=dict)  # the data size the guide states (examples, epochs)


SCENARIOS = [
    # -- seed 000: Contemplative Constitutional AI (DPO) -------------------------------------------
    Scenario("000-m2-qwen2-0.5b-dpo", "000", "MacBook M2 16 GB: Qwen2-0.5B-Instruct DPO, batch 1 x accum 4, fp16, "
             "500 pairs, 3 epochs", "Qwen/Qwen2-0.5B-Instruct", "m2-16gb", "dpo", 1, 4,
             plan_args={"examples": 500, "epochs": 3.0}),
    Scenario("000-a100-qwen2.5-7b-dpo", "000", "A100 40GB or RTX 4090: Qwen2.5-7B-Instruct DPO, batch 4 x accum 8, "
             "fp16, 10K pairs, 3 epochs ('training memory ~30-35 GB')", "Qwen/Qwen2.5-7B-Instruct", "a100-40gb",
             "dpo", 4, 8, plan_args={"examples": 10000, "epochs": 3.0}),
    Scenario("000-4090-qwen2.5-7b-dpo", "000", "same on an RTX 4090 24 GB", "Qwen/Qwen2.5-7B-Instruct", "rtx-4090",
             "dpo", 4, 8, plan_args={"examples": 10000, "epochs": 3.0}),
    Scenario("000-4xa100-qwen2.5-14b-dpo", "000", "4x A100 40GB: Qwen2.5-14B-Instruct DPO, batch 2/GPU x accum 16, "
             "bf16, 40K pairs, 3 epochs", "Qwen/Qwen2.5-14B-Instruct", "4x a100-40gb", "dpo", 2, 16, zero_stage=3,
             plan_args={"examples": 40000, "epochs": 3.0}),
    Scenario("000-8xh100-qwen2.5-32b-dpo", "000", "8 GPUs (A100 40GB / H100 80GB) for 32B: Qwen2.5-32B DPO, batch "
             "2/GPU x accum 16, bf16, 40K pairs", "Qwen/Qwen2.5-32B", "8x h100-sxm", "dpo", 2, 16, zero_stage=3,
             plan_args={"examples": 40000, "epochs": 3.0}),
    # -- seed 002: Llama 3 minimums -----------------------------------------------------------------
    Scenario("002-8gb-llama3-8b-qlora", "002", "Llama 3 8B fine-tuning (4-bit + LoRA): minimum 8 GB (RTX 3070)",
             "meta-llama/Meta-Llama-3-8B", "rtx-3070", "qlora", lora=True, four_bit=True),
    Scenario("002-12gb-llama3-8b-qlora", "002", "Llama 3 8B fine-tuning (4-bit + LoRA) on an RTX 3060 12 GB",
             "meta-llama/Meta-Llama-3-8B", "rtx-3060", "qlora", lora=True, four_bit=True),
    Scenario("002-12gb-llama3-8b-dpo", "002", "Llama 3 8B DPO: minimum 12 GB (RTX 3060)", "meta-llama/Meta-Llama-3-8B",
             "rtx-3060", "dpo", lora=True, four_bit=True, plan_args={"examples": 1000}),
    Scenario("002-16gb-llama3-8b-dpo", "002", "Llama 3 8B DPO: recommended 16 GB+", "meta-llama/Meta-Llama-3-8B",
             "rtx-4060-ti-16gb", "dpo", lora=True, four_bit=True, plan_args={"examples": 1000}),
    Scenario("002-40gb-llama3-70b-qlora", "002", "Llama 3 70B fine-tuning (4-bit + LoRA): minimum 40 GB",
             "meta-llama/Meta-Llama-3-70B", "a100-40gb", "qlora", lora=True, four_bit=True),
    Scenario("002-80gb-llama3-70b-qlora", "002", "Llama 3 70B fine-tuning (4-bit + LoRA): recommended 80 GB+",
             "meta-llama/Meta-Llama-3-70B", "a100-80gb", "qlora", lora=True, four_bit=True),
    Scenario("002-60gb-llama3-70b-dpo", "002", "Llama 3 70B DPO: minimum 60 GB (smallest catalog card above: 80 GB)",
             "meta-llama/Meta-Llama-3-70B", "a100-80gb", "dpo", lora=True, four_bit=True, plan_args={"examples": 1000}),
    # -- seed 003: Qwen2-VL-2B with DeepSpeed on 2-4 GPUs -------------------------------------------
    *[Scenario(f"003-{n}x{gpu}-qwen2-vl-2b-{method}", "003", f"{n}x {gpu}: {flags}, batch {mb} x accum {acc}",
               "Qwen/Qwen2-VL-2B-Instruct", f"{n}x {gpu}", method, mb, acc, lora=method != "full",
               four_bit=method == "qlora", zero_stage=2, seq_len=1024)
      for gpu, n, mb, acc, method, flags in (
          ("rtx-4060-ti-16gb", 2, 1, 8, "qlora", "--use-4bit --use-lora"),
          ("rtx-4070", 2, 1, 8, "qlora", "--use-4bit --use-lora"),
          ("rtx-4080", 2, 1, 4, "qlora", "--use-4bit --use-lora"),
          ("rtx-4090", 2, 2, 4, "qlora", "--use-4bit --use-lora"),
          ("rtx-4090", 4, 2, 2, "lora", "--use-lora"),
          ("rtx-5060-ti", 2, 1, 4, "qlora", "--use-4bit --use-lora"),
          ("rtx-5070", 2, 1, 4, "qlora", "--use-4bit --use-lora"),
          ("rtx-5080", 2, 2, 4, "qlora", "--use-4bit --use-lora"),
          ("rtx-5090", 2, 2, 2, "lora", "--use-lora"),
          ("rtx-5090", 4, 4, 2, "full", "full precision"),
          ("a100-40gb", 2, 2, 2, "lora", "--use-lora"),
          ("a100-80gb", 2, 4, 1, "full", "full precision"),
          ("h100-sxm", 2, 4, 1, "full", "full precision"),
          ("a100-80gb", 4, 4, 1, "full", "enterprise: full precision"))],
    # -- seed 004: Hugging Face training flavors ----------------------------------------------------
    Scenario("004-t4-qwen2.5-0.5b-full", "004", "Qwen2.5-0.5B full: ~10GB, fits t4-small (batch 4-8)",
             "Qwen/Qwen2.5-0.5B", "t4", "full", 4, 2),
    Scenario("004-t4-qwen2.5-1.5b-lora", "004", "Qwen2.5-1.5B LoRA: ~6GB, fits t4-small", "Qwen/Qwen2.5-1.5B", "t4",
             "lora", 2, 4, lora=True),
    Scenario("004-t4-qwen2.5-1.5b-full", "004", "Qwen2.5-1.5B full: ~30GB, exceeds most GPUs (t4-medium)",
             "Qwen/Qwen2.5-1.5B", "t4", "full", 1, 8),
    Scenario("004-a10g-qwen2.5-7b-lora", "004", "Qwen2.5-7B LoRA: ~28GB, fits a10g-large (batch 1-2, or LoRA 4-8)",
             "Qwen/Qwen2.5-7B", "a10g", "lora", 1, 8, lora=True),
    Scenario("004-a10g-llama3-8b-lora", "004", "7-13B: a10g-large, Llama-3-8B with LoRA, batch 2-4",
             "meta-llama/Meta-Llama-3-8B", "a10g", "lora", 2, 4, lora=True),
    Scenario("004-a100-llama3-70b-lora", "004", ">13B: a100-large (40 GB) with LoRA, Llama-3-70B, batch 1-2",
             "meta-llama/Meta-Llama-3-70B", "a100-40gb", "lora", 1, 8, lora=True),
]


def guide_setup(sc: Scenario, hw, checkpointing: str):
    """The guide's setting as a TrainingSetup on this hardware (trainfit's rules fill the rest)."""
    from trainfit.core.plan.intent import resolve_setup
    from trainfit.core.setup import LoraSettings

    method = sc.method if sc.method != "dpo" else "dpo"
    return resolve_setup(hw, method, lora=LoraSettings() if sc.lora else None,
                         quant="nf4-dq" if sc.four_bit else None, micro_batch=sc.micro_batch,
                         grad_accum=sc.grad_accum, seq_len=sc.seq_len, zero_stage=sc.zero_stage,
                         grad_checkpointing=checkpointing)


def guide_verdict(sc: Scenario, hw, spec) -> dict:
    """Does the guide's setting fit (the estimate verdict), without and then with checkpointing."""
    from trainfit.core.memory import estimate_memory

    out = {}
    for ckpt in ("none", "full"):
        est = estimate_memory(spec, guide_setup(sc, hw, ckpt), hw)
        dev = max(est.devices, key=lambda d: d.needed_bytes / (d.capacity_bytes or 1) if d.device != "cpu" else 0)
        out = {"fits": est.fits, "checkpointing": ckpt, "needed_gib": round(dev.needed_bytes / GIB, 2),
               "capacity_gib": round((dev.capacity_bytes or 0) / GIB, 2)}
        if est.fits:
            break
    return out


def _setting(s) -> str:
    lora = ""
    if s.lora is not None:
        targets = s.lora.target_modules if isinstance(s.lora.target_modules, str) else ",".join(s.lora.target_modules)
        lora = f" LoRA r{s.lora.rank} on {targets}"
    parts = [s.method, s.precision, f"mb{s.micro_batch}x{s.grad_accum}", f"seq {s.seq_len}",
             f"ckpt {s.grad_checkpointing}"]
    if s.quant != "none":
        parts.append(s.quant)
    if s.zero_stage:
        parts.append(f"ZeRO-{s.zero_stage}" + (f"+{s.offload}" if s.offload != "none" else ""))
    if s.num_gpus > 1:
        parts.append(f"{s.num_gpus} GPUs")
    return " ".join(parts) + lora


def run_scenario(sc: Scenario) -> dict:
    from trainfit.core.machines.hardware_spec import resolve_hardware
    from trainfit.core.models.catalog import resolve_model
    from trainfit.core.plan.planner import PlanRequest, plan

    hw = resolve_hardware(sc.hardware)
    spec = resolve_model(sc.model)
    verdict = guide_verdict(sc, hw, spec)
    started = time.perf_counter()
    result = plan(PlanRequest(hardware=hw, method=sc.method, model=spec, **sc.plan_args))
    seconds = time.perf_counter() - started
    modes = {}
    for m in result.modes:
        modes[m.mode] = {"fits": m.fits, "setting": _setting(m.setup) if m.setup else None,
                         "needed_gib": round(m.memory_used_bytes / GIB, 2) if m.memory_used_bytes else None,
                         "budget_gib": round(m.memory_budget_bytes / GIB, 2) if m.memory_budget_bytes else None,
                         "hours": round(m.run.hours, 2) if m.run and m.run.hours is not None else None}
    return {"id": sc.id, "seed": sc.seed, "guide": sc.quote, "model": sc.model, "hardware": sc.hardware,
            "method": sc.method, "guide_setting": _setting(guide_setup(sc, hw, verdict["checkpointing"])),
            "guide_fits": verdict["fits"], "guide_needed_gib": verdict["needed_gib"],
            "capacity_gib": verdict["capacity_gib"], "plan_fits": any(m.fits for m in result.modes),
            "plan_seconds": round(seconds, 2), "modes": modes,
            "plan_flags": " ".join(f"--{k} {v:g}" if isinstance(v, float) else f"--{k} {v}"
                                   for k, v in sc.plan_args.items())}


def check(results: list[dict]) -> list[str]:
    """The benchmark's verdict: every scenario whose guide setting fits is found by the planner."""
    return [f"{r['id']}: the guide's setting fits ({r['guide_setting']}: {r['guide_needed_gib']} of "
            f"{r['capacity_gib']} GiB) but no mode of `trainfit plan` fits"
            for r in results if r["guide_fits"] and not r["plan_fits"]]


def markdown(results: list[dict], failures: list[str]) -> str:
    lines = ["# Seed guides' scenarios: the guide's setting beside trainfit's plan", "",
             "Written by `bench/seed_scenarios.py` (its docstring has the assumptions). `guide fits`: the guide's "
             "setting, checked by the memory model (the `estimate` verdict) with checkpointing off, then on. "
             "`plan`: `trainfit plan MODEL --hardware HW --method M` with only the guide's data size.", "",
             f"Check: {len(results) - len(failures)} of {len(results)} pass; every scenario whose guide setting "
             f"fits has a fitting plan: {'yes' if not failures else 'NO'}.", ""]
    lines += ["| scenario | guide says | guide setting (trainfit's check) | guide fits | conservative | balanced | "
              "extreme |", "|---|---|---|---|---|---|---|"]
    for r in results:
        cells = []
        for mode in ("conservative", "balanced", "extreme"):
            m = r["modes"].get(mode, {})
            cells.append(f"{m['setting']} ({m['needed_gib']} of {m['budget_gib']} GiB)" if m.get("fits")
                         else "nothing fits")
        verdict = f"{'yes' if r['guide_fits'] else 'no'}: {r['guide_needed_gib']} of {r['capacity_gib']} GiB"
        lines.append(f"| {r['id']} ({r['hardware']}) | {r['guide']} | {r['guide_setting']} | {verdict} | "
                     + " | ".join(cells) + " |")
    if failures:
        lines += ["", "## Failures", "", *[f"- {f}" for f in failures]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="run one scenario id, print it, write nothing")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    chosen = [s for s in SCENARIOS if args.only in (None, s.id)]
    if not chosen:
        p.error(f"--only: no scenario {args.only!r} (ids: {', '.join(s.id for s in SCENARIOS)})")
    results = []
    for sc in chosen:
        r = run_scenario(sc)
        results.append(r)
        modes = ", ".join(f"{k}: {v['setting'] if v['fits'] else 'nothing fits'}" for k, v in r["modes"].items())
        print(f"{sc.id}\n  guide: {r['guide_setting']} -> {'fits' if r['guide_fits'] else 'does not fit'} "
              f"({r['guide_needed_gib']} of {r['capacity_gib']} GiB)\n  plan:  {modes}")
    failures = check(results)
    for f in failures:
        print("FAIL", f)
    if args.only is None:
        from _results import write_results

        write_results(Path(args.out), "seed_scenarios",
                      {"scenarios": results, "failures": failures,
                       "assumptions": "seq 512 (Qwen2-VL 1024), LoRA r16/alpha 32 on q,k,v,o, NF4-dq for 4-bit, "
                                      "ZeRO-2 for seed 003, checkpointing off then on"},
                      markdown(results, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
