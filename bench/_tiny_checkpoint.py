"""A tiny Qwen2-architecture checkpoint with random weights, built offline, that Transformers,
LLaMA-Factory, Axolotl, torchtune and LitGPT all load: the model `bench/tool_exports.py` and
tests/export/test_tool_exports.py plan for and start short runs of the exported configs with.

Folder contents:
    config.json, model.safetensors         Qwen2ForCausalLM (2 layers, hidden 128) with random weights
    tokenizer.json, tokenizer_config.json  a byte-level BPE trained on the shipped tiny-chat set, with
    vocab.json, merges.txt                 Qwen's <|endoftext|> / <|im_start|> / <|im_end|> (torchtune
                                           reads vocab.json + merges.txt, the others tokenizer.json)
    lit_model.pth, model_config.yaml       LitGPT's format of the same shapes (its own random weights:
                                           LitGPT converts real checkpoints with convert_to_litgpt)
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# hidden 128 and no grouped KV: every linear has a multiple of 64 x 256 weights, which torchao's NF4
# (torchtune's QLoRA) needs to quantise it
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, POSITIONS = 128, 2, 4, 4, 256, 512
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def corpus_lines() -> list[str]:
    from trainfit.config.run_config import corpora_dir

    rows = [json.loads(x) for x in (corpora_dir() / "tiny-chat.jsonl").read_text().splitlines() if x.strip()]
    return [m["content"] for r in rows for m in r["messages"]] + ["user", "assistant", "system"]


def write_tokenizer(folder: Path, vocab_size: int = 384) -> int:
    """A byte-level BPE; returns its size (the model's vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_lines(), trainer)
    tok.model.save(str(folder))  # vocab.json + merges.txt (torchtune's Qwen2 tokenizer reads these)
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": POSITIONS, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None, "chat_template": CHAT_TEMPLATE,
              "add_bos_token": False, "add_prefix_space": False, "errors": "replace"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return tok.get_vocab_size()


def write_hf_model(folder: Path, vocab: int) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    ids = {t: vocab - len(SPECIALS) + i for i, t in enumerate(SPECIALS)}
    config = Qwen2Config(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=POSITIONS, tie_word_embeddings=False, rope_theta=1_000_000.0,
                         rms_norm_eps=1e-6, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"], torch_dtype="float32")
    Qwen2ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]}))


def write_litgpt_model(folder: Path, vocab: int) -> bool:
    """lit_model.pth + model_config.yaml; False when litgpt is not installed."""
    try:
        import torch
        from litgpt import GPT, Config
        from litgpt.utils import save_config
    except ImportError:
        return False
    config = Config(name="tiny-qwen2", block_size=POSITIONS, vocab_size=vocab, padded_vocab_size=vocab,
                    n_layer=LAYERS, n_head=HEADS, n_query_groups=KV_HEADS, n_embd=HIDDEN, head_size=HIDDEN // HEADS,
                    rotary_percentage=1.0, parallel_residual=False, bias=False, attn_bias=True,
                    norm_class_name="RMSNorm", norm_eps=1e-6, mlp_class_name="LLaMAMLP",
                    intermediate_size=INTERMEDIATE, rope_base=1_000_000)
    torch.manual_seed(0)
    torch.save(GPT(config).state_dict(), folder / "lit_model.pth")
    save_config(config, folder)
    return True


def build(folder: Path) -> Path:
    """The tiny checkpoint in folder (created); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder)
    write_hf_model(folder, vocab)
    write_litgpt_model(folder, vocab)
    return folder


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen2")))
