"""Pre-quantised 4-bit checkpoint formats (GPTQ, AWQ): bytes of their packed weights and metadata.

Unlike bitsandbytes (nf4 / int8, quantised while loading: see states.py), these checkpoints are
published already quantised and loaded as they are. Both store 4-bit weights packed eight to an
int32, and per group of 128 input features one fp16 scale and one 4-bit zero point per output
column (zeros packed eight to an int32):

* GPTQ (Frantar et al. 2022, arXiv 2210.17323), AutoGPTQ's QuantLinear buffers
  (github.com/AutoGPTQ/AutoGPTQ, auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py, read 2026-11-23):
  qweight int32 (in/32*bits, out), qzeros int32 (ceil(in/group), out/32*bits),
  scales float16 (ceil(in/group), out), g_idx int32 (in) - the act-order group of every input row.
* AWQ (Lin et al. 2023, arXiv 2306.00978), AutoAWQ's WQLinear_GEMM buffers
  (github.com/casper-hansen/AutoAWQ, awq/modules/linear/gemm.py, read 2026-11-23):
  qweight int32 (in, out/8), qzeros int32 (in/group, out/8), scales float16 (in/group, out); no g_idx.

Group size 128 and 4 bits are the published defaults of both (AutoGPTQ BaseQuantizeConfig
group_size=128; AutoAWQ quant_config {"w_bit": 4, "q_group_size": 128}) and of nearly every
GPTQ/AWQ checkpoint on the model hub. Embeddings, norms and lm_head stay in fp16/bf16.
For training (LoRA on the frozen base) both kernels de-quantise one layer's weight to 16 bits
in forward and again in backward, like bitsandbytes: the same one-weight transient.
"""

from __future__ import annotations

from trainfit.core.memory.stats import ModelStats
from trainfit.core.models.spec import ModelSpec
from trainfit.core.runtime import BITSANDBYTES, runtime_of
from trainfit.core.setup import TrainingSetup

BITS = 4
GROUP_SIZE = 128
SCALE_BYTES = 2  # float16
ZERO_BITS = 4  # one packed 4-bit zero point per group and output column


def packed_bytes_per_param() -> float:
    """The 4-bit weights themselves: 0.5 B per parameter."""
    return BITS / 8


def experts_left_dense(st: ModelStats, setup: TrainingSetup) -> bool:
    """bitsandbytes leaves the MoE experts 16-bit: transformers >= 5 holds them as fused 3-D
    parameters, not the nn.Linear modules it replaces (TrainingSetup.experts_fused)."""
    return bool(st.experts) and runtime_of(setup).experts_fused and setup.quant in BITSANDBYTES


def dense_experts_text(st: ModelStats) -> str:
    """Why an MoE's experts stay 16-bit under bitsandbytes (experts_left_dense): for estimate and plan."""
    return (f"transformers >= 5 holds its {st.experts / 1e9:.1f}B expert parameters as fused 3-D tensors, which "
            "bitsandbytes leaves 16-bit (bitsandbytes#1849); transformers 4 quantises them per expert "
            "(--transformers-version 4.57)")


def quantised_linear_params(st: ModelStats, setup: TrainingSetup) -> int:
    """Parameters of the linear weights `setup.quant` stores quantised (lm_head apart)."""
    return st.linear - (st.experts if experts_left_dense(st, setup) else 0)


def stored_bytes_per_param(quant: str) -> float:
    """Stored bytes of one quantised linear weight element: 4-bit bitsandbytes (nf4, nf4-dq) and
    the packed GPTQ / AWQ words 0.5 B, LLM.int8 1 B (scales and zero points apart)."""
    return 1.0 if quant == "int8" else packed_bytes_per_param()


def metadata_bytes_per_param() -> float:
    """Scales and zero points per parameter: (2 + 0.5) B per 128 weights = 0.0195 B."""
    return (SCALE_BYTES + ZERO_BITS / 8) / GROUP_SIZE


def group_index_bytes(spec: ModelSpec, quant: str) -> float:
    """GPTQ's g_idx: one int32 per input feature of every quantised linear layer (AWQ has none)."""
    if quant != "gptq":
        return 0.0
    from trainfit.core.models.params import linear_layers

    return 4.0 * sum(x.count * x.in_features for x in linear_layers(spec) if x.kind != "lm_head" and not x.vision)


def describe(quant: str) -> tuple[str, str]:
    """(what the weights are, what the overhead is) for the estimate's component lines."""
    name = quant.upper()
    weights = f"linear weights {name} 4-bit packed in int32 (0.5 B/param); embeddings, norms, lm_head in 16-bit"
    extra = " + g_idx int32 per input feature" if quant == "gptq" else ""
    overhead = (f"{name} group 128: fp16 scale + 4-bit zero per group and column "
                f"({metadata_bytes_per_param():.4f} B/param){extra}")
    return weights, overhead
