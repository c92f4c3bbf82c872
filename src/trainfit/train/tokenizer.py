"""The run's tokenizer: a local one, or a byte-level BPE trained on the run's own corpus.

No model hub is reachable, so pretraining (and catalog models built with random weights) need
a tokenizer made here. Byte-level BPE (the GPT-2 / Llama-3 family scheme) never meets an
unknown character. The trained tokenizer is saved in the run directory and reused on resume,
so token ids never change under a resumed run.
"""

from __future__ import annotations

from pathlib import Path

from trainfit.errors import BadInputError, UnavailableError

SPECIAL = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>", "unk_token": "<|unk|>"}
# A minimal chat format for trained tokenizers (which come without one), so chat data works.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}<|eos|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_bpe_tokenizer(texts, vocab_size: int, out_dir: Path):
    """Train a byte-level BPE on an iterator of strings and save it as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)
    fast.chat_template = CHAT_TEMPLATE
    save_tokenizer_atomic(fast, Path(out_dir))
    return fast


def save_tokenizer_atomic(tokenizer, out_dir: Path) -> Path:
    """Save into a temporary sibling and rename it into place (an existing out_dir, e.g. a
    half-written one from before, is replaced): out_dir is either complete or absent."""
    from trainfit.files import atomic_dir

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out_dir, replace=True) as tmp:
        tokenizer.save_pretrained(str(tmp))
    return out_dir


def load_tokenizer(path: str | Path, key: str = "tokenizer.path", *, hub: bool = False):
    """Load a local tokenizer (hub=True: a Hub id, downloaded or from the cache). Adds a pad token
    when the tokenizer has none."""
    from transformers import AutoTokenizer

    from trainfit.train.hub_access import offline_hint, offline_reason

    offline = offline_reason() if hub else None  # one quick probe, not the Hub client's minute of retries
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=not hub or offline is not None)
    except (OSError, ValueError) as exc:
        if offline is not None:
            raise UnavailableError(f"{key}: {path} is not in the Hugging Face cache and the Hub is not asked: "
                                   f"{offline}", hint=offline_hint(str(path))) from None
        if hub:
            raise UnavailableError(f"{key}: cannot load the tokenizer of {path} from the Hugging Face Hub or its "
                                   f"cache: {str(exc).splitlines()[0]}") from None
        raise BadInputError(f"{key}: cannot load a tokenizer from {path}: {str(exc).splitlines()[0]}") from None
    if tok.pad_token is None:
        # Padding is masked out of the loss, so reusing EOS is safe (the usual choice).
        tok.pad_token = tok.eos_token
    if tok.chat_template is None:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def has_tokenizer_files(path: str | Path) -> bool:
    p = Path(path)
    return any((p / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))
