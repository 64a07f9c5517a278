"""`draftwatch evaluate --store`: the verdict lands where the dashboard's Pairs page reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.commands.main import main
from monitor.store.engine import create_engine
from monitor.store.evaluations import latest_evaluations

pytestmark = pytest.mark.models


def test_evaluate_stores_the_report_it_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = tmp_path / "sample.jsonl"
    prompts = ["Repeat: alpha beta gamma delta alpha beta gamma delta", "List the numbers 1 to 12, comma separated."]
    sample.write_text("".join(json.dumps({"workload": "copy", "prompt": p}) + "\n" for p in prompts * 2))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    argv = ["evaluate", "--target", "smollm2-135m", "--drafter", "ngram", "--prompts", str(sample),
            "--max-new-tokens", "8", "--json", "--store", "--database-url", url]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    (printed,) = json.loads(out)
    assert "stored evaluation" in err and "store.db" in err
    engine = create_engine(url)
    try:
        (stored,) = latest_evaluations(engine)
    finally:
        engine.dispose()
    assert (stored.workload, stored.target_model, stored.sample) == ("copy", "smollm2-135m", str(sample))
    assert stored.target_version is not None and stored.target_version.startswith("smollm2-135m@")
    assert stored.recommendation == printed["recommendation"]
    assert stored.candidates == printed["candidates"]  # the whole report, as printed
    assert "alpha beta" not in json.dumps(stored.report)  # prompts are never stored


def test_a_store_that_cannot_be_opened_is_reported_after_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps({"workload": "copy", "prompt": f"Say {n}"}) + "\n" for n in range(2)))
    (tmp_path / "a-file").write_text("not a directory")
    url = f"sqlite:///{tmp_path / 'a-file' / 'store.db'}"
    argv = ["evaluate", "--target", "smollm2-135m", "--drafter", "ngram", "--prompts", str(sample),
            "--max-new-tokens", "4", "--store", "--database-url", url]  # fmt: skip
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "recommend" in out  # the evaluation's own result is not lost
    assert err.strip().splitlines()[-1].startswith("draftwatch evaluate: ")


def test_evaluate_reads_the_sidecars_prompt_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import random
    import time

    from decoder.evaluation import SampleRow
    from monitor.ingest.capture.sample import PromptSample, sample_line

    monkeypatch.setenv("DRAFTWATCH_DATA_DIR", str(tmp_path / "data"))
    argv = ["evaluate", "--target", "smollm2-135m", "--drafter", "ngram", "--captured", "--max-new-tokens", "4",
            "--json"]  # fmt: skip
    assert main(argv) == 1  # nothing captured yet: said, with what to do
    assert "no prompt sample at" in capsys.readouterr().err
    sample = PromptSample.open(tmp_path / "data" / "prompt-sample.db")
    rows = [SampleRow("copy", f"Count from {n} to {n + 5}.") for n in range(4)] + [SampleRow("rare", "Hello")]
    kept = sample.keep([(r.workload, str(sample_line(r)), time.time()) for r in rows], 10, random.Random(0))
    sample.close()
    assert kept == 5
    assert main(argv) == 0
    out, err = capsys.readouterr()
    (report,) = json.loads(out)  # a workload seen once is left out, not the whole run
    assert (report["workload"], report["learn_prompts"], report["held_out_prompts"]) == ("copy", 2, 2)
    assert "left out (fewer than 2 captured prompts): rare" in err


def test_a_server_only_run_cannot_be_stored(capsys: pytest.CaptureFixture[str]) -> None:
    # Its verdict would be filed under --target's default and replace that target's embedded verdict.
    assert main(["evaluate", "--server", "http://127.0.0.1:9", "--builtin", "--store"]) == 2
    assert "add --draft or --drafter" in capsys.readouterr().err
