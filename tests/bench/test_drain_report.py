"""`bench.lib.drain_report`: how `bench.drain` judges streams and counts scale-downs, without Ray."""

from __future__ import annotations

from bench.lib.drain_report import ScaleDown, StreamRecord, Verdict, cut_reason, drain_rows, failed_streams, verdict
from bench.lib.load_client import StreamResult

REFERENCES = ["abc", "xyz"]
MAX_TOKENS = 3


def finished(text: str, tokens: int = MAX_TOKENS) -> StreamResult:
    return StreamResult(text=text, tokens=tokens, done=True)


def scale_down(deployment: str, requested_s: float, drain_s: float | None = 1.0, **changes: object) -> ScaleDown:
    fields: dict[str, object] = {"before": {"RUNNING": 2}, "stopping_seen": True, "starting_seen": False, "drain_s": drain_s, "streams_live": 5}
    return ScaleDown(deployment, requested_s, **(fields | changes))


def test_a_stream_is_completed_only_with_all_its_tokens_done_and_the_reference_text():
    assert verdict(finished("abc"), "abc", MAX_TOKENS) is Verdict.COMPLETED
    assert verdict(finished("abd"), "abc", MAX_TOKENS) is Verdict.WRONG
    assert verdict(finished("ab", tokens=2), "abc", MAX_TOKENS) is Verdict.CUT
    assert verdict(StreamResult(text="abc", tokens=3), "abc", MAX_TOKENS) is Verdict.CUT  # no [DONE]
    assert verdict(StreamResult(text="abc", tokens=3, done=True, failed=True, error="engine_failed"), "abc", MAX_TOKENS) is Verdict.CUT


def test_the_cut_reason_names_what_went_wrong():
    assert cut_reason(finished("abc"), MAX_TOKENS) == ""
    assert cut_reason(StreamResult(failed=True, error="RemoteProtocolError: peer closed"), MAX_TOKENS) == "RemoteProtocolError: peer closed"
    assert cut_reason(StreamResult(failed=True), MAX_TOKENS) == "failed"
    assert cut_reason(StreamResult(tokens=3), MAX_TOKENS) == "no [DONE]"
    assert cut_reason(finished("a", tokens=1), MAX_TOKENS) == "1 of 3 tokens"


def test_a_scale_down_counts_only_from_two_running_to_one_without_a_replacement():
    assert scale_down("Ingress", 0).counted
    assert not scale_down("Ingress", 0, before={"RUNNING": 1}).counted
    assert not scale_down("Ingress", 0, before={"RUNNING": 2, "STARTING": 1}).counted
    assert not scale_down("Ingress", 0, stopping_seen=False).counted
    assert not scale_down("Ingress", 0, starting_seen=True).counted
    assert not scale_down("Ingress", 0, drain_s=None).counted


def test_rows_count_streams_under_the_deployment_that_drained_while_they_were_live():
    downs = [scale_down("Ingress", 10, drain_s=30), scale_down("Detokenizer", 50, drain_s=2), scale_down("Ingress", 60, drain_s=None)]
    records = [
        StreamRecord(0, 0, 5, finished("abc")),  # before any drain: only in "all"
        StreamRecord(1, 8, 12, finished("xyz")),  # live during the first ingress drain
        StreamRecord(0, 20, 41, StreamResult(text="ab", tokens=2, failed=True, error="RemoteProtocolError")),
        StreamRecord(1, 49, 51, finished("xya")),  # wrong, during the pool's drain
        StreamRecord(0, 52.5, 55, finished("abc")),  # after the pool's drain ended at 52
    ]
    rows = drain_rows(downs, records, REFERENCES, MAX_TOKENS)
    assert [row["deployment"] for row in rows] == ["Ingress", "Detokenizer", "all"]
    ingress, detok, everything = rows
    assert ingress == {"deployment": "Ingress", "scale_downs": 1, "streams_completed": 1, "streams_cut": 1, "streams_wrong": 0, "max_drain_s": 30}
    assert detok == {"deployment": "Detokenizer", "scale_downs": 1, "streams_completed": 0, "streams_cut": 0, "streams_wrong": 1, "max_drain_s": 2}
    assert everything == {"deployment": "all", "scale_downs": 2, "streams_completed": 3, "streams_cut": 1, "streams_wrong": 1, "max_drain_s": 30}


def test_failed_streams_keep_the_evidence():
    records = [StreamRecord(0, 1, 2, finished("abc")), StreamRecord(1, 3, 4.04, StreamResult(text="x", tokens=1, done=True))]
    assert failed_streams(records, REFERENCES, MAX_TOKENS) == [
        {"verdict": "cut", "reason": "1 of 3 tokens", "prompt": 1, "tokens": 1, "started_s": 3, "ended_s": 4.0}
    ]
