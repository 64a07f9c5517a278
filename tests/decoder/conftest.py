from __future__ import annotations

import pytest

from decoder.models.loading import LoadedModel
from tests.decoder.tiny import tiny_model


@pytest.fixture(scope="session")
def tiny_target() -> LoadedModel:
    return tiny_model(seed=1, name="tiny-target")


@pytest.fixture(scope="session")
def tiny_draft() -> LoadedModel:
    return tiny_model(seed=2, name="tiny-draft", hidden_size=16, layers=1)


@pytest.fixture(scope="session")
def near_draft(tiny_target: LoadedModel) -> LoadedModel:
    from tests.decoder.tiny import perturbed_copy

    return perturbed_copy(tiny_target, noise=0.02, seed=3)
