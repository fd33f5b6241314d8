"""docs/configuration.md's option tables are what `deployments.options_doc` generates from `ServeArgs`."""

from __future__ import annotations

from deployments.config import ServeArgs
from deployments.options_doc import PAGE, main, render


def test_every_option_has_a_description():
    assert [name for name, field in ServeArgs.model_fields.items() if not field.description] == []


def test_the_page_lists_every_option_as_generated():
    page = PAGE.read_text()
    assert page == render(page), "docs/configuration.md is stale: run python -m deployments.options_doc"
    for name in ServeArgs.model_fields:
        assert f"| `{name}` |" in page, name
    assert main(["--check"]) == 0
