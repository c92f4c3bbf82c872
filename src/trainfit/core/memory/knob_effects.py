"""Activation offloading: saved activations moved to pinned CPU memory during the forward.

TRL's `activation_offloading` (trl/models/activation_offloading.py, from torchtune's
OffloadActivations; https://huggingface.co/docs/trl/main/en/model_utils) installs autograd
saved-tensor hooks: every saved tensor of at least 1 KiB (min_offload_size) is copied to pinned CPU
memory on a side stream, at most max_fwd_stash_size=5 tensors stay on the GPU waiting for their
copy, and in backward each layer's tensors are brought back one layer ahead of their use. The
output linear (lm_head) and the loss are not offloaded ("all but the last output Linear").

Model: the GPU keeps two layers' saved activations (the layer being back-propagated and the one
prefetched; the forward stash of 5 tensors is less than a layer), the rest of the layers' saved
activations sit in pinned host memory, one copy per rank on the host. The final norm, logits and
loss terms stay on the GPU as without offloading.
"""

from __future__ import annotations

from trainfit.core.memory_types import MemoryComponent
from trainfit.core.setup import TrainingSetup

LAYERS_IN_FLIGHT = 2  # the layer in backward + the one prefetched back from the CPU


def offload_activations(saved_layers_bytes: float, num_layers: int,
                        setup: TrainingSetup) -> tuple[float, MemoryComponent]:
    """(saved-activation bytes left on the GPU, the host component for the offloaded rest)."""
    per_layer = saved_layers_bytes / max(1, num_layers)
    on_gpu = min(saved_layers_bytes, LAYERS_IN_FLIGHT * per_layer)
    offloaded = saved_layers_bytes - on_gpu
    ranks = setup.gpus_per_node
    host = MemoryComponent("activation_offload", int(offloaded * ranks),
                           f"saved activations of {max(0, num_layers - LAYERS_IN_FLIGHT)} layers in pinned CPU memory "
                           f"({ranks} rank{'s' if ranks != 1 else ''} on this host)", True)
    return on_gpu, host
