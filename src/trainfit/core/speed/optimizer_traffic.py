"""Memory traffic of one optimizer step, shared by the GPU and CPU step-time models."""

# Bytes touched per trainable parameter by one optimizer step (reads + writes of param, grad and
# states, fp32 unless noted), e.g. AdamW: read p,g,m,v (16) + write p,m,v (12) + zero grad (4).
OPTIMIZER_BYTES = {
    "adamw": 32.0,
    "adamw-8bit": 18.0,
    "paged-adamw-8bit": 18.0,
    "paged-adamw-32bit": 32.0,  # AdamW's traffic: fp32 moments (bitsandbytes' 32-bit paged AdamW)
    "sgd": 16.0,
    "sgd-momentum": 24.0,
    "adafactor": 20.0,
    "lion": 24.0,
}
# Unfused (foreach / per-parameter) optimizers make several passes: a factor over the minimum.
OPTIMIZER_PASSES = {"gpu": 1.6, "cpu": 3.0}
