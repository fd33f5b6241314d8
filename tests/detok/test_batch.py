"""Batch contract: isolation of bad items, no-ops, purity, bounded state, special tokens, token strings."""

from __future__ import annotations

import pickle

import pytest
from streaming import HiddenDecoder, split, stream
from tokenizers import Tokenizer

from detok import DetokItem, DetokState, TokenString, detokenize_batch, initial_state
from sampling.params import SamplingParams


@pytest.fixture
def fresh(tokenizer: Tokenizer) -> DetokState:
    return initial_state(tokenizer, tokenizer.encode("Hi").ids, SamplingParams(stop=["zz"]))


def test_bad_ids_fail_only_their_item(tokenizer: Tokenizer, fresh: DetokState) -> None:
    good = tokenizer.encode(" fine").ids
    items = [
        DetokItem(fresh, good),
        DetokItem(fresh, [5, -1]),
        DetokItem(fresh, [49152]),
        DetokItem(fresh, ["x"]),  # type: ignore[list-item]
        DetokItem(fresh, good, logprob_token_ids=[10**9]),
        DetokItem(fresh, good),
    ]
    results = detokenize_batch(tokenizer, items)
    assert [r.error is None for r in results] == [True, False, False, False, False, True]
    assert results[0].text == results[5].text == " fin"  # "e" held back for the 2-char stop
    assert all(r.state is fresh and r.text == "" for r in results[1:5])
    assert "-1" in results[1].error and "49152" in results[2].error and "not an int" in results[3].error


class ExplodingTokenizer(HiddenDecoder):
    """Fails to decode any sequence holding id 42 (its hidden decoder makes every item decode)."""

    def decode_batch(self, seqs, skip_special_tokens=True):
        if any(42 in s for s in seqs):
            raise RuntimeError("boom")
        return self._inner.decode_batch(seqs, skip_special_tokens=skip_special_tokens)


def test_tokenizer_error_fails_only_its_item(tokenizer: Tokenizer, fresh: DetokState) -> None:
    items = [DetokItem(fresh, [42]), DetokItem(fresh, [70], finished=True)]
    results = detokenize_batch(ExplodingTokenizer(tokenizer), items)
    assert "boom" in results[0].error and results[0].state is fresh
    assert results[1].error is None and results[1].text == "V"


def test_empty_ids_is_a_no_op_and_calls_are_pure(tokenizer: Tokenizer, fresh: DetokState) -> None:
    (noop,) = detokenize_batch(tokenizer, [DetokItem(fresh, [])])
    assert noop.state is fresh and noop.text == "" and noop.error is None
    item = DetokItem(fresh, tokenizer.encode(" again and again").ids)
    assert detokenize_batch(tokenizer, [item]) == detokenize_batch(tokenizer, [item])  # retries are safe


def test_finished_request_rejects_more_ids(tokenizer: Tokenizer, fresh: DetokState) -> None:
    (done,) = detokenize_batch(tokenizer, [DetokItem(fresh, [70], finished=True)])
    assert done.state.done and done.text == "V"
    (again,) = detokenize_batch(tokenizer, [DetokItem(done.state, [70])])
    assert again.error == "request already finished"


def test_state_is_small_whatever_the_length(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Some ordinary text, 12 words long, with 😀 and 中文 in it. ").ids * 6000
    assert len(ids) > 100_000
    state = initial_state(tokenizer, [], SamplingParams(stop=["<never>"]))
    result = stream(tokenizer, state, split(ids, [7, 1, 13]), finish=False)
    assert len(result.final.state.window) <= 16 and len(result.final.state.stop_tail) == 6
    assert len(pickle.dumps(result.final.state)) < 300
    assert result.text + result.final.state.stop_tail == tokenizer.decode(ids)


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("spaces", [True, False])
def test_special_tokens_follow_decode(tokenizer: Tokenizer, skip: bool, spaces: bool) -> None:
    """``spaces_between_special_tokens`` has no effect: ``Tokenizer.decode`` has no such option."""
    ids = tokenizer.encode("<|im_start|>assistant\nHi<|im_end|><|endoftext|> 😀<|im_end|>").ids
    params = SamplingParams(skip_special_tokens=skip, spaces_between_special_tokens=spaces)
    result = stream(tokenizer, initial_state(tokenizer, [], params), [[i] for i in ids])
    assert result.text == tokenizer.decode(ids, skip_special_tokens=skip)
    assert ("<|im_end|>" in result.text) is not skip


def test_logprob_token_strings_have_exact_bytes(tokenizer: Tokenizer, fresh: DetokState) -> None:
    emoji = tokenizer.encode(" 😀").ids  # 'ĠðŁĺ' + 'Ģ': the emoji split across two tokens
    (result,) = detokenize_batch(tokenizer, [DetokItem(fresh, emoji[:1], logprob_token_ids=[*emoji, 2, 70])])
    assert result.token_strings == (
        TokenString(" \ufffd", b" \xf0\x9f\x98"),
        TokenString("\ufffd", b"\x80"),
        TokenString("<|im_end|>", b"<|im_end|>"),
        TokenString("V", b"V"),
    )
    assert b"".join(s.bytes for s in result.token_strings[:2]).decode() == " 😀"
    assert result.text == ""  # the partial character is held back


def test_stopped_request_ignores_a_later_finish(tokenizer: Tokenizer) -> None:
    """A stop hit with an unfinished character pending must not flush it on a later finish call."""
    ids = tokenizer.encode("ab STOP 😀").ids  # the emoji splits across two ids
    state = initial_state(tokenizer, [], SamplingParams(stop=["STOP"]))
    (stopped,) = detokenize_batch(tokenizer, [DetokItem(state, ids[:-1])])
    assert stopped.stop is not None and stopped.text == "ab "
    (later,) = detokenize_batch(tokenizer, [DetokItem(stopped.state, [], finished=True)])
    assert later.text == "" and later.error is None and later.state is stopped.state
