"""The test models the build makes (tests/models/make_models.py), as the tests parametrize over them: the
list comes from make_models itself, never from the folder, so a missing model file fails its test rather
than leaving it out."""
import json
import os

import pytest

import make_models

# Traced (.pt) and exported (.pt2), with PyTorch's count in NAME.json.
MODELS = sorted(make_models.MODELS)
# Hugging Face models traced as users trace them (.pt only), their NAME.json saying whether they return a loss.
AS_USERS_TRACE = sorted(make_models.AS_USERS_TRACE)


def model_file(models_dir, name, ext):
    """The path of a test model's file; fails the test when the build did not make it."""
    path = os.path.join(models_dir, name + ext)
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: the build makes it (tests/models/make_models.py {models_dir})")
    return path


def model_spec(models_dir, name):
    """NAME.json: the model's example inputs (`inputs`, as `--input` takes them) and PyTorch's counts."""
    with open(model_file(models_dir, name, ".json")) as f:
        return json.load(f)


def input_flags(spec):
    """`--input T` for each of the spec's example inputs."""
    return [a for t in spec["inputs"] for a in ("--input", t)]
