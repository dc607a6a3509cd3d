"""nanoasr's stages against Transformers reference outputs (tools/reference/dump.py): the stage outputs and
teacher-forced logits of one waveform, and the checks the parity tests and tools/drift/gguf_drift.py share."""
import numpy as np

from nanoasr.api import Options
from nanoasr.model import decoder, generate, prompt

# Unit-scale log-mels (transformers profile) hold 2e-4; the x32768 scale of the funasr profile puts quiet
# bins' float32 power sums at the edge of single precision, so it is held to kaldi-native-fbank's 1e-3.
FEATURE_TOL = {"transformers": dict(atol=2e-4, rtol=2e-4), "funasr": dict(atol=1e-3, rtol=0)}
STAGE_TOL = dict(atol=2e-3, rtol=2e-3)
LOGIT_TOL = dict(atol=3e-3, rtol=3e-3)


def stage_outputs(model, wave, reference, prompt_options):
    """Features, encoder, adaptor rows, prompt embeddings and ids for one waveform."""
    feats = model.features(wave, reference)
    enc = model.encode(feats)
    adapted = model.adapt(enc, reference)
    n = prompt.n_audio_tokens(feats.shape[0], reference)
    embeds, ids = model.prompt_embeds(adapted[:n], Options(reference=reference, **prompt_options))
    return dict(features=feats, encoder=enc, adaptor=adapted, embeds=embeds, prompt_ids=ids)


def teacher_forced_logits(model, embeds, forced_ids, steps, bf16_rope=False):
    # -> [steps, vocab]: prefill, then cached steps
    session = decoder.Session(model.weights, model.config.text, rows=1, bf16_rope=bf16_rope)
    out = [session.prefill(embeds, room=steps)[0]]
    for t in range(steps - 1):
        out.append(session.step([forced_ids[t]])[0])
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
    bf16_rope = reference == "funasr"
    logits = teacher_forced_logits(model, ours["embeds"], ref["greedy_ids"], steps, bf16_rope)
    np.testing.assert_allclose(logits[0, cols], ref["prefill_logits"], **LOGIT_TOL)
    np.testing.assert_allclose(logits[:, cols], ref["step_logits"], **LOGIT_TOL)
    np.testing.assert_allclose(logits[:, cols], ref["full_logits"], **LOGIT_TOL)
    gen = generate.generate([ours["embeds"]], [len(ref["greedy_ids"])], model.weights, model.config.text,
                            model.tokenizer.stop_ids, ignore_stop=True, bf16_rope=bf16_rope)[0]
    np.testing.assert_array_equal(gen.ids, ref["greedy_ids"])
    return gen.ids


def full_sequence_logits(model, embeds, ids):  # prompt + ids in one uncached forward -> [len(ids), vocab]
    x = np.concatenate([embeds, decoder.embed(ids, model.weights)])
    session = decoder.Session(model.weights, model.config.text, rows=1)
    out = []
    for end in range(len(embeds), len(x) + 1):  # a fresh prefill per length: no cached step is involved
        out.append(session.prefill(x[:end], room=len(x) - end)[0])
        session.retire(0)
    return np.stack(out)


def cases(refs, reference):
    """{name: {key: array}} of one profile from a reference .npz."""
    out = {}
    for key in refs.files:
        profile, name, field = key.split("/")
        if profile == reference:
            out.setdefault(name, {})[field] = refs[key]
    return out
