"""FunASR's own transcription prompts, pinned for the prompt tests: tests/fixtures/prompts_funasr.json.

    pip download --no-deps funasr==1.4.16 -d DIR
    PY -m tools.reference.prompts DIR/funasr-1.4.16-py3-none-any.whl      (PY: with transformers)

funasr is not installed (it pulls in torch, modelscope and more): the wheel is read as a zip, and the
functions that build the prompt are taken from funasr/models/fun_asr_nano/model.py with `ast` and run alone:
`get_prompt` (hotwords, language, ITN -> instruction text), `generate_chatml` (the chat messages) and
`data_template` (messages -> system/user lists), with stand-ins for the two names their signatures mention
(`Union`, `torch.Tensor`). From `data_load_speech`, which needs the audio frontend, only two expressions are
taken and evaluated: the first-turn chat template (an f-string) and the regex that splits it at the speech
marker. Each text piece around the speech is tokenized separately, as data_load_speech does, with
`AutoTokenizer.from_pretrained(...).encode(piece)` (what FunASR's HuggingfaceTokenizer returns) on the tiny
checkpoint's tokenizer.
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import re
import shutil
import tempfile
import types
import typing
import zipfile
from itertools import product
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "prompts_funasr.json"
TINY = ROOT / "tests" / "fixtures" / "tiny"
MODEL_PY = "funasr/models/fun_asr_nano/model.py"
SPEECH = "<|startofspeech|>"
# FunASR takes the language as the model's Chinese name; None leaves the clause out.
LANGUAGES = (None, "中文", "英文", "日文")
HOTWORDS = ((), ("开放时间",), ("FunASR", "魔搭社区", "Qwen3 ASR"))
# Fun-ASR-MLT-Nano-2512's 31 names, as FunAudioLLM/Fun-ASR's README usage example lists them (each without
# hotwords, with and without ITN)
MLT_LANGUAGES = ("中文", "英文", "粤语", "日文", "韩文", "越南语", "印尼语", "泰语", "马来语", "菲律宾语", "阿拉伯语",
                 "印地语", "保加利亚语", "克罗地亚语", "捷克语", "丹麦语", "荷兰语", "爱沙尼亚语", "芬兰语", "希腊语",
                 "匈牙利语", "爱尔兰语", "拉脱维亚语", "立陶宛语", "马耳他语", "波兰语", "葡萄牙语", "罗马尼亚语",
                 "斯洛伐克语", "斯洛文尼亚语", "瑞典语")


def read_wheel(wheel: Path) -> tuple[str, bytes]:  # -> (funasr version, model.py)
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        version = re.search(r"^Version: (\S+)$", z.read(metadata).decode(), re.M).group(1)
        return version, z.read(MODEL_PY)


def prompt_builders(source: str) -> dict:
    """FunASR's get_prompt, generate_chatml and data_template as plain functions (self is unused), and the
    first-turn template and speech-splitting regex of data_load_speech."""
    names = ("get_prompt", "generate_chatml", "data_template")
    defs = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)]
    methods = {node.name: node for node in defs}
    assert all(sum(d.name == n for d in defs) == 1 for n in names + ("data_load_speech",)), "ambiguous"
    module = ast.Module(body=[methods[n] for n in names], type_ignores=[])
    torch_stub = types.SimpleNamespace(Tensor=type("Tensor", (), {}))  # named in isinstance and annotations
    scope = {"Union": typing.Union, "torch": torch_stub}
    exec(compile(module, MODEL_PY, "exec"), scope)
    load = methods["data_load_speech"]
    assigned = {}
    for node in ast.walk(load):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned.setdefault(node.targets[0].id, []).append(node.value)
    (pattern,) = assigned["pattern"]
    templates = [v for v in assigned["source_input"] if isinstance(v, ast.JoinedStr)
                 and "<|im_start|>system" in ast.unparse(v) and "<|im_start|>assistant" in ast.unparse(v)]
    assert len(templates) == 1, [ast.unparse(v) for v in templates]
    for value in assigned["do_think"]:  # True, or dataset_conf.get("do_think", True): no "<think>" block
        assert ast.literal_eval(value if isinstance(value, ast.Constant) else value.args[1]) is True
    return dict(scope, pattern=eval(compile(ast.Expression(pattern), MODEL_PY, "eval"), {"re": re}),
                template=compile(ast.Expression(templates[0]), MODEL_PY, "eval"))


def funasr_prompt(f: dict, hotwords, language, itn) -> dict:
    """FunASR's instruction and the text pieces around the speech slot, for one set of options."""
    instruction = f["get_prompt"](None, list(hotwords), language, itn)
    contents = f["data_template"](None, f["generate_chatml"](None, instruction, "example.wav"))
    roles = {"system_prompt": contents["system"][0], "user_prompt": contents["user"][0]}
    chat = eval(f["template"], {}, roles)
    splits = f["pattern"].split(chat)
    assert len(splits) == 3 and splits[1].startswith(SPEECH), splits
    return {"hotwords": list(hotwords), "language": language, "itn": itn, "instruction": instruction,
            "pieces": [splits[0], splits[2]]}


def tokenizer_dir(tmp: Path) -> Path:
    for name in ("tokenizer_config.json", "config.json"):
        shutil.copy(TINY / name, tmp / name)
    (tmp / "tokenizer.json").write_bytes(gzip.decompress((TINY / "tokenizer.json.gz").read_bytes()))
    return tmp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="funasr-*.whl from `pip download --no-deps funasr`")
    args = parser.parse_args()
    import transformers
    from transformers import AutoTokenizer

    version, source = read_wheel(args.wheel)
    f = prompt_builders(source.decode("utf-8"))
    grid = list(product(HOTWORDS, LANGUAGES, (True, False)))
    grid += list(product(((),), MLT_LANGUAGES, (True, False)))
    variants = [funasr_prompt(f, hotwords, language, itn) for hotwords, language, itn in grid]
    variants = [v for i, v in enumerate(variants) if v not in variants[:i]]  # zh/en/ja appear in both
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(Path(tmp)))
        for v in variants:
            v["ids"] = [tokenizer.encode(piece) for piece in v["pieces"]]
    fixture = {
        "source": {"package": "funasr", "version": version, "wheel": args.wheel.name,
                   "wheel_sha256": hashlib.sha256(args.wheel.read_bytes()).hexdigest(), "file": MODEL_PY,
                   "file_sha256": hashlib.sha256(source).hexdigest(),
                   "taken": "get_prompt, generate_chatml, data_template; data_load_speech's first-turn "
                            "template and speech-splitting regex"},
        "tokenizer": f"tests/fixtures/tiny tokenizer, transformers {transformers.__version__} "
                     "AutoTokenizer.encode(piece), each text piece alone",
        "variants": variants,
    }
    text = json.dumps(fixture, ensure_ascii=False, indent=1)
    for v in variants:  # one line a variant
        text = text.replace(json.dumps(v, ensure_ascii=False, indent=1).replace("\n", "\n  "),
                            json.dumps(v, ensure_ascii=False))
    OUT.write_text(text + "\n", encoding="utf-8")
    print(f"{OUT}: {len(variants)} variants from funasr {version}")


if __name__ == "__main__":
    main()
