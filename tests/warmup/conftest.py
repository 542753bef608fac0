import pytest

from ._helpers import ROUTE_VARS


@pytest.fixture
def clean_route_env(monkeypatch):
    """No route variable, and no route table (tests/test_route_table.py covers routing by it)."""
    for name in ROUTE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FASTVIDEO_VSA_ROUTE_TABLE", "off")
