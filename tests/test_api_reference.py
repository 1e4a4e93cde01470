"""docs/api.md is what ``python tools/api_reference.py`` generates from the current docstrings,
and it covers every name of ``vedart.__all__``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import vedart

TOOL = Path(__file__).resolve().parent.parent / "tools" / "api_reference.py"


@pytest.fixture(scope="module")
def api_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("api_reference", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_page_is_current(api_reference: ModuleType) -> None:
    assert api_reference.API_PAGE.read_text(encoding="utf-8") == api_reference.render(), \
        "docs/api.md is not current: run python tools/api_reference.py"


def test_every_public_name_has_an_entry(api_reference: ModuleType) -> None:
    page = api_reference.API_PAGE.read_text(encoding="utf-8")
    assert [name for name in vedart.__all__
            if name != "__version__" and f"### `{name}`" not in page] == []


def test_a_public_name_left_out_stops_the_generator(api_reference: ModuleType,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vedart, "__all__", [*vedart.__all__, "brand_new"])
    with pytest.raises(SystemExit, match="add to SECTIONS: brand_new"):
        api_reference.render()
