"""The small synthetic log the checks, reader and writer tests share."""

from __future__ import annotations

from typing import Any

import pytest

from tests.mechanism.logs import small_columns


@pytest.fixture
def cols() -> dict[str, Any]:
    return small_columns()
