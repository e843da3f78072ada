import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def megatron_path(tmp_path_factory):
    """A MEGATRON_PATH with megatron-core 0.19.2 (fetched once into PLANNER_CACHE or a temporary folder), or
    None where megatron is importable as installed; skips the test where it cannot be had."""
    import planner
    from planner.check import fetch_megatron, megatron_available

    if megatron_available():
        return os.environ.get("MEGATRON_PATH")
    cache = os.environ.get("PLANNER_CACHE", str(tmp_path_factory.mktemp("megatron")))
    try:
        path = fetch_megatron(cache)
    except planner.PlannerError as e:
        pytest.skip(str(e))
    os.environ["MEGATRON_PATH"] = path
    return path
