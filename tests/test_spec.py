"""model_specs/fun_asr_nano.json: its hyperparameters section states the typed config's defaults."""
import dataclasses

from nanoasr.checkpoints.spec import spec
from nanoasr.model.config import Config


def test_spec_hyperparameters_are_the_config_defaults():
    # The spec is read by people and tools without nanoasr; a default changed on one side only fails here.
    assert spec()["hyperparameters"] == dataclasses.asdict(Config())
