"""The transcription prompt against FunASR's own prompt builder, and the prompt's limits.

tests/fixtures/prompts_funasr.json holds what FunASR's code builds (tools/reference/prompts.py runs its
functions from the funasr wheel), with the token ids of each text piece as FunASR tokenizes them.
"""
import gzip
import json
from pathlib import Path

import pytest

from nanoasr.errors import OptionError
from nanoasr.model import prompt
from nanoasr.model.tokenizer import Tokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FUNASR = json.loads((FIXTURES / "prompts_funasr.json").read_text(encoding="utf-8"))
VARIANTS = FUNASR["variants"]
AUDIO_TOKEN_ID = 151646
# the README's names in its order, and the ISO codes transcribe.cpp lists for the variant in the same order
README_NAMES = ("中文 英文 粤语 日文 韩文 越南语 印尼语 泰语 马来语 菲律宾语 阿拉伯语 印地语 保加利亚语 "
                "克罗地亚语 捷克语 丹麦语 荷兰语 爱沙尼亚语 芬兰语 希腊语 匈牙利语 爱尔兰语 拉脱维亚语 "
                "立陶宛语 马耳他语 波兰语 葡萄牙语 罗马尼亚语 斯洛伐克语 斯洛文尼亚语 瑞典语").split()
ISO_CODES = ("zh en yue ja ko vi id th ms tl ar hi bg hr cs da nl et fi el hu ga lv lt mt pl pt ro sk sl "
             "sv").split()
CODES = dict(zip(README_NAMES, ISO_CODES))


def name(v) -> str:
    return f"{'+'.join(v['hotwords']) or 'no-hotwords'}-{v['language']}-itn={v['itn']}"


@pytest.fixture(scope="module")
def tokenizer():
    text = gzip.decompress((FIXTURES / "tiny" / "tokenizer.json.gz").read_bytes()).decode("utf-8")
    return Tokenizer(text, AUDIO_TOKEN_ID)


def test_the_fixture_names_its_source_and_covers_the_grid():
    source = FUNASR["source"]
    assert source["package"] == "funasr" and source["version"] and len(source["file_sha256"]) == 64
    grid = {(tuple(v["hotwords"]), v["language"], v["itn"]) for v in VARIANTS}
    assert len(grid) == len(VARIANTS) == 24 + 2 * 31 - 6  # zh, en, ja without hotwords are in both grids
    assert {v["language"] for v in VARIANTS} == {None, *README_NAMES}


@pytest.mark.parametrize("v", VARIANTS, ids=name)
def test_instruction_and_template_equal_funasrs(v):
    ours = prompt.instruction(v["language"], v["itn"], v["hotwords"])
    assert ours == v["instruction"]
    assert prompt.SYSTEM + ours == v["pieces"][0]
    assert prompt.SUFFIX == v["pieces"][1]
    if v["language"] is not None:  # the ISO code names the same language
        assert prompt.instruction(CODES[v["language"]], v["itn"], v["hotwords"]) == v["instruction"]


@pytest.mark.parametrize("v", VARIANTS, ids=name)
def test_token_ids_equal_funasrs_pieces_tokenized_apart(tokenizer, v):
    template = prompt.template(tokenizer, language=v["language"], itn=v["itn"], hotwords=v["hotwords"])
    ids, start = template.ids(3)
    before, after = v["ids"]
    assert start == len(before)
    assert ids.tolist() == before + [AUDIO_TOKEN_ID] * 3 + after


def test_the_default_prefix_is_the_18_tokens_funasr_uses():
    (default,) = [v for v in VARIANTS if not v["hotwords"] and v["language"] is None and v["itn"]]
    assert len(default["ids"][0]) == 18


@pytest.mark.parametrize("v", [v for v in VARIANTS if v["itn"]], ids=name)
def test_context_goes_under_funasrs_context_header(v):
    """FunASR 1.4.16's get_prompt takes no context: nanoasr's `context` is its own addition. Its text goes
    under the context header FunASR writes for hotwords, before FunASR's hotword list."""
    with_hotwords = next(w for w in VARIANTS if w["hotwords"])["instruction"]
    header = with_hotwords[:with_hotwords.index("热词列表")]
    context = "  A meeting about the 2025 budget.\n"
    ours = prompt.instruction(v["language"], v["itn"], v["hotwords"], context)
    rest = v["instruction"][len(header):] if v["hotwords"] else v["instruction"]
    assert ours == header + context.strip() + "\n" + rest


def test_blank_hotwords_and_context_add_nothing():
    assert prompt.instruction(hotwords=["", "  "], context=" \n ") == prompt.instruction()


def test_prompt_token_limit_counts_the_text_around_the_audio(tokenizer, monkeypatch):
    text_tokens = prompt.template(tokenizer).text_tokens
    assert len(prompt.template(tokenizer).ids(5)[0]) == text_tokens + 5
    monkeypatch.setattr(prompt, "MAX_PROMPT_TOKENS", text_tokens)
    prompt.template(tokenizer)
    monkeypatch.setattr(prompt, "MAX_PROMPT_TOKENS", text_tokens - 1)
    limit = f"limited to {text_tokens - 1} text tokens; hotwords and context make it {text_tokens}"
    with pytest.raises(OptionError, match=limit):
        prompt.template(tokenizer)


def test_a_context_within_the_character_limit_can_pass_the_token_limit(tokenizer):
    """Characters outside the common vocabulary take several byte tokens each."""
    context = "\U0001d306" * prompt.MAX_CONTEXT_CHARS
    prompt.instruction(context=context)  # within the character limit
    with pytest.raises(OptionError, match=f"limited to {prompt.MAX_PROMPT_TOKENS} text tokens"):
        prompt.template(tokenizer, context=context)


def test_each_mlt_language_by_code_and_english_name_gives_funasrs_prompt():
    by_name = {v["language"]: v["instruction"] for v in VARIANTS if not v["hotwords"] and v["itn"]}
    for chinese, code in CODES.items():
        assert prompt.instruction(code) == by_name[chinese]
        assert prompt.instruction(prompt.LANGUAGES[code][1].title()) == by_name[chinese]


def test_a_language_the_loaded_variant_was_not_trained_for_names_the_ones_it_was():
    nano = prompt.VARIANT_LANGUAGES["fun-asr-nano-2512"]
    assert prompt.language_code("Japanese", nano) == "ja"
    with pytest.raises(OptionError, match=r"'ko' \(ko\): the model was not trained for it; "
                                          r"its languages are zh, en, ja"):
        prompt.language_code("ko", nano)
    assert prompt.language_code("韩文", prompt.VARIANT_LANGUAGES["fun-asr-mlt-nano-2512"]) == "ko"
    with pytest.raises(OptionError, match="unknown language 'klingon'"):
        prompt.language_code("klingon")


def test_a_misspelt_language_gets_a_suggestion_among_the_model_languages_alone():
    nano = prompt.VARIANT_LANGUAGES["fun-asr-nano-2512"]
    with pytest.raises(OptionError) as err:
        prompt.language_code("englsh", nano)
    assert "unknown language 'englsh' (did you mean 'english'?)" in str(err.value)
    assert "names of zh, en, ja, or auto" in str(err.value)
    with pytest.raises(OptionError, match=r"'koreen'; accepted"):  # Korean is not among Nano's: no guess
        prompt.language_code("koreen", nano)
    with pytest.raises(OptionError, match=r"did you mean 'korean'.*names of zh, en, yue, ja, ko"):
        prompt.language_code("koreen")
