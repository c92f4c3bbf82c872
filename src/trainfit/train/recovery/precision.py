"""Which precision a run falls back to: after a streak of non-finite losses (fp16 -> bf16 ->
fp32, PrecisionPolicy watching each step) and, out of memory at the smallest split, down to
16-bit autocast (trainfit.train.recovery)."""

from __future__ import annotations

from dataclasses import dataclass

NONFINITE_STREAK = 3  # non-finite steps in a row before the precision falls back
MIN_LOSS_SCALE = 1.0  # an fp16 loss scale below this: gradients overflow even unscaled
# fp16 -> bf16 (where the device has it) -> fp32, keeping "mixed" (fp32 master weights) or "pure".
_FALLBACK = {"fp16-mixed": ("bf16-mixed", "fp32"), "fp16": ("bf16", "fp32"), "bf16-mixed": ("fp32",),
             "bf16": ("fp32",), "fp32": ()}
# Out of memory with the smallest split: fp32 -> 16-bit autocast (activations and their saved
# copies in 16 bits, about half of the activation memory; weights and optimizer stay fp32).
_MEMORY_STEP_DOWN = {"fp32": ("bf16-mixed", "fp16-mixed")}
# Non-finite steps in fp32: the accumulation is raised this many times (x2 each) before the run
# is declared diverged (exit 5).
MAX_ACCUMULATION_RAISES = 1


def next_precision(current: str, supported: tuple[str, ...] | None = None) -> str | None:
    """The precision to fall back to from `current` (None: nothing left). `supported`: what the
    device trains in (hardware_rules.DeviceRules.precisions); None: assume every one."""
    for candidate in _FALLBACK.get(current, ("fp32",) if current != "fp32" else ()):
        if supported is None or candidate in supported or candidate == "fp32":
            return candidate
    return None


def memory_precision(current: str, supported: tuple[str, ...] | None, device: str) -> str | None:
    """The 16-bit autocast precision to step down to from `current` when memory runs out (None:
    none the device trains in; fp16 never on CPU)."""
    for candidate in _MEMORY_STEP_DOWN.get(current, ()):
        if device == "cpu" and candidate.startswith("fp16"):
            continue
        if supported is None or candidate in supported:
            return candidate
    return None


@dataclass
class PrecisionPolicy:
    """Watches each optimizer step: "ok", "skip" (non-finite: drop this update) or "fallback"
    (a streak of `streak` non-finite steps, or the fp16 loss scale under `min_loss_scale`)."""

    streak: int = NONFINITE_STREAK
    min_loss_scale: float = MIN_LOSS_SCALE
    run: int = 0  # non-finite steps in a row so far
    first_bad_step: int | None = None  # the first step of the current streak

    def observe(self, step: int, nonfinite: bool) -> str:
        """One optimizer step's loss (on any rank): finite or not."""
        if not nonfinite:
            self.run, self.first_bad_step = 0, None
            return "ok"
        if self.run == 0:
            self.first_bad_step = step
        self.run += 1
        return "fallback" if self.run >= self.streak else "skip"

    def scale_collapsed(self, loss_scale: float | None) -> bool:
        """The fp16 GradScaler's scale after a step: under min_loss_scale it cannot recover."""
        return loss_scale is not None and loss_scale < self.min_loss_scale

    def reset(self) -> None:
        self.run, self.first_bad_step = 0, None


def machine_profile():
    """This machine's hardware profile, or None when it cannot be probed (best effort)."""
    try:
        from trainfit.train.predictions import hardware_profile

        return hardware_profile()
    except Exception:  # noqa: BLE001  (probes are best effort)
        return None


def supported_precisions(device: str) -> tuple[str, ...] | None:
    """The precisions `device` trains in (hardware_rules); None: not known (assume every one)."""
    from trainfit.core.plan.hardware_rules import rules_for

    profile = machine_profile()
    if profile is None:
        return ("fp32", "bf16-mixed", "bf16") if device == "cpu" else None
    try:
        return rules_for(profile, device).precisions
    except Exception:  # noqa: BLE001
        return None
