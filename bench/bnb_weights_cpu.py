"""What bitsandbytes stores for a quantised base vs the memory model, loaded on this CPU.

Small models of three families are built from a config (random weights), saved, and loaded back
with transformers' BitsAndBytesConfig (nf4 and nf4-dq) on the CPU, as a QLoRA run loads its base.
The bytes of every parameter as loaded (packed 4-bit storage or 16-bit) and of the QuantStates'
absmax are counted and compared with the memory model's `weights` and `quant_overhead`
(core.memory.states.weight_bytes) for the installed transformers (TrainingSetup.experts_fused from
its version). The MoE cases show which weights bitsandbytes quantises: transformers 5 holds the
experts as fused 3-D parameters, which it leaves 16-bit (bitsandbytes#1849).

bitsandbytes is an optional extra; install it next to the project's environment to run this:

    .venv/bin/pip install bitsandbytes==0.50.2
    .venv/bin/python bench/bnb_weights_cpu.py

Not counted on either side: the QuantStates' per-weight constants (the 16-entry NF4 code, and for
nf4-dq the 256-entry code and offset of the nested state): a few hundred bytes per weight, which on
these small shapes would swamp the blocks, and on real models are noise. Writes
bench/results/bnb_weights_cpu.md and .json (a few seconds).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trainfit.core.runtime import transformers_knobs  # noqa: E402
from trainfit.core.memory.states import model_states  # noqa: E402
from trainfit.core.memory.stats import model_stats  # noqa: E402
from trainfit.core.models.loader import spec_from_config  # noqa: E402
from trainfit.core.setup import TrainingSetup  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=512, tie_word_embeddings=False)
CASES = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"]),
    "mixtral": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4,
                    num_experts_per_tok=2),
    "qwen2_moe": dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=512,
                      decoder_sparse_step=1, mlp_only_layers=[]),
}


def loaded_bytes(model) -> tuple[int, int, int]:
    """(parameter bytes as loaded, absmax bytes of the QuantStates, parameters left 16-bit)."""
    params = scales = dense = 0
    for p in model.parameters():
        params += p.numel() * p.element_size()
        state = getattr(p, "quant_state", None)
        if state is None:
            dense += p.numel() if p.element_size() == 2 else 0
            continue
        scales += state.absmax.numel() * state.absmax.element_size()
        if state.nested:
            scales += state.state2.absmax.numel() * state.state2.absmax.element_size()
    return params, scales, dense


def run_case(name: str, quant: str) -> dict:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

    raw = dict(SHAPE, **CASES[name], torch_dtype="bfloat16")
    config = AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    with tempfile.TemporaryDirectory() as d:
        AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(d)
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                                 bnb_4bit_use_double_quant=quant == "nf4-dq")
        model = AutoModelForCausalLM.from_pretrained(d, quantization_config=bnb, dtype=torch.bfloat16,
                                                     device_map="cpu")
        measured, scales, dense = loaded_bytes(model)
    spec = spec_from_config(raw, origin="bench/bnb_weights_cpu.py", model_id=f"tiny-{name}")
    setup = TrainingSetup(method="qlora", quant=quant, precision="bf16", device="cuda",
                          **transformers_knobs(transformers.__version__))
    st = model_stats(spec)
    states = model_states(spec, st, setup, 0)
    # what the model said before experts_fused: every expert quantised
    per_expert = model_states(spec, st, TrainingSetup(method="qlora", quant=quant, precision="bf16", device="cuda",
                                                      experts_fused=False), 0)
    return dict(case=name, quant=quant, transformers=transformers.__version__, experts_fused=setup.experts_fused,
                measured_param_bytes=measured, predicted_weight_bytes=int(states.weights),
                measured_scale_bytes=scales, predicted_scale_bytes=int(states.quant_overhead),
                params_left_16bit=dense, expert_params=st.experts,
                predicted_if_experts_quantised=int(per_expert.weights),
                weights_error_pct=round(100 * (states.weights - measured) / measured, 2),
                scales_error_pct=round(100 * (states.quant_overhead - scales) / scales, 2))


def write(rows: list[dict]) -> None:
    import bitsandbytes

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bnb_weights_cpu.json").write_text(json.dumps(dict(bitsandbytes=bitsandbytes.__version__, rows=rows),
                                                             indent=1) + "\n")
    lines = ["# What bitsandbytes stores vs the memory model (CPU)", "",
             f"Command: `.venv/bin/python bench/bnb_weights_cpu.py` (bitsandbytes {bitsandbytes.__version__}, "
             f"transformers {rows[0]['transformers']}; tiny models from a config, loaded with BitsAndBytesConfig "
             "on the CPU). Parameter bytes as loaded vs `weights`; QuantState absmax bytes vs `quant_overhead`.", "",
             "| case | quant | experts fused | params left 16-bit | expert params | measured param B | predicted B | "
             "error % | if experts were quantised B | measured absmax B | predicted B | error % |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = [r["case"], r["quant"], r["experts_fused"], f"{r['params_left_16bit']:,}", f"{r['expert_params']:,}",
                 f"{r['measured_param_bytes']:,}", f"{r['predicted_weight_bytes']:,}", f"{r['weights_error_pct']:+.2f}",
                 f"{r['predicted_if_experts_quantised']:,}", f"{r['measured_scale_bytes']:,}",
                 f"{r['predicted_scale_bytes']:,}", f"{r['scales_error_pct']:+.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "In the MoE cases the routed experts and the router are among the parameters left 16-bit: "
              "transformers 5 holds them as fused 3-D parameters, which bitsandbytes does not replace "
              "(TrainingSetup.experts_fused; bitsandbytes#1849)."]
    (RESULTS / "bnb_weights_cpu.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        print("bitsandbytes is not installed: .venv/bin/pip install bitsandbytes==0.50.2", file=sys.stderr)
        return 2
    rows = [run_case(name, quant) for name in CASES for quant in ("nf4", "nf4-dq")]
    for r in rows:
        print(json.dumps(r))
    write(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
