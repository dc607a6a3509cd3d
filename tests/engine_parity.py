"""Shared checks of nanoasr's stages against Transformers reference outputs (tools/reference/dump.py)."""
import numpy as np

from nanoasr.api import Options
from nanoasr.model import decoder, generate, prompt
from nanoasr.model.decoder import KVCache

# Unit-scale log-mels (transformers profile) hold 2e-4; the x32768 scale of the funasr profile puts quiet
# bins' float32 power sums at the edge of single precision, so it is held to kaldi-native-fbank's 1e-3.
FEATURE_TOL = {"transformers": dict(atol=2e-4, rtol=2e-4), "funasr": dict(atol=1e-3, rtol=0)}
STAGE_TOL = dict(atol=2e-3, rtol=2e-3)
LOGIT_TOL = dict(atol=3e-3, rtol=3e-3)


def stage_outputs(model, wave, reference, prompt_options):
    """Features, encoder, adaptor rows, prompt embeddings and ids for one waveform."""
    feats, mask = model.features([wave], reference)
    enc = model.encode(feats, mask)
    adapted = model.adapt(enc, mask, reference)
    n = prompt.n_audio_tokens(feats.shape[1], reference)
    embeds, ids = model.prompt_embeds(adapted[0, :n], Options(reference=reference, **prompt_options))
    return dict(features=feats[0], encoder=enc[0], adaptor=adapted[0], embeds=embeds, prompt_ids=ids)


def teacher_forced_logits(model, embeds, forced_ids, steps):  # -> [steps, vocab]: prefill, then cached steps
    cfg = model.config.text
    cache = KVCache(cfg, 1, len(embeds) + steps)
    out = [decoder.logits(decoder.forward(embeds[None], model.weights, cfg, cache, slice(0, 1), [0]),
                          model.weights)[0]]
    for t in range(steps - 1):
        x = decoder.embed([forced_ids[t]], model.weights)[None]
        hidden = decoder.forward(x, model.weights, cfg, cache, slice(0, 1), [len(embeds) + t])
        out.append(decoder.logits(hidden, model.weights)[0])
    return np.stack(out)


def check_case(model, ref, reference, prompt_options):
    """Every stage of one reference case; returns nanoasr's forced greedy ids."""
    ours = stage_outputs(model, ref["wave"], reference, prompt_options)
    np.testing.assert_allclose(ours["features"], ref["features"], **FEATURE_TOL[reference])
    np.testing.assert_allclose(ours["encoder"], ref["encoder"], **STAGE_TOL)
    np.testing.assert_allclose(ours["adaptor"], ref["adaptor"], **STAGE_TOL)
    np.testing.assert_array_equal(ours["prompt_ids"], ref["prompt_ids"])
    cols = ref["logit_columns"]
    steps = len(ref["step_logits"])
    logits = teacher_forced_logits(model, ours["embeds"], ref["greedy_ids"], steps)
    np.testing.assert_allclose(logits[0, cols], ref["prefill_logits"], **LOGIT_TOL)
    np.testing.assert_allclose(logits[:, cols], ref["step_logits"], **LOGIT_TOL)
    np.testing.assert_allclose(logits[:, cols], ref["full_logits"], **LOGIT_TOL)
    gen = generate.generate([ours["embeds"]], [len(ref["greedy_ids"])], model.weights, model.config.text,
                            model.tokenizer.stop_ids, ignore_stop=True)[0]
    np.testing.assert_array_equal(gen.ids, ref["greedy_ids"])
    return gen.ids


def full_sequence_logits(model, embeds, ids):  # prompt + ids in one uncached forward -> [len(ids), vocab]
    cfg = model.config.text
    x = np.concatenate([embeds, decoder.embed(ids, model.weights)])
    cache = KVCache(cfg, 1, len(x))
    out = []
    for end in range(len(embeds), len(x) + 1):  # a fresh prefill per length: no cached step is involved
        cache.lengths[:] = 0
        hidden = decoder.forward(x[None, :end], model.weights, cfg, cache, slice(0, 1), [0])
        out.append(decoder.logits(hidden, model.weights)[0])
    return np.stack(out)


def cases(refs, reference):
    """{name: {key: array}} of one profile from a reference .npz."""
    out = {}
    for key in refs.files:
        profile, name, field = key.split("/")
        if profile == reference:
            out.setdefault(name, {})[field] = refs[key]
    return out
