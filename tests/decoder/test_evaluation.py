"""draftwatch evaluate: learn on half a workload's prompts, predict, measure on the other half, recommend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoder import LoadedModel, ModelDrafter, NgramDrafter
from decoder.drafters import drafter_label
from decoder.evaluation import (
    CandidateResult,
    SampleError,
    SampleRow,
    WorkloadReport,
    _report,
    combined,
    evaluate,
    format_table,
    progress_steps,
    read_sample,
)

REPEATING = "a b c d a b c d a b c d a b"


def write(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "sample.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_a_sample_is_read_with_each_rows_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"workload": "code", "prompt": "def f(x):"},
        "",
        {"workload": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "top_p": 0.9},
        {"workload": "code", "prompt": "x", "chat": False, "max_new_tokens": 16},
    )
    rows = read_sample(path)
    assert rows[0] == SampleRow("code", "def f(x):")
    assert rows[1].prompt == [{"role": "user", "content": "hi"}] and rows[1].temperature == 0.7
    assert rows[2].chat is False and rows[2].max_new_tokens == 16


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: expected a JSON object, got list"),
        (json.dumps({"workload": "no spaces", "prompt": "x"}), "line 2: workload: 'no spaces' is not a valid tag"),
        (json.dumps({"workload": "code"}), 'line 2: needs a non-empty "prompt"'),
        (json.dumps({"workload": "code", "prompt": "x", "temperature": -1}), "line 2: temperature must be"),
        (json.dumps({"workload": "code", "prompt": "x", "max_new_tokens": True}), "line 2: max_new_tokens must be"),
    ],
)
def test_a_bad_row_is_refused_naming_its_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, {"workload": "code", "prompt": "ok"}, line)
    with pytest.raises(SampleError, match=message.replace("(", r"\(").replace("[", r"\[")):
        read_sample(path)


def test_an_empty_or_missing_sample_says_what_to_write(tmp_path: Path) -> None:
    with pytest.raises(SampleError, match="holds no prompts: write one JSON object per line"):
        read_sample(write(tmp_path, ""))
    with pytest.raises(SampleError, match="cannot read the prompt sample"):
        read_sample(tmp_path / "missing.jsonl")


def test_the_recommendation_follows_the_prediction_and_is_checked_against_the_measurement() -> None:
    good = CandidateResult("ngram", predicted_speedup=1.4, gamma=3, measured_speedup=1.3)
    poor = CandidateResult("model:d", predicted_speedup=1.1, gamma=2, measured_speedup=1.5)
    report = _report("code", 3, 2, 20.0, [good, poor])
    assert (report.recommendation, report.recommended_gamma, report.measured_best) == ("ngram", 3, "model:d")
    assert not report.recommendation_matches
    losing = _report("prose", 3, 2, 20.0, [CandidateResult("ngram", 0.9, 1, measured_speedup=0.95)])
    assert losing.recommendation == losing.measured_best == "plain" and losing.recommendation_matches
    assert "recommendation = measured best on 1 of 2 workloads" in format_table([report, losing])


def test_a_server_candidate_joins_its_workload_and_leaves_the_recommendation_alone() -> None:
    local = _report("code", 3, 2, 20.0, [CandidateResult("ngram", 1.4, 3, measured_speedup=1.3, ms_per_token=15.0)])

    def remote(workload: str, plain_ms: float | None) -> WorkloadReport:
        server = CandidateResult("server:http://h:1", None, None, measured_speedup=2.0, ms_per_token=10.0,
                                 server="http://h:1")  # fmt: skip
        report = WorkloadReport(workload, 0, 4, None, [server], recommendation=None, measured_best=None)
        report.plain_server_ms_per_token = plain_ms
        return report

    code, prose = combined([local], [remote("code", 20.0), remote("prose", None)])
    assert [c.drafter for c in code.candidates] == ["ngram", "server:http://h:1"]
    # The server measured faster, but the check is of the embedded controller's predictions among its own candidates.
    assert (code.recommendation, code.measured_best, code.held_out_prompts) == ("ngram", "ngram", 2)
    assert code.plain_server_ms_per_token == 20.0 and code.recommendation_matches
    assert prose.recommendation is None and not prose.recommendation_matches
    table = format_table([code, prose]).splitlines()
    (server_row,) = [line for line in table if line.startswith("code") and "server:" in line]
    assert server_row.split()[2:5] == ["-", "2.00x", "-"] and "100.0" in server_row  # 10 ms a token
    assert [line.split()[-2] for line in table if "plain server" in line] == ["50.0"]
    assert "prose        no recommendation: no embedded candidate" in "\n".join(table)
    assert table[-1] == "recommendation = measured best on 1 of 1 workloads"


def test_a_workload_with_one_prompt_is_refused(tiny_target: LoadedModel) -> None:
    with pytest.raises(SampleError, match="workloads solo have fewer than 2 prompts"):
        evaluate(tiny_target, [NgramDrafter()], [SampleRow("solo", REPEATING, chat=False)])


def test_candidates_are_measured_on_the_held_out_half(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> None:
    rows = [SampleRow("copy", f"{REPEATING} {i}", chat=False) for i in range(4)]
    same = ModelDrafter(tiny_target, tiny_target.vocab_size)  # the target drafting for itself: every draft accepted
    candidates = [same, NgramDrafter(), ModelDrafter(tiny_draft, tiny_target.vocab_size)]
    said: list[str] = []
    (report,) = evaluate(tiny_target, candidates, rows, max_new_tokens=12, progress=said.append)
    assert len(said) == progress_steps(rows, len(candidates)) == 2 * 3 + 2
    assert (report.learn_prompts, report.held_out_prompts) == (2, 2)
    by_label = {result.drafter: result for result in report.candidates}
    perfect = by_label[drafter_label(same)]
    assert perfect.acceptance == 1.0 and perfect.drafted > 0
    assert perfect.acceptance_interval is not None and 0.5 < perfect.acceptance_interval[0] < 1.0
    assert perfect.mean_acceptance_length is not None and perfect.mean_acceptance_length > 1.5
    assert perfect.by_output_position == [1.0, None, None]  # 12 tokens: every step starts in the first 32
    for result in report.candidates:
        assert result.measured_speedup is not None and result.measured_speedup > 0
        assert 1 <= result.gamma <= 8
    assert report.plain_ms_per_token is not None and report.plain_ms_per_token > 0
    assert report.to_dict()["recommendation"] in {"plain", *by_label}
