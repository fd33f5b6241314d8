"""Every request field docs/api.md lists as not taken is refused with a 400 naming it, on both endpoints."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from deployments.openai.errors import APIError
from deployments.openai.protocol import ChatCompletionRequest, CompletionRequest
from deployments.openai.request_body import validate_body

API_PAGE = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()
SECTION = API_PAGE[API_PAGE.index("## Request fields Spout does not take") :].split("\n## ")[0]
FIELDS = sorted(
    {name for row in SECTION.splitlines() if row.startswith("| `") for name in re.findall(r"`(\w+)`", row.split("|")[1])} - {"echo", "logprobs", "n"}
)
VALUES: dict[str, object] = {"best_of": 3, "suffix": "x", "functions": [], "metadata": {}, "audio": {}, "web_search_options": {}, "guided_json": {}}
BODIES = {
    CompletionRequest: {"model": "m", "prompt": "x"},
    ChatCompletionRequest: {"model": "m", "messages": [{"role": "user", "content": "x"}]},
}


def test_the_api_page_lists_the_fields():
    assert {"suffix", "functions", "guided_json", "cache_salt"} <= set(FIELDS)


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("model", list(BODIES), ids=["completions", "chat"])
def test_a_field_spout_does_not_take_is_a_400_naming_it(model, name):
    raw = json.dumps({**BODIES[model], name: VALUES.get(name, 1)}).encode()
    with pytest.raises(APIError) as refused:
        asyncio.run(validate_body(raw, 32, model)).sampling_params()
    assert refused.value.status == 400 and refused.value.param == name
