"""vLLM's ``prompt_logprobs`` and an echo's legacy ``logprobs``, from engine prompt logprobs and token strings."""

from __future__ import annotations

from deployments.openai.logprobs import LogprobEntry, prompt_logprob_entries, prompt_logprob_token_ids, vllm_prompt_logprobs
from deployments.openai.responses import ResponseFormat
from detok import TokenString
from sampling.token_logprobs import PromptLogprobs, TokenLogprobs

# Prompt "A B C": B is the top token after A; C ranks 3rd after B, under X and Y.
PROMPT = PromptLogprobs([1, 2, 3], [TokenLogprobs(-0.1, 1, [2, 9], [-0.1, -2.5]), TokenLogprobs(-3.0, 3, [7, 8], [-0.5, -1.5])])
NAMES = {1: "A", 2: " B", 3: " C", 7: " X", 8: " Y", 9: " Z"}


def scored():
    ids = prompt_logprob_token_ids(PROMPT)
    assert ids == [1, 2, 2, 9, 3, 7, 8]
    return prompt_logprob_entries(PROMPT, tuple(TokenString(NAMES[i], NAMES[i].encode()) for i in ids))


def test_vllm_prompt_logprobs_hold_the_actual_token_and_the_top_n():
    field = vllm_prompt_logprobs(scored(), num_top=2)
    assert field[0] is None
    assert field[1] == {"2": {"logprob": -0.1, "rank": 1, "decoded_token": " B"}, "9": {"logprob": -2.5, "rank": 2, "decoded_token": " Z"}}
    assert list(field[2]) == ["3", "7", "8"] and field[2]["3"]["rank"] == 3 and field[2]["8"]["rank"] == 2
    assert [list(ranked) for ranked in vllm_prompt_logprobs(scored(), num_top=0)[1:]] == [["2"], ["3"]]


def test_echo_logprobs_start_with_the_prompt_whose_first_token_has_none():
    fmt = ResponseFormat.new("cmpl-1", "m", chat=False, echo_logprobs=1)
    generated = [LogprobEntry(TokenString(" D", b" D"), -0.7, [(TokenString(" D", b" D"), -0.7)])]
    field = fmt.echo_logprobs_field(generated, scored())
    assert field == {
        "tokens": ["A", " B", " C", " D"],
        "token_logprobs": [None, -0.1, -3.0, -0.7],
        "top_logprobs": [None, {" B": -0.1}, {" X": -0.5}, {" D": -0.7}],
        "text_offset": [0, 1, 3, 5],
    }


def test_prompt_logprobs_go_on_each_completion_choice_and_once_on_a_chat_response():
    prompts = [scored(), scored()]
    completion = ResponseFormat.new("cmpl-1", "m", chat=False, prompt_logprobs=1)
    body = completion.add_prompt_logprobs(completion.full([{"index": 0}, {"index": 1}], {}), prompts)
    assert [len(choice["prompt_logprobs"]) for choice in body["choices"]] == [3, 3] and "prompt_logprobs" not in body
    chat = ResponseFormat.new("chatcmpl-1", "m", chat=True, prompt_logprobs=1)
    body = chat.add_prompt_logprobs(chat.full([{"index": 0}, {"index": 1}], {}), prompts)
    assert len(body["prompt_logprobs"]) == 3 and all("prompt_logprobs" not in choice for choice in body["choices"])
    plain = ResponseFormat.new("cmpl-2", "m", chat=False)
    assert plain.add_prompt_logprobs(plain.full([{"index": 0}], {}), [None]) == plain.full([{"index": 0}], {})
