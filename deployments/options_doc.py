"""The option tables of docs/configuration.md, generated from `ServeArgs`' fields and descriptions.

``python -m deployments.options_doc`` rewrites the tables between their markers in the page;
``--check`` exits 1 when the page differs from what the fields give (``tests/deployments/test_options_doc.py``
checks the same), so the tables cannot go stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic.fields import FieldInfo

from deployments.config import ServeArgs
from deployments.limits import RequestLimits

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
# (marker name, the fields the table lists)
TABLES = (
    ("serving", [name for name in ServeArgs.model_fields if name not in RequestLimits.model_fields]),
    ("limits", list(RequestLimits.model_fields)),
)
BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"))  # the attributes of pydantic's bound metadata


def _value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _kind(field: FieldInfo) -> str:
    """The field's type as the page writes it, with its bounds (``int, ≥ 1``)."""
    kind = getattr(field.annotation, "__name__", None) or str(field.annotation).replace("pydantic.types.", "")
    kind = kind.replace(" | None", "")
    bounds = [f"{sign} {getattr(bound, attr)}" for bound in field.metadata for attr, sign in BOUNDS if getattr(bound, attr, None) is not None]
    return ", ".join([kind, *bounds])


def options_table(names: list[str]) -> str:
    """A Markdown table of ``names``: option, type and bounds, default, description."""
    rows = ["| option | type | default | what it sets |", "|---|---|---|---|"]
    for name in names:
        field = ServeArgs.model_fields[name]
        description = (field.description or "").replace("|", "\\|")
        default = "unset" if field.default is None else f"`{_value(field.default)}`"
        rows.append(f"| `{name}` | {_kind(field)} | {default} | {description} |")
    return "\n".join(rows)


def render(page: str) -> str:
    """``page`` with each table between ``<!-- options:NAME -->`` and ``<!-- /options:NAME -->`` regenerated."""
    for marker, names in TABLES:
        start, end = f"<!-- options:{marker} -->", f"<!-- /options:{marker} -->"
        head, rest = page.split(start, 1)
        _, tail = rest.split(end, 1)
        page = f"{head}{start}\n{options_table(names)}\n{end}{tail}"
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/configuration.md's tables are stale, without writing")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    current = render(page)
    if args.check:
        if current != page:
            print(f"{PAGE} is stale: run python -m deployments.options_doc", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(current)
    return 0


if __name__ == "__main__":
    sys.exit(main())
