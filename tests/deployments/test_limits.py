"""Every `RequestLimits` bound refuses just over its limit, names the field and the limit, and admits at it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deployments.config import ServeArgs
from deployments.limits import MESSAGE_BYTES, RequestLimits, check_echo, check_in_flight, check_messages, check_prompts, check_sampling
from deployments.openai.errors import APIError
from sampling.params import SamplingParams

LIMITS = RequestLimits(
    max_choices_per_request=8,
    max_stop_strings=3,
    max_stop_bytes=12,
    max_bad_words=3,
    max_bad_words_bytes=12,
    max_logit_bias=4,
    max_allowed_token_ids=4,
    max_stop_token_ids=4,
    max_dry_breakers=5,
    max_dry_breakers_bytes=8,
    max_negative_prompt_bytes=10,
    max_logprob_entries=10,
    max_client_speculative_tokens=2,
    max_prompt_bytes=10,
    max_echo_choices=2,
    max_choices_in_flight=10,
    max_tools=2,
    max_beam_width=3,
    max_messages=3,
)
CHAT_LIMITS = LIMITS.model_copy(update={"max_prompt_bytes": 2 * MESSAGE_BYTES + 10})

# (request field, limit key, params at the limit, params just over it, choices)
SAMPLING_CASES = [
    ("n", "max_choices_per_request", {"n": 8}, {"n": 9}, None),
    ("stop", "max_stop_strings", {"stop": ["a", "b", "c"]}, {"stop": ["a", "b", "c", "d"]}, 1),
    ("stop", "max_stop_bytes", {"stop": ["é" * 6]}, {"stop": ["é" * 6, "x"]}, 1),
    ("bad_words", "max_bad_words", {"bad_words": ["a", "b", "c"]}, {"bad_words": ["a", "b", "c", "d"]}, 1),
    ("bad_words", "max_bad_words_bytes", {"bad_words": ["x" * 12]}, {"bad_words": ["x" * 13]}, 1),
    ("logit_bias", "max_logit_bias", {"logit_bias": {i: 1.0 for i in range(4)}}, {"logit_bias": {i: 1.0 for i in range(5)}}, 1),
    ("allowed_token_ids", "max_allowed_token_ids", {"allowed_token_ids": [1, 2, 3, 4]}, {"allowed_token_ids": [1, 2, 3, 4, 5]}, 1),
    ("stop_token_ids", "max_stop_token_ids", {"stop_token_ids": [1, 2, 3, 4]}, {"stop_token_ids": [1, 2, 3, 4, 5]}, 1),
    ("dry_sequence_breakers", "max_dry_breakers", {"dry_sequence_breakers": list("abcde")}, {"dry_sequence_breakers": list("abcdef")}, 1),
    ("dry_sequence_breakers", "max_dry_breakers_bytes", {"dry_sequence_breakers": ["🙂", "🙂"]}, {"dry_sequence_breakers": ["🙂", "🙂", "!"]}, 1),
    ("negative_prompt", "max_negative_prompt_bytes", {"negative_prompt": "x" * 10}, {"negative_prompt": "x" * 11}, 1),
    ("logprobs", "max_logprob_entries", {"logprobs": 5, "n": 2}, {"logprobs": 4, "n": 3}, None),
    ("num_speculative_tokens", "max_client_speculative_tokens", {"num_speculative_tokens": 2}, {"num_speculative_tokens": 3}, 1),
    ("n", "max_beam_width", {"n": 3, "use_beam_search": True}, {"n": 4, "use_beam_search": True}, None),
]


@pytest.mark.parametrize(("param", "key", "at_limit", "over", "choices"), SAMPLING_CASES, ids=[c[1] for c in SAMPLING_CASES])
def test_sampling_limit(param, key, at_limit, over, choices):
    def check(fields: dict) -> None:
        params = SamplingParams(**fields)
        check_sampling(LIMITS, params, params.n if choices is None else choices, server_speculative_tokens=0)

    check(at_limit)
    with pytest.raises(APIError) as refused:
        check(over)
    error = refused.value
    assert (error.status, error.param, error.code) == (413 if key == "max_negative_prompt_bytes" else 400, param, "limit_exceeded")
    assert key in error.message and str(getattr(LIMITS, key)) in error.message


def test_choices_count_every_prompt():
    check_sampling(LIMITS, SamplingParams(n=2), choices=8, server_speculative_tokens=0)
    with pytest.raises(APIError, match="max_choices_per_request"):
        check_sampling(LIMITS, SamplingParams(n=2), choices=10, server_speculative_tokens=0)


def test_speculation_up_to_the_servers_own_is_allowed():
    no_client_speculation = LIMITS.model_copy(update={"max_client_speculative_tokens": 0})
    check_sampling(no_client_speculation, SamplingParams(num_speculative_tokens=0), 1, server_speculative_tokens=0)
    check_sampling(no_client_speculation, SamplingParams(num_speculative_tokens=4), 1, server_speculative_tokens=4)
    with pytest.raises(APIError, match="synchronous") as refused:
        check_sampling(no_client_speculation, SamplingParams(num_speculative_tokens=1), 1, server_speculative_tokens=0)
    assert refused.value.param == "num_speculative_tokens"


def test_prompt_bytes_before_tokenizing():
    check_prompts(LIMITS, ["x" * 10, [1] * 50], max_model_len=64)
    for too_big in (["é" * 6], ["ok", "x" * 11]):
        with pytest.raises(APIError, match="max_prompt_bytes") as refused:
            check_prompts(LIMITS, too_big, max_model_len=64)
        assert (refused.value.status, refused.value.param) == (413, "prompt")
    with pytest.raises(APIError, match="context") as refused:
        check_prompts(LIMITS, [[1] * 64], max_model_len=64)
    assert (refused.value.status, refused.value.code, refused.value.param) == (400, "context_length_exceeded", "prompt")


def test_chat_message_bytes_together_with_a_charge_per_message():
    assert check_messages(CHAT_LIMITS, ["x" * 5, "y" * 5], num_messages=2, num_tools=0) == 2 * MESSAGE_BYTES + 10
    for texts, num_messages in ((["x" * 5, "y" * 6], 2), (["", "", ""], 3)):
        with pytest.raises(APIError, match="max_prompt_bytes") as refused:
            check_messages(CHAT_LIMITS, texts, num_messages, num_tools=0)
        assert (refused.value.status, refused.value.param) == (413, "messages")


def test_number_of_messages():
    roomy = LIMITS.model_copy(update={"max_prompt_bytes": 10**6})
    check_messages(roomy, [], num_messages=3, num_tools=0)
    with pytest.raises(APIError, match=r"4 messages .*limit of 3 \(max_messages\)") as refused:
        check_messages(roomy, [], num_messages=4, num_tools=0)
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, "messages", "limit_exceeded")


def test_messages_are_counted_before_their_bytes():
    with pytest.raises(APIError, match="max_messages"):
        check_messages(LIMITS, [""] * 30_000, num_messages=30_000, num_tools=0)


def test_number_of_tools():
    check_messages(LIMITS, [], num_messages=0, num_tools=2)
    with pytest.raises(APIError, match="max_tools") as refused:
        check_messages(LIMITS, [], num_messages=0, num_tools=3)
    assert (refused.value.status, refused.value.param) == (400, "tools")


def test_echo_choices():
    check_echo(LIMITS, echo=True, choices=2)
    check_echo(LIMITS, echo=False, choices=8)
    with pytest.raises(APIError, match="max_echo_choices") as refused:
        check_echo(LIMITS, echo=True, choices=3)
    assert refused.value.param == "echo"


def test_choices_in_flight_per_replica():
    check_in_flight(LIMITS, in_flight=6, choices=4)
    with pytest.raises(APIError, match="max_choices_in_flight") as refused:
        check_in_flight(LIMITS, in_flight=7, choices=4)
    assert (refused.value.status, refused.value.code) == (503, "too_many_choices_in_flight")


def test_limits_are_serve_options():
    args = ServeArgs(max_stop_strings="2")
    assert isinstance(args, RequestLimits) and args.max_stop_strings == 2
    defaults = ServeArgs()
    assert defaults.max_choices_per_request * 8 <= defaults.max_waiting_requests  # one request cannot fill the queue
    assert defaults.max_client_speculative_tokens == 0


def test_one_request_cannot_fill_the_waiting_queue():
    ServeArgs(max_choices_per_request=64, max_waiting_requests=256)
    with pytest.raises(ValidationError, match="max_choices_per_request"):
        ServeArgs(max_choices_per_request=65, max_waiting_requests=256)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"use_beam_search": True, "n": 2, "top_k": 5}, "top_k"),
        ({"use_beam_search": True, "n": 2, "repetition_penalty": 1.2}, "repetition_penalty"),
        ({"length_penalty": 0.5}, "length_penalty"),
        ({"early_stopping": "never"}, "early_stopping"),
    ],
)
def test_a_field_that_conflicts_with_beam_search_is_a_400_naming_it(fields, param):
    with pytest.raises(APIError) as refused:
        check_sampling(LIMITS, SamplingParams(**fields), 2, server_speculative_tokens=0)
    assert refused.value.status == 400 and refused.value.param == param and refused.value.message.startswith(f"{param}: ")


@pytest.mark.parametrize("structured_param", ["response_format", "structured_outputs"])
def test_an_output_constraint_with_beam_search_is_a_400_naming_the_field_it_came_from(structured_param):
    params = SamplingParams(use_beam_search=True, n=2, structured_outputs={"regex": "a+"})
    with pytest.raises(APIError) as refused:
        check_sampling(LIMITS, params, 2, server_speculative_tokens=0, structured_param=structured_param)
    assert refused.value.status == 400 and refused.value.param == structured_param
