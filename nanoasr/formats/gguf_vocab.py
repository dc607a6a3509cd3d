"""The vocabulary in GGUF: tokenizer.json <-> the tokenizer.ggml.* arrays (llama.cpp's `gpt2` model)."""
from __future__ import annotations

import json

from gguf import GGUFWriter, Keys, TokenType

from nanoasr.errors import ModelError
from nanoasr.formats.gguf_read import NumericArray
from nanoasr.untrusted import short

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")  # the Qwen2 pre-tokenizer pattern (tokenizer.ggml.pre = "qwen2")


def _special_token(tokenizer_config: dict, role: str, default: str) -> str:
    value = tokenizer_config.get(role) or default
    return value.get("content", default) if isinstance(value, dict) else value


def _added_type(added: dict) -> int:
    return int(TokenType.CONTROL if added.get("special") else TokenType.USER_DEFINED)


def vocab_arrays(files: dict[str, str], vocab_size: int, where: str) -> dict:
    """tokens, token types, merges and special ids (the llama.cpp `gpt2` model) from tokenizer.json."""
    try:
        tokenizer = json.loads(files["tokenizer.json"])
        model = tokenizer["model"]
        vocab, merges = dict(model["vocab"]), list(model["merges"])
        entries = [(i, t, int(TokenType.NORMAL)) for t, i in vocab.items()]
        entries += [(a["id"], a["content"], _added_type(a)) for a in tokenizer.get("added_tokens", [])]
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:  # JSONDecodeError too
        raise ModelError(f"{where}: tokenizer.json is not a BPE tokenizer ({exc!r})") from None
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]  # ids no token uses, as llama.cpp names them
    types = [int(TokenType.UNUSED)] * vocab_size
    for i, token, kind in entries:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size:
            raise ModelError(f"{where}: tokenizer.json token {token!r} has id {i}, outside the vocabulary "
                             f"(size {vocab_size})")
        tokens[i], types[i] = token, kind
    ids = {t: i for i, t in enumerate(tokens)}
    roles = json.loads(files.get("tokenizer_config.json", "{}"))
    defaults = (("bos", "<|endoftext|>"), ("eos", "<|im_end|>"), ("pad", "<|endoftext|>"))
    special = {role: ids.get(_special_token(roles, f"{role}_token", default)) for role, default in defaults}
    return {"tokens": tokens, "types": types, "special": special,
            "merges": [m if isinstance(m, str) else " ".join(m) for m in merges]}


def add_vocab(w: GGUFWriter, files: dict[str, str], vocab_size: int, where: str) -> None:
    arrays = vocab_arrays(files, vocab_size, where)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(arrays["tokens"])
    w.add_token_types(arrays["types"])
    w.add_token_merges(arrays["merges"])
    for role, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id)):
        if arrays["special"][role] is not None:
            add(arrays["special"][role])
    w.add_add_bos_token(False)
    template = files.get("chat_template.jinja") or json.loads(files.get("tokenizer_config.json", "{}")).get(
        "chat_template")
    if template:
        w.add_chat_template(template)


def tokenizer_from_vocab(tokens: list[str], types: list[int], merges: list[str]) -> str:
    """A tokenizer.json (byte-level BPE, Qwen2 pre-tokenizer) rebuilt from tokenizer.ggml.* arrays."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind != TokenType.UNUSED}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == TokenType.CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == TokenType.USER_DEFINED])
    return tokenizer.to_str()


def tokenizer_files(values: dict, files: dict[str, str], where: str) -> dict[str, str]:
    """`files` with a tokenizer.json: the one given, else one rebuilt from the tokenizer.ggml.* arrays."""
    if "tokenizer.json" in files:
        return files
    keys = (Keys.Tokenizer.LIST, Keys.Tokenizer.TOKEN_TYPE, Keys.Tokenizer.MERGES)
    if any(values.get(k) is None for k in keys):
        raise ModelError(f"{where}: no tokenizer: neither an embedded tokenizer.json nor the "
                         f"tokenizer.ggml.tokens/token_type/merges arrays")
    tokens, types, merges = (values[k] for k in keys)
    if isinstance(types, NumericArray) and types.array.dtype.kind in "iu":
        types = types.tolist()  # the file's integers, converted now that the key is used
    for key, array, kind in zip(keys, (tokens, types, merges), (str, int, str)):
        if not isinstance(array, list) or not all(isinstance(item, kind) for item in array):
            raise ModelError(f"{where}: {key} must be an array of {kind.__name__}, "
                             f"found {short(array)}")
    if len(types) != len(tokens):
        raise ModelError(f"{where}: {Keys.Tokenizer.TOKEN_TYPE} has {len(types)} entries, expected one per "
                         f"token ({len(tokens)})")
    try:
        return dict(files, **{"tokenizer.json": tokenizer_from_vocab(tokens, types, merges)})
    except Exception as exc:  # the tokenizers library raises bare Exceptions for inputs it refuses
        raise ModelError(f"{where}: the tokenizer.ggml.* arrays do not make a BPE tokenizer "
                         f"({exc})") from None
