from __future__ import annotations

import pytest

from tests.support.deploy_tools import built


@pytest.fixture(scope="session")
def helm() -> str:
    return built("helm", "build")
