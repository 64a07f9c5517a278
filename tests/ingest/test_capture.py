"""The prompt sample's file: Algorithm R's uniformity, the count across reopenings, retention, purge, the commands."""

from __future__ import annotations

import json
import math
import random
import stat
import time
from pathlib import Path

import pytest

from decoder.evaluation import SAMPLING_RANGES, SampleRow, read_sample
from monitor.commands.main import main
from monitor.ingest.capture.sample import DAY_S, PromptSample, sample_line

CAP = 5
STREAM = 20  # requests considered per trial
TRIALS = 4000
# Bonferroni over the STREAM items: each two-sided at 1e-3 / 20, so a correct reservoir fails for a
# given seed with probability at most 0.1 %. An off-by-one (replacing with probability cap / (n + 1))
# moves the first items' inclusion from 0.25 to 0.286, 5.2 standard deviations at 4000 trials.
Z_LIMIT = 4.06


def line(workload: str, text: str) -> str:
    written = sample_line(SampleRow(workload, text))
    assert written is not None
    return written


def inclusion_counts(sample: PromptSample, rng: random.Random) -> list[int]:
    """How often each of the STREAM items was kept, over TRIALS reservoirs (a workload each), fed in two halves.

    The halves go through two openings of the file, so the count of seen requests must survive the reopening.
    """
    now = time.time()

    def items(numbers: range) -> list[tuple[str, str, float]]:
        return [(f"t{t}", line(f"t{t}", f"item {i}"), now) for t in range(TRIALS) for i in numbers]

    sample.keep(items(range(STREAM // 2)), CAP, rng)
    reopened = PromptSample.open(sample.path)
    reopened.keep(items(range(STREAM // 2, STREAM)), CAP, rng)
    counts = [0] * STREAM
    for kept in reopened.lines():
        counts[int(json.loads(kept)["prompt"].removeprefix("item "))] += 1
    reopened.close()
    return counts


def deviations(counts: list[int]) -> list[float]:
    p = CAP / STREAM
    return [(c - TRIALS * p) / math.sqrt(TRIALS * p * (1 - p)) for c in counts]


def test_the_reservoir_keeps_every_request_with_the_same_probability(tmp_path: Path) -> None:
    sample = PromptSample.open(tmp_path / "sample.db")
    counts = inclusion_counts(sample, random.Random(20240611))
    sample.close()
    assert sum(counts) == TRIALS * CAP  # every reservoir is full, with CAP distinct items
    assert max(abs(z) for z in deviations(counts)) < Z_LIMIT, counts


def test_the_uniformity_check_catches_an_off_by_one(tmp_path: Path) -> None:
    class OffByOne(random.Random):
        def randrange(self, stop: int) -> int:  # type: ignore[override]
            return super().randrange(stop + 1)

    sample = PromptSample.open(tmp_path / "sample.db")
    counts = inclusion_counts(sample, OffByOne(20240611))
    sample.close()
    assert max(abs(z) for z in deviations(counts)) >= Z_LIMIT, counts


def test_retention_deletes_old_prompts_and_purge_restarts_a_workload(tmp_path: Path) -> None:
    sample = PromptSample.open(tmp_path / "sample.db")
    now = time.time()
    rng = random.Random(1)
    sample.keep([("code", line("code", "old"), now - 8 * DAY_S), ("code", line("code", "new"), now)], 10, rng)
    sample.keep([("chat", line("chat", "hello"), now)], 10, rng)
    assert sample.prune(7, now) == 1
    assert [json.loads(x)["prompt"] for x in sample.lines("code")] == ["new"]
    status = {w.workload: (w.kept, w.seen) for w in sample.status()}
    assert status == {"chat": (1, 1), "code": (1, 2)}  # the count remembers the pruned request
    assert sample.purge("code") == 1
    assert {w.workload for w in sample.status()} == {"chat"}
    assert sample.purge() == 1 and sample.status() == [] and sample.lines() == []
    sample.close()
    assert stat.S_IMODE((tmp_path / "sample.db").stat().st_mode) == 0o600


def test_a_lowered_cap_keeps_a_random_part_of_each_reservoir(tmp_path: Path) -> None:
    sample = PromptSample.open(tmp_path / "sample.db")
    rng = random.Random(3)
    sample.keep([("code", line("code", f"p{i}"), time.time()) for i in range(6)], 6, rng)
    sample.fit(2, rng)
    kept = [json.loads(x)["prompt"] for x in sample.lines()]
    assert len(kept) == 2 and set(kept) <= {f"p{i}" for i in range(6)}
    sample.keep([("code", line("code", "p6"), time.time())], 2, rng)  # Algorithm R goes on at n = 7
    assert len(sample.lines()) == 2 and sample.status()[0].seen == 7
    sample.close()


def test_rows_out_of_read_samples_ranges_are_not_captured(tmp_path: Path) -> None:
    rows = [SampleRow("code", "a", temperature=10.0), SampleRow("code", "b", top_p=0.5, max_new_tokens=1 << 20),
            SampleRow("code", [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]),
            SampleRow("code", "raw", chat=False)]  # fmt: skip
    path = tmp_path / "ok.jsonl"
    path.write_text("".join(f"{sample_line(r)}\n" for r in rows))
    assert read_sample(path) == rows
    for key, (_, low, high) in SAMPLING_RANGES.items():
        for bad in (low - 1 if key != "top_p" else 0.0, high * 2):
            assert sample_line(SampleRow("code", "x", **{key: bad})) is None, (key, bad)
            path.write_text(json.dumps({"workload": "code", "prompt": "x", key: bad}) + "\n")
            with pytest.raises(ValueError, match=key):
                read_sample(path)  # what the sample leaves out, evaluate refuses


def test_the_commands_export_status_and_purge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "data" / "prompt-sample.db"
    monkeypatch.setenv("DRAFTWATCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DRAFTWATCH_CAPTURE_SHARE", "0.5")
    monkeypatch.delenv("DRAFTWATCH_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["capture", "export"]) == 1 and "nothing captured yet" in capsys.readouterr().err
    assert main(["capture", "purge"]) == 0 and "removed 0 prompts" in capsys.readouterr().out
    assert not path.exists()  # reading or purging an absent sample makes no file
    sample = PromptSample.open(path)
    now = time.time()
    sample.keep([("code", line("code", "p1"), now - 8 * DAY_S), ("code", line("code", "p2"), now - 60),
                 ("chat", line("chat", "p3"), now)], 10, random.Random(0))  # fmt: skip
    sample.close()
    assert main(["capture", "status", "--json"]) == 0
    status = {w["workload"]: (w["kept"], w["seen"]) for w in json.loads(capsys.readouterr().out)}
    assert status == {"chat": (1, 1), "code": (1, 2)}  # p1 is past the 7 days: pruned before reading
    out = tmp_path / "sample.jsonl"
    out.write_text("an older export, readable by all")
    out.chmod(0o644)
    assert main(["capture", "export", "--workload", "code", "--out", str(out)]) == 0
    assert "wrote 1 prompts of 1 workloads" in capsys.readouterr().err
    assert read_sample(out) == [SampleRow("code", "p2")] and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert main(["capture", "export", "--out", str(tmp_path / "no" / "such" / "dir.jsonl")]) == 1
    assert "No such file or directory" in capsys.readouterr().err  # a message, not a traceback
    assert main(["capture", "export"]) == 0
    assert [json.loads(x)["prompt"] for x in capsys.readouterr().out.splitlines()] == ["p3", "p2"]
    assert main(["capture", "purge"]) == 0 and "removed 2 prompts" in capsys.readouterr().out
    assert main(["capture", "status"]) == 0 and "no prompts kept" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["capture", "export", "--workload", "not a workload!"])


def test_a_sidecar_that_keeps_nothing_new_still_prunes_what_an_earlier_one_left(tmp_path: Path) -> None:
    from monitor.ingest.capture.sidecar import PromptCapture
    from monitor.ingest.settings import CaptureSettings

    path = tmp_path / "sample.db"
    sample = PromptSample.open(path)
    now = time.time()
    sample.keep([("code", line("code", "old"), now - 8 * DAY_S), ("code", line("code", "new"), now)], 10,
                random.Random(0))  # fmt: skip
    sample.close()
    capture = PromptCapture(CaptureSettings(share=0.5, max_per_workload=10, retention_days=7, path=path)).start()
    capture.close()  # it kept no prompt of its own, but its writer ran
    reopened = PromptSample.open(path)
    assert [json.loads(x)["prompt"] for x in reopened.lines()] == ["new"]
    reopened.close()
    empty = tmp_path / "never-made.db"
    PromptCapture(CaptureSettings(share=0.5, max_per_workload=10, retention_days=7, path=empty)).start().close()
    assert not empty.exists()  # pruning never makes a file


def test_a_prompt_no_file_can_hold_is_left_out_not_its_batch() -> None:
    assert sample_line(SampleRow("code", "half a surrogate pair: \ud800")) is None
    assert sample_line(SampleRow("code", "a whole one: \U0001f642")) is not None
