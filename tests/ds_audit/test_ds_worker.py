"""The multi-rank driver's bookkeeping: a case is ok only when every rank finished it; an error on any rank wins."""

from gradfidelity.studies.ds_audit.worker import case_state


def testcase_state_merges_ranks():
    done = {"event": "done", "result": {"contributions": [1.0]}, "seconds": 0.1}
    r0 = [{"i": 0, "event": "start"}, {"i": 0, **done}, {"i": 1, "event": "start"}, {"i": 1, **done},
          {"i": 2, "event": "start"}]
    r1 = [{"i": 0, "event": "start"}, {"i": 0, **done}, {"i": 1, "event": "start"},
          {"i": 1, "event": "error", "error": "RuntimeError: x"}, {"i": 2, "event": "start"}]
    assert case_state([r0, r1], 0)["status"] == "ok"
    assert case_state([r0, r1], 1) == {"status": "error", "error": "RuntimeError: x"}
    assert case_state([r0, r1], 2) == {}  # started, never finished: the driver records why (hang / crash)
    assert case_state([r0, r1[:1]], 0) == {}  # rank 1 never finished case 0


def test_a_half_written_event_line_is_left_for_the_next_poll(tmp_path):
    """A rank writing a long result in several chunks must not crash the driver's poll (seen at the cpu scale)."""
    import json

    from gradfidelity.studies.ds_audit.worker import read_events

    prefix = tmp_path / "events"
    done = json.dumps({"i": 0, "event": "done", "result": {"c": list(range(3000))}})
    (tmp_path / "events.rank0.jsonl").write_text(json.dumps({"i": 0, "event": "start"}) + "\n" + done[:700])
    assert read_events(prefix, 1) == [[{"i": 0, "event": "start"}]]
    (tmp_path / "events.rank0.jsonl").write_text(json.dumps({"i": 0, "event": "start"}) + "\n" + done + "\n")
    assert [e["event"] for e in read_events(prefix, 1)[0]] == ["start", "done"]
